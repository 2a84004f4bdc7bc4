"""``verify X OUT`` for a decomposition OUT wrote by ``pca`` or ``svd``, on the cluster by
blocks: nothing read whole.

- The components are orthonormal: |V Vᵀ − I| <= 10 u + 1e-12 (u: their dtype's unit roundoff).
- The scores are orthogonal with norms the singular values (U is orthonormal): |scoresᵀ scores
  − S²| <= (10 u + 1e-10) S_k S_j, element by element.
- On sampled observations i, the scores are X's standardized row projected on the components:
  ‖(x_i − μ) F Vᵀ − scores_i‖ summed over the sample and scaled to all n rows is at most
  3 √K · h · S_B[K] + 10 u √K ‖M_s‖_F, where S_B[K] is the sketch's (K+1)-th singular value
  (≈ σ_(K+1)) and h Halko et al.'s bound on how far past it the sketch's error goes
  (pipeline.plan.decomposition.missed_factor). A wrong score, component, mean or X shows here.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client
from numpy.typing import NDArray

from pipeline.errors import UnfinishedOutputError, UsageError
from pipeline.plan.decomposition import missed_factor
from pipeline.store import inputs
from pipeline.store.decomposition import RECORD_KEY, Decomposition, open_array

SAMPLED_ROWS = 1024
BLOCK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class DecompositionCheck:
    kind: str
    passed: bool
    orthonormality: float
    """max |V Vᵀ − I|."""
    orthonormality_tolerance: float
    norms: float
    """max |scoresᵀ scores / (S_k S_j) − I| over its tolerance (10 u + 1e-10)."""
    residual: float
    """The sampled rows' residual, scaled to all rows."""
    residual_tolerance: float
    sampled: int
    nonfinite: int
    """NaN or infinite elements in components and scores."""


def is_decomposition(url: str, storage_options: dict[str, Any]) -> bool:
    """Whether ``url`` is a group this tool wrote with ``pca`` or ``svd``."""
    import zarr

    from pipeline.store.fs import fsspec_options

    try:
        opts = fsspec_options(url, storage_options) if "://" in url else None
        group = zarr.open_group(url, mode="r", storage_options=opts)
    except Exception:  # noqa: BLE001 - not a group: not a decomposition
        return False
    return isinstance(group.attrs.get(RECORD_KEY), dict)


def verify_decomposition(
    client: Client,
    x_url: str,
    out_url: str,
    storage_options: dict[str, Any],
    seed: int = 0,
    sampled: int = SAMPLED_ROWS,
) -> DecompositionCheck:
    out = Decomposition(out_url, storage_options)
    record = out.state()
    if record is None or not record.get("complete"):
        raise UnfinishedOutputError(
            f"OUT ({out_url}) is not a complete decomposition; finish it first (rerun it with "
            "--resume)"
        )
    x = inputs.open_input(x_url, storage_options, "X")
    rows = bool(record["rows"])
    n, p = (x.shape[1], x.shape[0]) if rows else tuple(x.shape)
    if [n, p] != list(record["shape"]):
        raise UsageError(
            f"X ({x_url}) is {n} x {p} as decomposed, but OUT holds a decomposition of a "
            f"{record['shape'][0]} x {record['shape'][1]} matrix ({record.get('x')}); pass that X"
        )
    names = set(record.get("arrays", []))
    comp_url, scores_url = out.at("components"), out.at("scores")
    k = int(record["components"])
    dtype = np.dtype(open_array(comp_url, storage_options).dtype)
    unit = float(np.finfo(dtype).eps) / 2
    run = uuid.uuid4().hex[:8]
    comp_cols = _blocks(p, open_array(comp_url, storage_options).chunks[1], k)
    grams = client.gather([
        client.submit(_gram_task, comp_url, storage_options, c, key=f"verify-orth-{run}-{i}")
        for i, c in enumerate(comp_cols)
    ])  # fmt: skip
    gram = sum(g for g, _ in grams)
    nonfinite = sum(bad for _, bad in grams)
    orth = float(np.abs(gram - np.eye(k)).max()) if k else 0.0
    orth_tol = 10 * unit + 1e-12
    score_rows = _blocks(n, open_array(scores_url, storage_options).chunks[0], k)
    squares = client.gather([
        client.submit(_squares_task, scores_url, storage_options, r, key=f"verify-norm-{run}-{i}")
        for i, r in enumerate(score_rows)
    ])  # fmt: skip
    nonfinite += sum(bad for _, bad in squares)
    singular = np.asarray(open_array(out.at("singular_values"), storage_options)[:])
    scaled = sum(g for g, _ in squares) / np.outer(singular, singular) if k else np.zeros((0, 0))
    norm_worst = float(np.abs(scaled - np.eye(k)).max() / (10 * unit + 1e-10)) if k else 0.0
    # sampled observations, projected by blocks of variables
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(n, size=min(sampled, n), replace=False))
    x_chunks = (x.chunks[1], x.chunks[0]) if rows else tuple(x.chunks)
    var_blocks = _blocks(p, x_chunks[1], max(x_chunks[0], 1))
    mean_url = out.at("mean") if "mean" in names else None
    scale_url = out.at("scale") if "scale" in names else None
    parts = [
        client.submit(
            _projection_task,
            x_url,
            storage_options,
            rows,
            chosen,
            cols,
            mean_url,
            scale_url,
            comp_url,
            key=f"verify-proj-{run}-{i}",
        )  # fmt: skip
        for i, cols in enumerate(var_blocks)
    ]
    projected = sum(client.gather(parts))
    stored = np.asarray(open_array(scores_url, storage_options).oindex[chosen, :], dtype=np.float64)
    residual = float(np.sqrt(np.sum((projected - stored) ** 2) * n / max(len(chosen), 1)))
    finish = record["done"]["finish"]
    sketch = np.asarray(finish["sketch_singular_values"])
    width = int(record["width"])
    past = sketch[k] if len(sketch) > k else 0.0
    if width >= min(n, p):
        past = 0.0  # the sketch spans M: nothing was missed but rounding
    h = missed_factor(width, k, int(record["power_iterations"]), min(n, p))
    total = math.sqrt(max(record["done"]["moments"]["total_ss"], 0.0))
    res_tol = 3 * math.sqrt(k) * h * past + 10 * unit * math.sqrt(k) * total + 1e-12
    passed = nonfinite == 0 and orth <= orth_tol and norm_worst <= 1 and residual <= res_tol
    return DecompositionCheck(
        record["kind"], passed, orth, orth_tol, norm_worst, residual, res_tol, len(chosen),
        nonfinite,
    )  # fmt: skip


def _blocks(length: int, chunk: int, width: int) -> list[tuple[int, int]]:
    """Whole chunks of ``length``, about BLOCK_BYTES of float64 at ``width`` each."""
    step = max(chunk, 1) * max(1, BLOCK_BYTES // max(chunk * max(width, 1) * 8, 1))
    return [(a, min(a + step, length)) for a in range(0, length, step)]


def _gram_task(url: str, options: dict[str, Any], cols: tuple[int, int]) -> tuple[Any, int]:
    v = np.asarray(open_array(url, options)[:, cols[0] : cols[1]], dtype=np.float64)
    bad = int((~np.isfinite(v)).sum())
    v = np.nan_to_num(v)
    return v @ v.T, bad


def _squares_task(url: str, options: dict[str, Any], rows: tuple[int, int]) -> tuple[Any, int]:
    s = np.asarray(open_array(url, options)[rows[0] : rows[1]], dtype=np.float64)
    bad = int((~np.isfinite(s)).sum())
    s = np.nan_to_num(s)
    return s.T @ s, bad


def _projection_task(
    x_url: str,
    options: dict[str, Any],
    rows: bool,
    chosen: NDArray[np.int64],
    cols: tuple[int, int],
    mean_url: str | None,
    scale_url: str | None,
    comp_url: str,
) -> NDArray[np.float64]:
    """(x_i − μ) F Vᵀ over one block of variables, for the chosen observations."""
    x = inputs.open_on_worker(x_url, options, "X")
    span = slice(cols[0], cols[1])
    block = x.oindex[span, chosen].T if rows else x.oindex[chosen, span]
    block = np.asarray(block, dtype=np.float64)
    if mean_url is not None:
        block -= np.asarray(open_array(mean_url, options)[span], dtype=np.float64)[None, :]
    if scale_url is not None:
        block /= np.asarray(open_array(scale_url, options)[span], dtype=np.float64)[None, :]
    v = np.asarray(open_array(comp_url, options)[:, span], dtype=np.float64)
    out: NDArray[np.float64] = block @ v.T
    return out

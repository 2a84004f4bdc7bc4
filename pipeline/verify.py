"""Freivalds' check of C == A @ B: compare C·r with A·(B·r) for random ±1 vectors r.

Runs on the cluster in bounded memory: every task streams one row block over column chunks.
Everything is computed in float64. Row i passes when

    |C·r - A·(B·r)|_i <= TAU · (u_compute · √k · ‖A_i‖₂ · ‖B‖_F + u_out · ‖C_i‖₂)

with u the unit roundoff of the accumulator and of C's dtype. Each element's rounding error
is about √k·u·(|A||B|)_ij (Higham's probabilistic bound); with random signs r the errors of
a row add in quadrature, and sqrt(Σ_j (|A_i|·|B_j|)²) <= ‖A_i‖₂·‖B‖_F (Cauchy-Schwarz), which
is within ~1.6x of it for typical data. The second term is C's own rounding when stored.
A wrong element is caught when its error exceeds its row's tolerance (see the README).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client, wait
from numpy.typing import NDArray

from pipeline import io
from pipeline.errors import InputError, JobError
from pipeline.plan import result_dtype
from pipeline.spec import ArraySpec

TAU = 4.0
"""Safety factor on the probabilistic rounding bound."""


@dataclass(frozen=True)
class VerifyResult:
    passed: bool
    rounds: int
    worst_ratio: float
    """Largest residual / tolerance over all rows and rounds (passes when <= 1)."""
    worst_row: int
    failing_row_blocks: tuple[tuple[int, int], ...]
    """[r0, r1) row ranges that hold at least one failing row."""


def verify_product(
    client: Client,
    a_url: str,
    b_url: str,
    c_url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    rounds: int = 2,
    seed: int = 0,
    progress: bool = False,
) -> VerifyResult:
    options = dict(storage_options or {})
    a, b, c = check_shapes(a_url, b_url, c_url, options)
    (m, k), n = a.shape, b.shape[1]
    _, compute = result_dtype(a.dtype, b.dtype)
    r = _signs(n, rounds, seed)
    br_parts = [
        client.submit(
            _b_times_r,
            b_url,
            options,
            (k0, min(k0 + b.chunks[0], k)),
            r,
            b.chunks[1],
            key=f"verify-b-{seed}-{k0}-{_tag(c_url)}",
        )
        for k0 in range(0, k, b.chunks[0])
    ]
    br = client.submit(_stack, br_parts, k, rounds, key=f"verify-stack-{_tag(c_url)}-{seed}")
    rows = [(r0, min(r0 + a.chunks[0], m)) for r0 in range(0, m, a.chunks[0])]
    checks = [
        client.submit(
            _check_rows,
            (a_url, c_url),
            options,
            rr,
            br,
            r,
            (a.chunks[1], c.chunks[1]),
            (compute, c.dtype),
            k,
            key=f"verify-rows-{_tag(c_url)}-{seed}-{rr[0]}",
        )
        for rr in rows
    ]
    if progress and checks:
        from distributed import progress as progress_bar

        progress_bar(checks)
    wait(checks)
    failed = [f for f in checks if f.status == "error"]
    if failed:
        raise JobError(f"verification task failed: {failed[0].exception()}")
    ratios: list[NDArray[np.float64]] = client.gather(checks)
    return _summarize(ratios, rows, rounds)


def check_shapes(
    a_url: str, b_url: str, c_url: str, options: dict[str, Any] | None
) -> tuple[ArraySpec, ArraySpec, ArraySpec]:
    """Open A, B and C read-only and refuse shapes that can't be A, B and A @ B."""
    a = io.array_spec(io.open_input(a_url, options, "A"), "A")
    b = io.array_spec(io.open_input(b_url, options, "B"), "B")
    c = io.array_spec(io.open_input(c_url, options, "C"), "C")
    (m, k), n = a.shape, b.shape[1]
    if k != b.shape[0] or c.shape != (m, n):
        raise InputError(
            f"shapes do not match: A {m}x{k}, B {b.shape[0]}x{n}, C {c.shape[0]}x{c.shape[1]}; "
            f"A's columns must equal B's rows and C must be {m}x{n}"
        )
    return a, b, c


def _summarize(
    ratios: list[NDArray[np.float64]], rows: list[tuple[int, int]], rounds: int
) -> VerifyResult:
    worst, worst_row, failing = 0.0, -1, []
    for (r0, r1), ratio in zip(rows, ratios, strict=True):
        if ratio.size == 0:
            continue
        i = int(np.argmax(ratio))
        if ratio[i] > worst or not np.isfinite(ratio[i]):
            worst, worst_row = float(ratio[i]), r0 + i
        if not np.all(ratio <= 1.0):  # NaN fails too
            failing.append((r0, r1))
    return VerifyResult(not failing, rounds, worst, worst_row, tuple(failing))


def _signs(n: int, rounds: int, seed: int) -> NDArray[np.float64]:
    rng = np.random.default_rng(seed)
    return rng.choice(np.array([-1.0, 1.0]), size=(n, rounds))


def _tag(url: str) -> str:
    from dask.base import tokenize

    return str(tokenize(url))[:12]


def _b_times_r(
    b_url: str,
    options: dict[str, Any],
    ks: tuple[int, int],
    r: NDArray[np.float64],
    col_chunk: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(B·r, squared row norms of B) for rows ks of B, streaming over B's column chunks."""
    b = io.open_input(b_url, options, "B")
    return _stream(b, ks, col_chunk, r, _wide(b.dtype))


def _stack(parts: list[Any], k: int, rounds: int) -> tuple[Any, float]:
    """(B·r, ‖B‖_F)."""
    if not parts:
        return np.zeros((0, rounds)), 0.0
    return np.concatenate([p[0] for p in parts]), float(np.sqrt(sum(p[1].sum() for p in parts)))


def _check_rows(
    urls: tuple[str, str],
    options: dict[str, Any],
    rows: tuple[int, int],
    br: tuple[Any, float],
    r: NDArray[np.float64],
    col_chunks: tuple[int, int],
    dtypes: tuple[str, str],
    k: int,
) -> NDArray[np.float64]:
    """Per row of the block: max over rounds of residual / tolerance."""
    a = io.open_input(urls[0], options, "A")
    c = io.open_input(urls[1], options, "C")
    abr, a_sq = _stream(a, rows, col_chunks[0], br[0], _wide(a.dtype))
    cr, c_sq = _stream(c, rows, col_chunks[1], r, _wide(c.dtype))
    tol = TAU * (
        _unit(dtypes[0]) * np.sqrt(max(k, 1)) * np.sqrt(a_sq) * br[1]
        + _unit(dtypes[1]) * np.sqrt(c_sq)
    )
    tol += np.finfo(np.float64).tiny
    residual = np.abs(cr - abr)
    return np.asarray((residual / tol[:, None]).max(axis=1, initial=0.0), dtype=np.float64)


def _stream(
    array: Any, rows: tuple[int, int], col_chunk: int, right: Any, wide: str
) -> tuple[Any, NDArray[np.float64]]:
    """(X·right, squared row norms of X) for X = array[rows, :], one column chunk at a time."""
    cols = array.shape[1]
    product = np.zeros((rows[1] - rows[0], right.shape[1]), dtype=wide)
    squares = np.zeros(rows[1] - rows[0])
    for c0 in range(0, cols, col_chunk):
        block = io.read_block(array, rows, (c0, min(c0 + col_chunk, cols)), wide)
        product += block @ right[c0 : c0 + block.shape[1]]
        squares += (np.abs(block) ** 2).sum(axis=1)
    return product, squares


def _wide(dtype: Any) -> str:
    return "complex128" if np.dtype(dtype).kind == "c" else "float64"


def _unit(dtype: str) -> float:
    """Unit roundoff; integers are exact (float64 sums of them are checked at float64's)."""
    dt = np.dtype(dtype)
    if dt.kind in "fc":
        return float(np.finfo(dt).eps) / 2
    return float(np.finfo(np.float64).eps) / 2

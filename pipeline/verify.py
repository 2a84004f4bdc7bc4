"""Freivalds' check of C == A @ B: compare C·r with A·(B·r) for random ±1 vectors r.

Runs on the cluster in bounded memory: every task streams one block over column chunks, in
float64. With random signs the rounding errors e_ij of a correct row add in quadrature, so
row i's residual has standard deviation sqrt(Σ_j e_ij²). Row i passes when

    |C·r − A·(B·r)|_i <= TAU · (min(bound_i, noise_i) + verifier_i)

- bound_i = u·√k·‖A_i‖₂·‖B‖_F + u_C·‖C_i‖₂: Higham's probabilistic rounding bound (√k·u·|A||B|
  per element) summed in quadrature (Cauchy-Schwarz); tight for same-sign data.
- noise_i = ρ·‖A_i‖₂·‖B‖_F + u_C·‖C_i‖₂: the rounding actually measured on a few rows of C
  recomputed in float64 (4 rows from each of 4 row blocks): ρ = SAFETY x the largest over
  them of the robust rms of |error_sj| / (‖A_s‖₂·‖B_j‖₂), from the median, so one wrong element
  in a sampled row does not inflate it, and normalized per column, so columns of different
  scales don't fool the median. Tight for zero-mean data, where the bound is ~√k too loose.
- verifier_i = u64·(√k·‖A_i‖₂·‖B‖_F + √n·‖C_i‖₂): this check's own float64 rounding.

u is the unit roundoff of the accumulator dtype and u_C of C's. A correct product passes with a
wide margin (measured in tests/pipeline/test_verify.py); a wrong element is caught when its error
exceeds about TAU·SAFETY times its row's rounding noise.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client, Future, wait
from numpy.typing import NDArray

from pipeline.errors import InputError, JobError
from pipeline.plan import result_dtype
from pipeline.plan.spec import ArraySpec
from pipeline.store import inputs as io

TAU = 6.0
"""Tail factor: a Gaussian residual exceeds 6 standard deviations about once in 10⁹ rows."""
SAFETY = 4.0
"""Margin on the sampled noise level for rows rounding more than the sampled ones."""
GAUSSIAN_MAD = 0.6745
"""median |x| / GAUSSIAN_MAD estimates a zero-mean Gaussian's standard deviation."""
SAMPLE_BLOCKS, SAMPLE_ROWS = 4, 4
"""Row blocks of A sampled, and rows of C recomputed exactly in each, to measure its noise."""
U64 = float(np.finfo(np.float64).eps) / 2


@dataclass(frozen=True)
class VerifyResult:
    passed: bool
    rounds: int
    worst_ratio: float
    """Largest residual / tolerance over all rows and rounds (passes when <= 1)."""
    worst_row: int
    failing_row_blocks: tuple[tuple[int, int], ...]
    """[r0, r1) row ranges that hold at least one failing row."""
    noise: float = 0.0
    """Measured rounding noise ρ (rms error of c_ij per unit ‖A_i‖₂·‖B_j‖₂), before SAFETY."""


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
    rng = np.random.default_rng(seed)
    r = rng.choice(np.array([-1.0, 1.0]), size=(n, rounds))
    sample = _sample_rows(rng, m, a.chunks[0])
    run = uuid.uuid4().hex[:12]  # fresh keys: data may have changed since an earlier check
    parts = [
        client.submit(
            _b_pass,
            (a_url, b_url),
            options,
            (k0, min(k0 + b.chunks[0], k)),
            r,
            sample,
            b.chunks[1],
            key=f"verify-b-{run}-{k0}",
        )
        for k0 in range(0, k, b.chunks[0])
    ]
    ref = client.submit(_reference, parts, sample, n, rounds, key=f"verify-ref-{run}")
    noise = client.submit(
        _noise, c_url, options, sample, ref, c.chunks[1], key=f"verify-noise-{run}"
    )
    rows = [(r0, min(r0 + a.chunks[0], m)) for r0 in range(0, m, a.chunks[0])]
    checks = [
        client.submit(
            _check_rows,
            (a_url, c_url),
            options,
            rr,
            ref,
            noise,
            r,
            (a.chunks[1], c.chunks[1]),
            (compute, c.dtype),
            (k, n),
            key=f"verify-rows-{run}-{rr[0]}",
        )
        for rr in rows
    ]
    if progress and checks:
        from distributed import progress as progress_bar

        progress_bar(checks)
    every: list[Future[Any]] = [*checks, noise]
    wait(every)
    failed = [f for f in every if f.status == "error"]
    if failed:
        raise JobError(f"verification task failed: {failed[0].exception()}")
    ratios: list[NDArray[np.float64]] = client.gather(checks)
    return _summarize(ratios, rows, rounds, float(noise.result()) / SAFETY)


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
    ratios: list[NDArray[np.float64]], rows: list[tuple[int, int]], rounds: int, noise: float
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
    return VerifyResult(not failing, rounds, worst, worst_row, tuple(failing), noise)


def _sample_rows(rng: np.random.Generator, m: int, row_chunk: int) -> list[tuple[int, int]]:
    """A few consecutive rows from each of a few row chunks of A (one chunk row read each)."""
    blocks = list(range(0, m, row_chunk))
    chosen = sorted(rng.choice(len(blocks), size=min(SAMPLE_BLOCKS, len(blocks)), replace=False))
    ranges = []
    for index in chosen:
        start, stop = blocks[index], min(blocks[index] + row_chunk, m)
        first = int(rng.integers(start, max(stop - SAMPLE_ROWS, start) + 1))
        ranges.append((first, min(first + SAMPLE_ROWS, stop)))
    return ranges


def _b_pass(
    urls: tuple[str, str],
    options: dict[str, Any],
    ks: tuple[int, int],
    r: NDArray[np.float64],
    sample: list[tuple[int, int]],
    col_chunk: int,
) -> tuple[Any, Any, Any, Any]:
    """For rows ks of B: (B·r, ‖B_j‖² per column, A[sample, ks]·B[ks, :], ‖A[sample, ks]‖²
    per row)."""
    a, b = io.open_input(urls[0], options, "A"), io.open_input(urls[1], options, "B")
    wide = _wide(np.result_type(a.dtype, b.dtype))
    a_sample = np.concatenate(
        [io.read_block(a, rows, ks, wide) for rows in sample]
        or [np.zeros((0, ks[1] - ks[0]), dtype=wide)]
    )
    n = b.shape[1]
    br = np.zeros((ks[1] - ks[0], r.shape[1]), dtype=wide)
    exact = np.zeros((a_sample.shape[0], n), dtype=wide)
    squares = np.zeros(n)
    for c0 in range(0, n, col_chunk):
        block = io.read_block(b, ks, (c0, min(c0 + col_chunk, n)), wide)
        br += block @ r[c0 : c0 + block.shape[1]]
        exact[:, c0 : c0 + block.shape[1]] = a_sample @ block
        squares[c0 : c0 + block.shape[1]] = (np.abs(block) ** 2).sum(axis=0)
    return br, squares, exact, (np.abs(a_sample) ** 2).sum(axis=1)


def _reference(
    parts: list[Any], sample: list[tuple[int, int]], n: int, rounds: int
) -> tuple[Any, Any, Any, Any]:
    """(B·r, ‖B_j‖₂ per column, exact C[sample, :], ‖A[sample, :]‖₂)."""
    rows = sum(r1 - r0 for r0, r1 in sample)
    if not parts:
        return np.zeros((0, rounds)), np.zeros(n), np.zeros((rows, n)), np.zeros(rows)
    exact = sum(p[2] for p in parts)
    a_norms = np.sqrt(sum(p[3] for p in parts))
    br = np.concatenate([p[0] for p in parts])
    return br, np.sqrt(sum(p[1] for p in parts)), exact, a_norms


def _noise(
    c_url: str, options: dict[str, Any], sample: list[tuple[int, int]], ref: Any, col_chunk: int
) -> float:
    """SAFETY x max over sampled rows of the robust rms of |C - exact|_sj / (‖A_s‖·‖B_j‖)."""
    c = io.open_input(c_url, options, "C")
    _, b_norms, exact, a_norms = ref
    n = c.shape[1]
    if exact.size == 0:
        return 0.0
    got = np.concatenate(
        [
            np.concatenate(
                [
                    io.read_block(c, rows, (c0, min(c0 + col_chunk, n)), _wide(c.dtype))
                    for c0 in range(0, n, col_chunk)
                ],
                axis=1,
            )
            for rows in sample
        ]
    )
    scale = a_norms[:, None] * b_norms[None, :]
    usable = scale > 0
    if not usable.any():
        return 0.0
    relative = np.where(usable, np.abs(got - exact) / np.where(usable, scale, 1.0), np.nan)
    rms = np.nanmedian(relative[usable.any(axis=1)], axis=1) / GAUSSIAN_MAD
    return SAFETY * float(np.max(rms))


def _check_rows(
    urls: tuple[str, str],
    options: dict[str, Any],
    rows: tuple[int, int],
    ref: Any,
    noise: float,
    r: NDArray[np.float64],
    col_chunks: tuple[int, int],
    dtypes: tuple[str, str],
    kn: tuple[int, int],
) -> NDArray[np.float64]:
    """Per row of the block: max over rounds of residual / tolerance."""
    a = io.open_input(urls[0], options, "A")
    c = io.open_input(urls[1], options, "C")
    br, b_norm = ref[0], float(np.sqrt((ref[1] ** 2).sum()))
    abr, a_sq = _stream(a, rows, col_chunks[0], br, _wide(a.dtype))
    cr, c_sq = _stream(c, rows, col_chunks[1], r, _wide(c.dtype))
    (k, n), a_norm, c_norm = kn, np.sqrt(a_sq), np.sqrt(c_sq)
    stored = _unit(dtypes[1]) * c_norm
    bound = _unit(dtypes[0]) * np.sqrt(max(k, 1)) * a_norm * b_norm + stored
    measured = noise * a_norm * b_norm + stored
    verifier = U64 * (np.sqrt(max(k, 1)) * a_norm * b_norm + np.sqrt(n) * c_norm)
    tol = TAU * (np.minimum(bound, measured) + verifier) + np.finfo(np.float64).tiny
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
    return U64

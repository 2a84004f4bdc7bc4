"""The verifier's tasks, run on the workers (pipeline/verify/check.py submits them and explains the
method): one pass over B, the reference, the measured noise, and the check of a row block. Every
task streams one block over column chunks, in float64 (complex128 for complex data)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.backends import PRECISION_UNIT
from pipeline.plan.dtypes import accumulator_dtype, result_dtype
from pipeline.plan.spec import ArraySpec
from pipeline.plan.standardize import Standardize
from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr
from pipeline.store import inputs as io
from pipeline.verify.accumulated import checked_c
from pipeline.verify.nonfinite import (
    NonfinitePattern,
    any_per_row,
    read_finite,
    stream_rows,
    wide_dtype,
)
from pipeline.verify.transposed import open_operand

AGAIN = ", then verify again"
"""The end of a bad chunk's fix when verify read it."""
TAU = 6.0
"""Tail factor: a Gaussian residual exceeds 6 standard deviations about once in 10⁹ rows."""
SAFETY = 4.0
"""Margin on the sampled noise level for rows rounding more than the sampled ones."""
GAUSSIAN_MAD = 0.6745
"""median |x| / GAUSSIAN_MAD estimates a zero-mean Gaussian's standard deviation."""
U64 = float(np.finfo(np.float64).eps) / 2


@dataclass(frozen=True)
class _BPart:
    """What one K block of B (rows ks) contributes; non-finite values read as 0."""

    br: NDArray[Any]
    """B[ks, :]·r."""
    squares: NDArray[np.float64]
    """‖B[ks, j]‖² per column."""
    exact: NDArray[Any]
    """A[sample, ks]·B[ks, :]."""
    a_squares: NDArray[np.float64]
    """‖A[s, ks]‖² per sampled row."""
    sample_bad: NDArray[np.bool_]
    """Sampled rows with a non-finite value in A[s, ks]."""
    b_counts: NDArray[np.int64]
    """Non-finite values per column of B[ks, :]."""


@dataclass(frozen=True)
class _Reference:
    br: NDArray[Any]
    """B·r over B's finite columns (k x rounds); before the masked pass, over all columns."""
    b_norms: NDArray[np.float64]
    """‖B_j‖₂ per column; 0 for a column holding a non-finite value."""
    exact: NDArray[Any]
    """The sampled rows of C recomputed in float64 (right on finite rows and columns)."""
    a_norms: NDArray[np.float64]
    """‖A_s‖₂ per sampled row."""
    sample_bad: NDArray[np.bool_]
    """Sampled rows of A holding a non-finite value."""
    b_counts: NDArray[np.int64]
    """Non-finite values per column of B."""


@dataclass(frozen=True)
class RowCheck:
    """One row block's outcome."""

    ratios: NDArray[np.float64]
    """Per row: max over rounds of residual / tolerance; 0 where not checked (a row of A that
    is not finite, or a row of C whose pattern differs)."""
    mismatched: NDArray[np.bool_]
    """Per row: C's non-finite elements differ from the implied ones."""
    a_counts: NDArray[np.int64]
    """Non-finite values per row of A."""
    unexpected: int
    overflow: int
    missing: int
    first_mismatch: tuple[int, int] | None


@dataclass(frozen=True)
class CheckSpec:
    """What every task of one check needs."""

    urls: tuple[str, str, str]
    """A, B and C."""
    options: dict[str, Any] = dataclasses.field(metadata=SENSITIVE_FIELD)
    """fsspec options; repr hides secrets (a failed task's log shows its arguments)."""
    specs: tuple[ArraySpec, ArraySpec, ArraySpec]
    r: NDArray[np.float64]
    """The random ±1 vectors, n x rounds."""
    sample: list[tuple[int, int]]
    """Row ranges of C recomputed exactly to measure its rounding noise."""
    transposed: tuple[bool, bool] = (False, False)
    """C = op(A)·op(B): A and B are read transposed where set (C's attributes record it)."""
    scaled: tuple[str | None, float, float] | None = None
    """(C_old's URL or None, α, β): C = α·op(A)·op(B) + β·C_old, and (C − β·C_old)/α is
    checked (pipeline/verify/accumulated.py)."""
    precision: str = "fp32"
    """What C was computed at (kernels.backends.PRECISIONS): tensor precisions round every
    factor, which the tolerance adds (pipeline/verify/check.py)."""
    standardize: Standardize | None = None
    """A covariance, correlation or kinship: C is the Gram product of X standardized with
    these shifts and scales, which the operands apply as they are read."""
    splits: tuple[int | None, int | None] = (None, None)
    """N-D fields read as matrices: A's and B's leading dimensions stacked as rows."""

    __repr__ = redacted_repr


def b_pass(job: CheckSpec, ks: tuple[int, int]) -> _BPart:
    a, b = _operand(job, 0), _operand(job, 1)
    wide = wide_dtype(np.result_type(a.dtype, b.dtype))
    pieces = [read_finite(a, rows, ks, wide) for rows in job.sample]
    a_sample = np.concatenate([p[0] for p in pieces] or [np.zeros((0, ks[1] - ks[0]), wide)])
    sample_bad = np.concatenate([any_per_row(*p) for p in pieces] or [np.zeros(0, bool)])
    n, col_chunk = b.shape[1], job.specs[1].chunks[1]
    br = np.zeros((ks[1] - ks[0], job.r.shape[1]), dtype=wide)
    exact = np.zeros((a_sample.shape[0], n), dtype=wide)
    squares, counts = np.zeros(n), np.zeros(n, dtype=np.int64)
    for c0 in range(0, n, col_chunk):
        block, nonfinite = read_finite(b, ks, (c0, min(c0 + col_chunk, n)), wide)
        cols = slice(c0, c0 + block.shape[1])
        br += block @ job.r[cols]
        exact[:, cols] = a_sample @ block
        squares[cols] = (np.abs(block) ** 2).sum(axis=0)
        if nonfinite is not None:
            counts[cols] = nonfinite.sum(axis=0)
    a_squares = (np.abs(a_sample) ** 2).sum(axis=1)
    return _BPart(br, squares, exact, a_squares, sample_bad, counts)


def reference(job: CheckSpec, parts: list[_BPart]) -> _Reference:
    rows, n = sum(r1 - r0 for r0, r1 in job.sample), job.specs[1].shape[1]
    if not parts:  # k == 0
        return _Reference(
            np.zeros((0, job.r.shape[1])), np.zeros(n), np.zeros((rows, n)), np.zeros(rows),
            np.zeros(rows, dtype=bool), np.zeros(n, dtype=np.int64),
        )  # fmt: skip
    counts = np.sum([p.b_counts for p in parts], axis=0)
    b_norms = np.where(counts > 0, 0.0, np.sqrt(np.sum([p.squares for p in parts], axis=0)))
    return _Reference(
        br=np.concatenate([p.br for p in parts]),
        b_norms=b_norms,
        exact=np.sum([p.exact for p in parts], axis=0),
        a_norms=np.sqrt(np.sum([p.a_squares for p in parts], axis=0)),
        sample_bad=np.logical_or.reduce([p.sample_bad for p in parts]),
        b_counts=counts,
    )


def count_b(ref: _Reference) -> tuple[int, int]:
    """(non-finite values, columns holding one) of B."""
    return int(ref.b_counts.sum()), int((ref.b_counts > 0).sum())


def nonfinite_columns(ref: _Reference) -> NDArray[np.bool_]:
    return np.asarray(ref.b_counts > 0)


def b_masked_pass(job: CheckSpec, ks: tuple[int, int], bad_columns: NDArray[np.bool_]) -> Any:
    """B[ks, :]·r with r set to 0 on B's non-finite columns."""
    b = _operand(job, 1)
    wide = wide_dtype(np.result_type(job.specs[0].dtype, b.dtype))
    kept = np.where(bad_columns[:, None], 0.0, job.r)
    n, col_chunk = b.shape[1], job.specs[1].chunks[1]
    br = np.zeros((ks[1] - ks[0], job.r.shape[1]), dtype=wide)
    for c0 in range(0, n, col_chunk):
        block, _ = read_finite(b, ks, (c0, min(c0 + col_chunk, n)), wide)
        br += block @ kept[c0 : c0 + block.shape[1]]
    return br


def with_br(ref: _Reference, parts: list[NDArray[Any]]) -> _Reference:
    return dataclasses.replace(ref, br=np.concatenate(parts)) if parts else ref


def measure_noise(job: CheckSpec, ref: _Reference) -> float:
    """SAFETY x max over sampled rows of the robust rms of |C - exact|_sj / (‖A_s‖·‖B_j‖),
    on the finite rows and columns."""
    c = checked_c(job)
    n, col_chunk = c.shape[1], job.specs[2].chunks[1]
    if ref.exact.size == 0:
        return 0.0
    got = np.concatenate(
        [
            np.concatenate(
                [
                    io.read_block(
                        c,
                        rows,
                        (c0, min(c0 + col_chunk, n)),
                        wide_dtype(c.dtype),
                        "C",
                        job.urls[2],
                        retry=AGAIN,
                    )  # fmt: skip
                    for c0 in range(0, n, col_chunk)
                ],
                axis=1,
            )
            for rows in job.sample
        ]
    )
    finite = np.isfinite(got)
    got = np.where(finite, got, 0)
    scale = ref.a_norms[:, None] * ref.b_norms[None, :]  # 0 on B's non-finite columns
    usable = (scale > 0) & finite & ~ref.sample_bad[:, None]
    if not usable.any():
        return 0.0
    relative = np.where(usable, np.abs(got - ref.exact) / np.where(usable, scale, 1.0), np.nan)
    rms = np.nanmedian(relative[usable.any(axis=1)], axis=1) / GAUSSIAN_MAD
    return SAFETY * float(np.max(rms))


def check_rows(job: CheckSpec, rows: tuple[int, int], ref: _Reference, noise: float) -> RowCheck:
    """Per row of the block: C's non-finite pattern, and max over rounds of residual /
    tolerance on the finite part."""
    a_spec, b_spec, c_spec = job.specs
    k, n = b_spec.shape
    a = _operand(job, 0)
    c = checked_c(job)
    bad_columns = ref.b_counts > 0
    b_norm = float(np.sqrt((ref.b_norms**2).sum()))
    # A·(B·r) is complex when B is, whatever A's dtype
    wide = wide_dtype(np.result_type(a.dtype, b_spec.dtype))
    abr, a_sq, a_counts = stream_rows(a, rows, a_spec.chunks[1], ref.br, wide)
    bad_rows, a_norm = a_counts > 0, np.sqrt(a_sq)
    # The product accumulates in C's dtype (--dtype) or A and B's: allow the coarser of them.
    defaults = (result_dtype(a_spec.dtype, b_spec.dtype)[1], accumulator_dtype(c_spec.dtype))
    compute = max(defaults, key=_unit)
    largest = _largest((compute, c_spec.dtype))
    pattern = NonfinitePattern(rows[0], bad_rows, bad_columns, a_norm, ref.b_norms, largest)
    # C's elements on B's non-finite columns are non-finite (read as 0) or the row fails.
    cr, c_sq, _ = stream_rows(c, rows, c_spec.chunks[1], job.r, wide_dtype(c.dtype), pattern)
    c_norm = np.sqrt(c_sq)
    # C's own rounding: of the stored values, not of (C - β·C_old)/α when accumulated.
    stored = _unit(c_spec.dtype) * (c_norm if job.scaled is None else c.stored_norms(rows))
    # Tensor cores round both factors of every term: at most 2·u_p·‖A_i‖·‖B_j‖ per element.
    factors = 2 * PRECISION_UNIT.get(job.precision, 0.0) * a_norm * b_norm
    bound = _unit(compute) * np.sqrt(max(k, 1)) * a_norm * b_norm + factors + stored
    measured = noise * a_norm * b_norm + stored
    verifier = U64 * (np.sqrt(max(k, 1)) * a_norm * b_norm + np.sqrt(n) * c_norm)
    expected = np.minimum(bound, measured)
    if job.standardize is not None:
        # Standardized panels repeat values (a binary variable has two), whose terms round the
        # same way: the worst case k·u, not √k·u, and the panels' own rounding to the dtype.
        expected = _unit(compute) * (max(k, 1) + 2) * a_norm * b_norm + factors + stored
    tol = TAU * (expected + verifier) + np.finfo(np.float64).tiny
    residual = np.abs(cr - abr)
    ratio = np.asarray((residual / tol[:, None]).max(axis=1, initial=0.0), dtype=np.float64)
    # Rows of A that are not finite (C's row must be non-finite) and rows whose C has non-finite
    # elements where none are implied (read as 0: the residual says nothing more) fail or pass
    # by the pattern alone.
    ratio[bad_rows | pattern.mismatched] = 0.0
    return RowCheck(
        ratio, pattern.mismatched, a_counts, pattern.unexpected, pattern.overflow,
        pattern.missing, pattern.first,
    )  # fmt: skip


def _operand(job: CheckSpec, index: int) -> Any:
    url, name = job.urls[index], "AB"[index]
    transposed, split = job.transposed[index], job.splits[index]
    return open_operand(url, job.options, name, transposed, job.standardize, split)


def asymmetric(job: CheckSpec, rows: tuple[int, int]) -> int:
    """Elements of C's row block ``rows`` (right of its diagonal) that are not bitwise equal
    to their mirror, C's column block below it: over every row block, C is read once."""
    c = io.open_on_worker(job.urls[2], job.options, "C")
    n, step = c.shape[1], job.specs[2].chunks[1]
    found = 0
    for c0 in range(rows[0], n, step):
        cols = (c0, min(c0 + step, n))
        block = io.read_block(c, rows, cols, str(c.dtype), "C", job.urls[2], retry=AGAIN)
        mirror = io.read_block(c, cols, rows, str(c.dtype), "C", job.urls[2], retry=AGAIN).T
        found += int((_bits(block) != _bits(mirror)).sum())
    return found


def _bits(x: NDArray[Any]) -> NDArray[Any]:
    """Elements as unsigned integers of their size (complex: two per element)."""
    x = np.ascontiguousarray(x)
    size = x.dtype.itemsize // (2 if x.dtype.kind == "c" else 1)
    return x.view(f"u{size}") if x.dtype.kind != "b" else x


def _unit(dtype: str) -> float:
    """Unit roundoff; integers are exact (float64 sums of them are checked at float64's)."""
    dt = np.dtype(dtype)
    if dt.kind in "fc":
        return float(np.finfo(dt).eps) / 2
    return U64


def _largest(dtypes: tuple[str, str]) -> float:
    """The largest finite value both the accumulator and C hold (inf for integers)."""
    limits = [float(np.finfo(d).max) for d in map(np.dtype, dtypes) if d.kind in "fc"]
    return min(limits, default=float("inf"))

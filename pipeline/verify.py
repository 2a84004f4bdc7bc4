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

Non-finite inputs (NaN, ±inf). C_ij = Σ_k A_ik·B_kj is non-finite exactly when a term is (or
the sum overflows), and a term with a non-finite factor is non-finite (inf·0 = NaN). So a row of
A holding a non-finite value implies a whole non-finite row of C, and a column of B holding one
a whole non-finite column. C must be non-finite exactly there; elsewhere a non-finite element is
an overflow or a wrong element. The check above then runs on the finite part: the other rows
of A and columns of B, with r set to 0 on the non-finite columns and every non-finite value
read as 0 once flagged, so no NaN·0 enters a sum. B·r is recomputed with the masked r only
when B has non-finite columns: all-finite inputs cost no extra pass.
"""

from __future__ import annotations

import dataclasses
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
OVERFLOW_MARGIN = 2.0
"""|C_ij| <= ‖A_i‖₂·‖B_j‖₂; a bound above 1/OVERFLOW_MARGIN of C's largest value may overflow."""


@dataclass(frozen=True)
class VerifyResult:
    passed: bool
    rounds: int
    worst_ratio: float
    """Largest residual / tolerance over the checked rows and all rounds (passes when <= 1):
    rows of A that are finite and whose row of C holds no unexpected (non-)finite element."""
    worst_row: int
    """Row of worst_ratio; -1 when no row was checked."""
    failing_row_blocks: tuple[tuple[int, int], ...]
    """[r0, r1) row ranges that hold at least one failing row."""
    noise: float = 0.0
    """Measured rounding noise ρ (rms error of c_ij per unit ‖A_i‖₂·‖B_j‖₂), before SAFETY."""
    a_nonfinite: int = 0
    """Non-finite values (NaN, ±inf) in A."""
    a_nonfinite_rows: int = 0
    """Rows of A holding one: each implies a whole non-finite row of C."""
    b_nonfinite: int = 0
    """Non-finite values in B."""
    b_nonfinite_columns: int = 0
    """Columns of B holding one: each implies a whole non-finite column of C."""
    c_unexpected: int = 0
    """Non-finite elements of C where A and B imply a finite one: overflows or wrong elements."""
    c_overflow: int = 0
    """Of c_unexpected, those whose bound ‖A_i‖₂·‖B_j‖₂ reaches C's range: maybe an overflow."""
    c_missing: int = 0
    """Finite elements of C where a non-finite row of A or column of B implies non-finite."""
    first_mismatch: tuple[int, int] | None = None
    """(row, column) of the first element of C whose finiteness differs from the implied one."""

    @property
    def pattern_matches(self) -> bool:
        """C is non-finite exactly on the rows and columns the inputs imply."""
        return self.c_unexpected == 0 and self.c_missing == 0

    @property
    def finite_inputs(self) -> bool:
        return self.a_nonfinite == 0 and self.b_nonfinite == 0


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
class _RowCheck:
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
class _Job:
    """What every task of one check needs."""

    urls: tuple[str, str, str]
    """A, B and C."""
    options: dict[str, Any]
    specs: tuple[ArraySpec, ArraySpec, ArraySpec]
    r: NDArray[np.float64]
    """The random ±1 vectors, n x rounds."""
    sample: list[tuple[int, int]]
    """Row ranges of C recomputed exactly to measure its rounding noise."""


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
    rng = np.random.default_rng(seed)
    r = rng.choice(np.array([-1.0, 1.0]), size=(b.shape[1], rounds))
    job = _Job(
        (a_url, b_url, c_url), options, (a, b, c), r, _sample_rows(rng, a.shape[0], a.chunks[0])
    )
    run = uuid.uuid4().hex[:12]  # fresh keys: data may have changed since an earlier check
    ref, b_counts = _submit_reference(client, job, run)
    noise = client.submit(_noise, job, ref, key=f"verify-noise-{run}")
    m = a.shape[0]
    rows = [(r0, min(r0 + a.chunks[0], m)) for r0 in range(0, m, a.chunks[0])]
    checks = [
        client.submit(_check_rows, job, rr, ref, noise, key=f"verify-rows-{run}-{rr[0]}")
        for rr in rows
    ]
    if progress and checks:
        from distributed import progress as progress_bar

        progress_bar(checks)
    _wait_for([*checks, noise])
    outcomes: list[_RowCheck] = client.gather(checks)
    return _summarize(outcomes, rows, rounds, float(noise.result()) / SAFETY, b_counts)


def _submit_reference(client: Client, job: _Job, run: str) -> tuple[Future[Any], tuple[int, int]]:
    """(future of the _Reference, (non-finite values, columns holding one) of B): one pass over
    B, and a second with r masked only when B has non-finite columns."""
    (k, _), (kc, _) = job.specs[1].shape, job.specs[1].chunks
    blocks = [(k0, min(k0 + kc, k)) for k0 in range(0, k, kc)]
    parts = [client.submit(_b_pass, job, ks, key=f"verify-b-{run}-{ks[0]}") for ks in blocks]
    ref = client.submit(_reference, job, parts, key=f"verify-ref-{run}")
    counted = client.submit(_count_b, ref, key=f"verify-b-count-{run}")
    _wait_for([counted])
    b_counts: tuple[int, int] = counted.result()
    if b_counts[1]:
        bad = client.submit(_bad_columns, ref, key=f"verify-b-bad-{run}")
        masked = [
            client.submit(_b_masked_pass, job, ks, bad, key=f"verify-b-masked-{run}-{ks[0]}")
            for ks in blocks
        ]
        ref = client.submit(_with_br, ref, masked, key=f"verify-ref-masked-{run}")
    return ref, b_counts


def _wait_for(futures: list[Future[Any]]) -> None:
    wait(futures)
    failed = [f for f in futures if f.status == "error"]
    if failed:
        raise JobError(f"verification task failed: {failed[0].exception()}")


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
    outcomes: list[_RowCheck],
    rows: list[tuple[int, int]],
    rounds: int,
    noise: float,
    b_counts: tuple[int, int],
) -> VerifyResult:
    worst, worst_row, failing = -1.0, -1, []
    firsts = [o.first_mismatch for o in outcomes if o.first_mismatch is not None]
    for (r0, r1), outcome in zip(rows, outcomes, strict=True):
        ratio = outcome.ratios
        checked = (outcome.a_counts == 0) & ~outcome.mismatched
        if checked.any():
            i = int(np.argmax(np.where(checked, ratio, -1.0)))
            if ratio[i] > worst or not np.isfinite(ratio[i]):
                worst, worst_row = float(ratio[i]), r0 + i
        if not np.all(ratio <= 1.0) or outcome.mismatched.any():  # NaN fails too
            failing.append((r0, r1))
    a_counts = [o.a_counts for o in outcomes]
    return VerifyResult(
        passed=not failing,
        rounds=rounds,
        worst_ratio=max(worst, 0.0),
        worst_row=worst_row,
        failing_row_blocks=tuple(failing),
        noise=noise,
        a_nonfinite=int(sum(int(c.sum()) for c in a_counts)),
        a_nonfinite_rows=int(sum(int((c > 0).sum()) for c in a_counts)),
        b_nonfinite=b_counts[0],
        b_nonfinite_columns=b_counts[1],
        c_unexpected=sum(o.unexpected for o in outcomes),
        c_overflow=sum(o.overflow for o in outcomes),
        c_missing=sum(o.missing for o in outcomes),
        first_mismatch=min(firsts) if firsts else None,
    )


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


def _read_finite(
    array: Any, rows: tuple[int, int], cols: tuple[int, int], wide: str
) -> tuple[NDArray[Any], NDArray[np.bool_] | None]:
    """A block in ``wide`` with its non-finite values set to 0, and where they were (None when
    it has none)."""
    block = io.read_block(array, rows, cols, wide)
    if np.dtype(array.dtype).kind not in "fc":
        return block, None
    nonfinite = ~np.isfinite(block)
    if not nonfinite.any():
        return block, None
    block[nonfinite] = 0
    return block, nonfinite


def _b_pass(job: _Job, ks: tuple[int, int]) -> _BPart:
    a = io.open_input(job.urls[0], job.options, "A")
    b = io.open_input(job.urls[1], job.options, "B")
    wide = _wide(np.result_type(a.dtype, b.dtype))
    pieces = [_read_finite(a, rows, ks, wide) for rows in job.sample]
    a_sample = np.concatenate([p[0] for p in pieces] or [np.zeros((0, ks[1] - ks[0]), wide)])
    sample_bad = np.concatenate([_any_per_row(*p) for p in pieces] or [np.zeros(0, bool)])
    n, col_chunk = b.shape[1], job.specs[1].chunks[1]
    br = np.zeros((ks[1] - ks[0], job.r.shape[1]), dtype=wide)
    exact = np.zeros((a_sample.shape[0], n), dtype=wide)
    squares, counts = np.zeros(n), np.zeros(n, dtype=np.int64)
    for c0 in range(0, n, col_chunk):
        block, nonfinite = _read_finite(b, ks, (c0, min(c0 + col_chunk, n)), wide)
        cols = slice(c0, c0 + block.shape[1])
        br += block @ job.r[cols]
        exact[:, cols] = a_sample @ block
        squares[cols] = (np.abs(block) ** 2).sum(axis=0)
        if nonfinite is not None:
            counts[cols] = nonfinite.sum(axis=0)
    a_squares = (np.abs(a_sample) ** 2).sum(axis=1)
    return _BPart(br, squares, exact, a_squares, sample_bad, counts)


def _any_per_row(block: NDArray[Any], nonfinite: NDArray[np.bool_] | None) -> NDArray[np.bool_]:
    if nonfinite is None:
        return np.zeros(block.shape[0], dtype=bool)
    return np.asarray(nonfinite.any(axis=1))


def _reference(job: _Job, parts: list[_BPart]) -> _Reference:
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


def _count_b(ref: _Reference) -> tuple[int, int]:
    """(non-finite values, columns holding one) of B."""
    return int(ref.b_counts.sum()), int((ref.b_counts > 0).sum())


def _bad_columns(ref: _Reference) -> NDArray[np.bool_]:
    return np.asarray(ref.b_counts > 0)


def _b_masked_pass(job: _Job, ks: tuple[int, int], bad_columns: NDArray[np.bool_]) -> Any:
    """B[ks, :]·r with r set to 0 on B's non-finite columns."""
    b = io.open_input(job.urls[1], job.options, "B")
    wide = _wide(np.result_type(job.specs[0].dtype, b.dtype))
    kept = np.where(bad_columns[:, None], 0.0, job.r)
    n, col_chunk = b.shape[1], job.specs[1].chunks[1]
    br = np.zeros((ks[1] - ks[0], job.r.shape[1]), dtype=wide)
    for c0 in range(0, n, col_chunk):
        block, _ = _read_finite(b, ks, (c0, min(c0 + col_chunk, n)), wide)
        br += block @ kept[c0 : c0 + block.shape[1]]
    return br


def _with_br(ref: _Reference, parts: list[NDArray[Any]]) -> _Reference:
    return dataclasses.replace(ref, br=np.concatenate(parts)) if parts else ref


def _noise(job: _Job, ref: _Reference) -> float:
    """SAFETY x max over sampled rows of the robust rms of |C - exact|_sj / (‖A_s‖·‖B_j‖),
    on the finite rows and columns."""
    c = io.open_input(job.urls[2], job.options, "C")
    n, col_chunk = c.shape[1], job.specs[2].chunks[1]
    if ref.exact.size == 0:
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


def _check_rows(job: _Job, rows: tuple[int, int], ref: _Reference, noise: float) -> _RowCheck:
    """Per row of the block: C's non-finite pattern, and max over rounds of residual /
    tolerance on the finite part."""
    a_spec, b_spec, c_spec = job.specs
    k, n = b_spec.shape
    a = io.open_input(job.urls[0], job.options, "A")
    c = io.open_input(job.urls[2], job.options, "C")
    bad_columns = ref.b_counts > 0
    b_norm = float(np.sqrt((ref.b_norms**2).sum()))
    abr, a_sq, a_counts = _stream(a, rows, a_spec.chunks[1], ref.br, _wide(a.dtype))
    bad_rows, a_norm = a_counts > 0, np.sqrt(a_sq)
    compute = result_dtype(a_spec.dtype, b_spec.dtype)[1]
    largest = _largest((compute, c_spec.dtype))
    pattern = _Pattern(rows[0], bad_rows, bad_columns, a_norm, ref.b_norms, largest)
    # C's elements on B's non-finite columns are non-finite (read as 0) or the row fails.
    cr, c_sq, _ = _stream(c, rows, c_spec.chunks[1], job.r, _wide(c.dtype), pattern)
    c_norm = np.sqrt(c_sq)
    stored = _unit(c_spec.dtype) * c_norm
    bound = _unit(compute) * np.sqrt(max(k, 1)) * a_norm * b_norm + stored
    measured = noise * a_norm * b_norm + stored
    verifier = U64 * (np.sqrt(max(k, 1)) * a_norm * b_norm + np.sqrt(n) * c_norm)
    tol = TAU * (np.minimum(bound, measured) + verifier) + np.finfo(np.float64).tiny
    residual = np.abs(cr - abr)
    ratio = np.asarray((residual / tol[:, None]).max(axis=1, initial=0.0), dtype=np.float64)
    # Rows of A that are not finite (C's row must be non-finite) and rows whose C has non-finite
    # elements where none are implied (read as 0: the residual says nothing more) fail or pass
    # by the pattern alone.
    ratio[bad_rows | pattern.mismatched] = 0.0
    return _RowCheck(
        ratio, pattern.mismatched, a_counts, pattern.unexpected, pattern.overflow,
        pattern.missing, pattern.first,
    )  # fmt: skip


class _Pattern:
    """Compares, block by block of a row block of C, its non-finite elements with the ones a
    non-finite row of A or column of B implies."""

    def __init__(
        self,
        row0: int,
        bad_rows: NDArray[np.bool_],
        bad_columns: NDArray[np.bool_],
        a_norms: NDArray[np.float64],
        b_norms: NDArray[np.float64],
        largest: float,
    ) -> None:
        self.row0, self.bad_rows, self.bad_columns = row0, bad_rows, bad_columns
        self.a_norms, self.b_norms, self.largest = a_norms, b_norms, largest
        self.mismatched = np.zeros(len(bad_rows), dtype=bool)
        self.unexpected = self.overflow = self.missing = 0
        self.first: tuple[int, int] | None = None

    def check(self, block: NDArray[Any], nonfinite: NDArray[np.bool_] | None, c0: int) -> None:
        cols = slice(c0, c0 + block.shape[1])
        if nonfinite is None and not (self.bad_rows.any() or self.bad_columns[cols].any()):
            return  # the common case: nothing non-finite, nothing implied
        implied = self.bad_rows[:, None] | self.bad_columns[None, cols]
        found = np.zeros(block.shape, dtype=bool) if nonfinite is None else nonfinite
        unexpected, missing = found & ~implied, implied & ~found
        wrong = unexpected | missing
        if not wrong.any():
            return
        self.mismatched |= wrong.any(axis=1)
        i, j = np.nonzero(unexpected)
        self.unexpected += len(i)
        bound = self.a_norms[i] * self.b_norms[c0 + j]  # >= |C_ij| (Cauchy-Schwarz)
        self.overflow += int((bound * OVERFLOW_MARGIN >= self.largest).sum())
        self.missing += int(missing.sum())
        first = np.argwhere(wrong)[0]
        here = (self.row0 + int(first[0]), c0 + int(first[1]))
        self.first = here if self.first is None else min(self.first, here)


def _stream(
    array: Any,
    rows: tuple[int, int],
    col_chunk: int,
    right: Any,
    wide: str,
    pattern: _Pattern | None = None,
) -> tuple[Any, NDArray[np.float64], NDArray[np.int64]]:
    """(X·right, squared row norms of X, non-finite values per row) for X = array[rows, :] with
    its non-finite values read as 0, one column chunk at a time."""
    cols = array.shape[1]
    product = np.zeros((rows[1] - rows[0], right.shape[1]), dtype=wide)
    squares = np.zeros(rows[1] - rows[0])
    counts = np.zeros(rows[1] - rows[0], dtype=np.int64)
    for c0 in range(0, cols, col_chunk):
        block, nonfinite = _read_finite(array, rows, (c0, min(c0 + col_chunk, cols)), wide)
        if pattern is not None:
            pattern.check(block, nonfinite, c0)
        product += block @ right[c0 : c0 + block.shape[1]]
        squares += (np.abs(block) ** 2).sum(axis=1)
        if nonfinite is not None:
            counts += nonfinite.sum(axis=1)
    return product, squares, counts


def _wide(dtype: Any) -> str:
    return "complex128" if np.dtype(dtype).kind == "c" else "float64"


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

"""Freivalds' check of C == A @ B: compare C·r with A·(B·r) for random ±1 vectors r.

Runs on the cluster in bounded memory: every task (pipeline/verify/tasks.py) streams one
block over column chunks, in float64. With random signs the rounding errors e_ij of a correct
row add in quadrature, so row i's residual has standard deviation sqrt(Σ_j e_ij²). Row i passes
when

    |C·r − A·(B·r)|_i <= TAU · (min(bound_i, noise_i) + verifier_i)

- bound_i = u·√k·‖A_i‖₂·‖B‖_F + u_C·‖C_i‖₂: Higham's probabilistic rounding bound (√k·u·|A||B|
  per element) summed in quadrature (Cauchy-Schwarz); tight for same-sign data.
- noise_i = ρ·‖A_i‖₂·‖B‖_F + u_C·‖C_i‖₂: the rounding actually measured on a few rows of C
  recomputed in float64 (4 rows from each of 4 row blocks): ρ = SAFETY x the largest over
  them of the robust rms of |error_sj| / (‖A_s‖₂·‖B_j‖₂), from the median, so one wrong element
  in a sampled row does not inflate it, and normalized per column, so columns of different
  scales don't fool the median. Tight for zero-mean data, where the bound is ~√k too loose.
- verifier_i = u64·(√k·‖A_i‖₂·‖B‖_F + √n·‖C_i‖₂): this check's own float64 rounding.

u is the unit roundoff of the accumulator dtype and u_C of C's. A product computed on tensor
cores (--precision tf32 or 3xtf32, recorded in C's attributes) also rounded every factor to
u_p = PRECISION_UNIT (2^-11 for TF32): each term a_ik·b_kj is off by at most 2·u_p·|a_ik·b_kj|,
so c_ij by 2·u_p·‖A_i‖₂·‖B_j‖₂ (Cauchy-Schwarz, whatever K), which bound_i adds as
2·u_p·‖A_i‖₂·‖B‖_F. A correct product passes with a
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
from distributed import Client, Future

from kernels.backends import PRECISIONS
from pipeline.accumulate.state import COMPLETE, ROLLING_BACK, read_state
from pipeline.errors import InputError, JobError, UnfinishedOutputError
from pipeline.plan.operands import operands
from pipeline.plan.spec import ArraySpec
from pipeline.plan.standardize import Standardize
from pipeline.plan.standardize import from_record as standardize_from_record
from pipeline.run import moments
from pipeline.run.client import input_error, wait_some
from pipeline.run.progress import CheckLine
from pipeline.store import inputs as io
from pipeline.store.fields import as_matrix
from pipeline.store.fs import absolute, check_credentials, local_path
from pipeline.store.output import Output
from pipeline.store.reach import check_readable
from pipeline.store.record import ATTRS_KEY, OutRecord, of_array
from pipeline.verify import symmetry, tasks
from pipeline.verify.nonfinite import OVERFLOW_MARGIN
from pipeline.verify.tasks import GAUSSIAN_MAD, SAFETY, TAU, U64, CheckSpec, RowCheck

SAMPLE_BLOCKS, SAMPLE_ROWS = 4, 4
"""Row blocks of A sampled, and rows of C recomputed exactly in each, to measure its noise."""

__all__ = [
    "GAUSSIAN_MAD",
    "OVERFLOW_MARGIN",
    "SAFETY",
    "SAMPLE_BLOCKS",
    "SAMPLE_ROWS",
    "TAU",
    "U64",
    "VerifyResult",
    "check_shapes",
    "verify_product",
]


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
    asymmetric: int | None = None
    """A Gram product's elements not bitwise equal to their mirror (None: not one)."""
    product: str = "A @ B"
    """What C was checked against, in words."""
    recompute: str = "python -m pipeline multiply A B C --overwrite"
    """The command that computes C again."""

    @property
    def pattern_matches(self) -> bool:
        """C is non-finite exactly on the rows and columns the inputs imply."""
        return self.c_unexpected == 0 and self.c_missing == 0

    @property
    def finite_inputs(self) -> bool:
        return self.a_nonfinite == 0 and self.b_nonfinite == 0

    def __repr__(self) -> str:
        """One line: the fields' own repr is kilobytes of row blocks in a notebook."""
        blocks = len(self.failing_row_blocks)
        status = "ok" if self.passed else f"FAILED in {blocks} row block(s)" if blocks else "FAILED"
        worst = (
            f"worst residual/tolerance {self.worst_ratio:.3g} at row {self.worst_row}"
            if self.worst_row >= 0
            else "no finite row checked"
        )
        more = ""
        if not (self.finite_inputs and self.pattern_matches):
            more += (
                f"; non-finite: A {self.a_nonfinite}, B {self.b_nonfinite}, C "
                f"{self.c_unexpected} unexpected, {self.c_missing} missing"
            )
        if self.asymmetric:
            more += f"; {self.asymmetric} element(s) differ from their mirror"
        return f"<VerifyResult {status}: {worst}, {self.rounds} round(s){more}>"


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
    transpose_a: bool | None = None,
    transpose_b: bool | None = None,
    alpha: float | None = None,
    c_old: tuple[str, float] | None = None,
    precision: str | None = None,
    standardize: Standardize | None = None,
    splits: tuple[int | None, int | None] = (None, None),
) -> VerifyResult:
    """Check C == α·op(A)·op(B) (+ β·C_old: ``c_old`` = (its URL, β), after --accumulate);
    the transposes, α and the precision (the tolerance's) default to those C's attributes
    record (fp32 for a C without ours), and a Gram product's C (recorded symmetric) must also
    equal its transpose bitwise. A covariance, correlation or kinship (recorded) is checked
    against X standardized: ``standardize`` (measured), else X's moments measured again, which
    must match the record's digest. ``splits``: N-D fields read as matrices (the job's own
    check; pipeline.store.fields)."""
    options = dict(storage_options or {})
    given = (transpose_a, transpose_b)
    a_url, b_url, c_url = (absolute(u) for u in (a_url, b_url, c_url))  # for any worker's cwd
    if c_old is None:  # the job's own check of an accumulation passes its originals
        _check_not_accumulating(a_url, b_url, c_url, options)
    found = _operation(a_url, b_url, c_url, options, given, splits)
    (a, b, c), transposed, symmetric, ours = found
    alpha = _recorded_alpha(ours) if alpha is None else alpha
    precision = precision or _recorded_precision(ours)
    scaled = None
    if c_old is not None or alpha != 1:
        old_url, beta = c_old if c_old is not None else (None, 0.0)
        scaled = (None if old_url is None else absolute(old_url), float(alpha), float(beta))
    if standardize is None and ours is not None and ours.standardize is not None:
        standardize = _measured_again(client, a_url, options, ours.standardize, c_url)
    rng = np.random.default_rng(seed)
    r = rng.choice(np.array([-1.0, 1.0]), size=(b.shape[1], rounds))
    sample = _sample_rows(rng, a.shape[0], a.chunks[0])
    job = CheckSpec(
        (a_url, b_url, c_url),
        options,
        (a, b, c),
        r,
        sample,
        transposed,
        scaled,
        precision,
        standardize,
        splits,
    )
    run = uuid.uuid4().hex[:12]  # fresh keys: data may have changed since an earlier check
    line = CheckLine(progress)
    try:
        mirrors = symmetry.submit(client, job, run) if symmetric else None
        result = _check(client, job, run, line)
        if symmetric:
            product, recompute = _gram_words(transposed[1], standardize)
            result = dataclasses.replace(result, product=product, recompute=recompute)
        return symmetry.add(result, mirrors) if mirrors else result
    finally:
        line.close()


def _check(client: Client, job: CheckSpec, run: str, line: CheckLine) -> VerifyResult:
    a, _, c = job.specs
    m = a.shape[0]
    rows = [(r0, min(r0 + a.chunks[0], m)) for r0 in range(0, m, a.chunks[0])]
    row_bytes = a.shape[1] * _itemsize(a) + c.shape[1] * _itemsize(c)
    line.expect(len(rows), m * row_bytes)
    ref, b_counts = _submit_reference(client, job, run, line)
    noise = client.submit(tasks.measure_noise, job, ref, key=f"verify-noise-{run}")
    checks = []
    for rr in rows:
        key = f"verify-rows-{run}-{rr[0]}"
        checks.append(client.submit(tasks.check_rows, job, rr, ref, noise, key=key))
        line.watch(checks[-1], (rr[1] - rr[0]) * row_bytes, expected=True)
    _wait_for([*checks, noise], line)
    outcomes: list[RowCheck] = client.gather(checks)
    rounds = job.r.shape[1]
    return _summarize(outcomes, rows, rounds, float(noise.result()) / SAFETY, b_counts)


def _itemsize(spec: ArraySpec) -> int:
    return np.dtype(spec.dtype).itemsize


def _submit_reference(
    client: Client, job: CheckSpec, run: str, line: CheckLine
) -> tuple[Future[Any], tuple[int, int]]:
    """(future of the reference, (non-finite values, columns holding one) of B): one pass over
    B, and a second with r masked only when B has non-finite columns."""
    (k, _), (kc, _) = job.specs[1].shape, job.specs[1].chunks
    blocks = [(k0, min(k0 + kc, k)) for k0 in range(0, k, kc)]
    parts = [client.submit(tasks.b_pass, job, ks, key=f"verify-b-{run}-{ks[0]}") for ks in blocks]
    row_bytes = job.specs[1].shape[1] * _itemsize(job.specs[1])
    for part, ks in zip(parts, blocks, strict=True):
        line.watch(part, (ks[1] - ks[0]) * row_bytes)
    ref = client.submit(tasks.reference, job, parts, key=f"verify-ref-{run}")
    counted = client.submit(tasks.count_b, ref, key=f"verify-b-count-{run}")
    _wait_for([counted], line)
    b_counts: tuple[int, int] = counted.result()
    if b_counts[1]:
        bad = client.submit(tasks.nonfinite_columns, ref, key=f"verify-b-bad-{run}")
        masked = [
            client.submit(tasks.b_masked_pass, job, ks, bad, key=f"verify-b-masked-{run}-{ks[0]}")
            for ks in blocks
        ]
        for part, ks in zip(masked, blocks, strict=True):
            line.watch(part, (ks[1] - ks[0]) * row_bytes)
        ref = client.submit(tasks.with_br, ref, masked, key=f"verify-ref-masked-{run}")
    return ref, b_counts


def _wait_for(futures: list[Future[Any]], line: CheckLine) -> None:
    """Wait for ``futures``, redrawing the line every half second and as they finish."""
    pending = set(futures)
    while pending:
        pending = wait_some(pending)[1]
        line.update()
    failed = [f for f in futures if f.status == "error"]
    for future in failed:  # an input a worker cannot read: bad input, not a failed check
        if (unreachable := input_error(future.exception())) is not None:
            raise unreachable
    if failed:
        raise JobError(f"verification task failed: {failed[0].exception()}")


def check_shapes(
    a_url: str,
    b_url: str,
    c_url: str,
    options: dict[str, Any] | None,
    transposed: tuple[bool | None, bool | None] = (None, None),
) -> tuple[ArraySpec, ArraySpec, ArraySpec]:
    """Open A, B and C read-only and refuse shapes that can't be op(A), op(B) and their
    product; the specs of op(A), op(B) and C."""
    return check_operation(a_url, b_url, c_url, options, transposed)[0]


def check_operation(
    a_url: str,
    b_url: str,
    c_url: str,
    options: dict[str, Any] | None,
    given: tuple[bool | None, bool | None] = (None, None),
) -> tuple[tuple[ArraySpec, ArraySpec, ArraySpec], tuple[bool, bool], bool]:
    """``check_shapes``, with the transposes (given, else C's record) and whether C is a
    Gram product's."""
    a_url, b_url, c_url = (absolute(u) for u in (a_url, b_url, c_url))
    for url, name in ((a_url, "A"), (b_url, "B"), (c_url, "C")):
        check_credentials(url, name)
        local = local_path(url)
        if local is not None:  # before any task reads a file another user's path leads to
            check_readable(name, url, local)
    _check_not_accumulating(a_url, b_url, c_url, options)
    return _operation(a_url, b_url, c_url, options, given)[:3]


def _operation(
    a_url: str,
    b_url: str,
    c_url: str,
    options: dict[str, Any] | None,
    given: tuple[bool | None, bool | None],
    splits: tuple[int | None, int | None] = (None, None),
) -> tuple[tuple[ArraySpec, ArraySpec, ArraySpec], tuple[bool, bool], bool, OutRecord | None]:
    """``check_operation``, and C's record: C is opened once, its record read once."""
    a, b = (
        io.array_spec(as_matrix(io.open_input(url, options, name), split), name)
        for url, name, split in zip((a_url, b_url), "AB", splits, strict=True)
    )
    c_array, ours = _open_c(c_url, options)
    _check_finished(ours, (a_url, b_url, c_url))
    transposed, symmetric = symmetry.recorded(ours, given, c_url)
    a, b = operands(a, b, transposed)
    c = io.array_spec(c_array, "C")
    (m, k), n = a.shape, b.shape[1]
    if c.shape != (m, n):
        raise InputError(
            f"shapes do not match: {'Aᵀ' if transposed[0] else 'A'} {m}x{k}, "
            f"{'Bᵀ' if transposed[1] else 'B'} {b.shape[0]}x{n}, C {c.shape[0]}x{c.shape[1]}; "
            f"C must be {m}x{n}"
        )
    return (a, b, c), transposed, symmetric, ours


def _gram_words(rows: bool, std: Standardize | None) -> tuple[str, str]:
    """A Gram product's VerifyResult.product and .recompute."""
    flags = " --rows" if rows else ""
    what = "X·Xᵀ" if rows else "Xᵀ·X"
    if std is not None:
        what = f"the {std.kind} of X ({what} of X standardized)"
        flags += f" {std.flags}"
    return what, f"python -m pipeline gram X G{flags} --overwrite"


def _measured_again(
    client: Client, x_url: str, options: dict[str, Any], record: dict[str, Any], c_url: str
) -> Standardize:
    """X's standardization as C's record states it, measured again; X must give the shifts
    and scales C was computed with."""
    try:
        asked = standardize_from_record(record)
    except ValueError as e:
        raise InputError(
            f"C ({c_url}) records a standardization this tool cannot read: {e}"
        ) from None
    std = moments.measure(client, x_url, options, asked)
    if record.get("digest") not in (None, std.digest()):
        raise InputError(
            f"X's {std.measures} are not those "
            f"C ({c_url}) was computed with (digest {std.digest()}, recorded "
            f"{record.get('digest')}): X changed after C was written; compute C again"
        )
    return std


def _open_c(c_url: str, options: dict[str, Any] | None) -> tuple[Any, OutRecord | None]:
    """C, read-only, and its record (None: C has none, or a malformed one: not ours)."""
    c = io.open_input(c_url, options, "C")
    return c, of_array(c)


def _recorded_alpha(ours: OutRecord | None) -> float:
    """The α a product of ours was scaled by (``--alpha``; 1 when none is recorded)."""
    return 1.0 if ours is None or ours.alpha is None else ours.alpha


def _recorded_precision(ours: OutRecord | None) -> str:
    """The precision a product of ours was computed at (``--precision``; fp32 when none is
    recorded: a record without the field was computed at fp32)."""
    found = "fp32" if ours is None or ours.precision is None else ours.precision
    if found not in PRECISIONS:
        raise InputError(
            f"C records precision {found!r}, not one of {', '.join(PRECISIONS)}; pass "
            "--precision to say which it was computed at"
        )
    return str(found)


def _check_finished(ours: OutRecord | None, urls: tuple[str, str, str]) -> None:
    """Refuse a C this tool started and has not finished: its unwritten tiles would be
    reported as wrong elements. A C without our record is checked as given."""
    if ours is not None and ours.complete is False:
        raise UnfinishedOutputError(
            f"C ({urls[2]}) is a product `multiply` has not finished writing (its "
            f"{ATTRS_KEY}.complete attribute is false), so its unwritten tiles would be "
            f"reported as wrong; finish it with `python -m pipeline multiply {' '.join(urls)} "
            "--resume`, then verify"
        )


def _check_not_accumulating(
    a_url: str, b_url: str, c_url: str, options: dict[str, Any] | None
) -> None:
    """Refuse a C an accumulation has not finished (or not finished putting back): its tiles
    in flight are moved aside, so C reads neither its old values nor its new ones."""
    state = read_state(Output(c_url, options or {}))
    if state is None or state["phase"] == COMPLETE:
        return
    if state["phase"] == ROLLING_BACK:
        fix = "run the --accumulate again: it first finishes putting C back"
    else:
        fix = (
            f"finish it with `python -m pipeline multiply {a_url} {b_url} {c_url} "
            "--accumulate --resume` (and the --alpha and --beta it started with), then verify"
        )
    raise UnfinishedOutputError(
        f"C ({c_url}) holds an unfinished accumulation ({state['phase']}), so it reads "
        f"neither its old values nor its new ones; {fix}"
    )


def _summarize(
    outcomes: list[RowCheck],
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

"""verify's tasks (pipeline/verify/tasks.py) called one by one, without a cluster: small
arrays in, numbers out, each compared with the number pipeline/verify/check.py's docstring states,
computed here from the formula (not from the code). Fast enough to mutation-test
(benchmarks/mutate.py, target verify-tasks): the cluster tests take seconds per mutant."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr

from pipeline.errors import InputError, InputNotFoundError, UnfinishedOutputError, UsageError
from pipeline.plan.spec import ArraySpec
from pipeline.store import inputs
from pipeline.store.output import ATTRS_KEY, Output
from pipeline.store.record import OutRecord
from pipeline.verify import check as verify
from pipeline.verify import tasks
from pipeline.verify.tasks import CheckSpec
from tests.helpers import write_array
from tests.pipeline.test_output_unit import TokenFileSystem

STATED_TAU, STATED_SAFETY, STATED_MAD = 6.0, 4.0, 0.6745
"""The constants pipeline/verify/check.py's docstring and verify_tasks.py state, written out here
so that changing one in the code fails a test (the tests below never import them)."""
U64 = 2.0**-53
TENSOR_UNIT = {"fp32": 0.0, "tf32": 2.0**-11, "3xtf32": 2.0**-22}


def unit(dtype: str) -> float:
    """Unit roundoff of a float dtype; float64's for integers (their sums are exact)."""
    dt = np.dtype(dtype)
    return float(np.finfo(dt).eps) / 2 if dt.kind in "fc" else U64


def zeroed(x: Any) -> Any:
    """x in float64 (complex128) with its non-finite values read as 0."""
    wide = np.asarray(x).astype("complex128" if np.iscomplexobj(x) else "float64")
    return np.where(np.isfinite(wide), wide, 0)


def spec_of(data: Any, chunks: tuple[int, int]) -> ArraySpec:
    return ArraySpec(tuple(data.shape), chunks, str(data.dtype))  # type: ignore[arg-type]


def make_job(
    tmp_path: Path,
    a: Any,
    b: Any,
    c: Any,
    chunk: int = 4,
    *,
    rounds: int = 3,
    sample: list[tuple[int, int]] | None = None,
    precision: str = "fp32",
    transposed: tuple[bool, bool] = (False, False),
    scaled: tuple[Any, float, float] | None = None,
) -> CheckSpec:
    """A, B and C stored in ``chunk``-square chunks (A and B transposed when ``transposed``
    says so; ``a`` and ``b`` are the operands as used); with ``scaled`` = (C_old or None, α,
    β), C_old is stored too."""
    stored_a = np.ascontiguousarray(a.T) if transposed[0] else a
    stored_b = np.ascontiguousarray(b.T) if transposed[1] else b
    urls = (
        write_array(tmp_path / "a.zarr", stored_a, (chunk, chunk)),
        write_array(tmp_path / "b.zarr", stored_b, (chunk, chunk)),
        write_array(tmp_path / "c.zarr", c, (chunk, chunk)),
    )
    if scaled is not None:
        old, alpha, beta = scaled
        old_url = None if old is None else write_array(tmp_path / "old.zarr", old, (chunk, chunk))
        scaled = (old_url, alpha, beta)
    rng = np.random.default_rng(3)
    r = rng.choice(np.array([-1.0, 1.0]), size=(b.shape[1], rounds))
    specs = (spec_of(a, (chunk, chunk)), spec_of(b, (chunk, chunk)), spec_of(c, (chunk, chunk)))
    picked = [(0, min(3, a.shape[0]))] if sample is None else sample
    return CheckSpec(urls, {}, specs, r, picked, transposed, scaled, precision)


def blocks(extent: int, step: int) -> list[tuple[int, int]]:
    return [(x, min(x + step, extent)) for x in range(0, extent, step)]


def reference(job: CheckSpec) -> Any:
    """What pipeline/verify/check.py submits before the row checks: the B passes, the reference and,
    when B has non-finite columns, the masked pass."""
    ks = blocks(job.specs[1].shape[0], job.specs[1].chunks[0])
    ref = tasks.reference(job, [tasks.b_pass(job, k) for k in ks])
    if tasks.count_b(ref)[1]:
        bad = tasks.nonfinite_columns(ref)
        ref = tasks.with_br(ref, [tasks.b_masked_pass(job, k, bad) for k in ks])
    return ref


def check_all(job: CheckSpec, noise: float) -> list[tasks.RowCheck]:
    ref = reference(job)
    a = job.specs[0]
    return [tasks.check_rows(job, rows, ref, noise) for rows in blocks(a.shape[0], a.chunks[0])]


def ratios(job: CheckSpec, noise: float) -> Any:
    return np.concatenate([check.ratios for check in check_all(job, noise)])


def recorded(c_url: str, options: dict[str, Any] | None = None) -> OutRecord | None:
    """C's record as verify reads it."""
    return verify._open_c(c_url, options or {})[1]


def matrices(m: int, k: int, n: int, dtype: str, seed: int = 0) -> tuple[Any, Any]:
    """A and B whose rows have different scales (so a row's norm matters, not an average)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)) * np.geomspace(1, 50, m)[:, None]
    b = rng.uniform(-1, 1, (k, n)) * np.geomspace(1, 7, n)[None, :]
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.uniform(-1, 1, (m, k))
        b = b - 1j * rng.uniform(-1, 1, (k, n))
    return a.astype(dtype), b.astype(dtype)


def planted(a: Any, b: Any, c_dtype: str, size: float = 1e-4, seed: int = 1) -> Any:
    """C = A·B rounded to ``c_dtype``, one element per row off by ``size`` of the row's scale
    (errors far above rounding, so the residual computed here matches the task's)."""
    exact = zeroed(a) @ zeroed(b)
    c = exact.astype(c_dtype)
    rng = np.random.default_rng(seed)
    for i in range(c.shape[0]):
        j = int(rng.integers(c.shape[1]))
        c[i, j] += size * (1 + i) * float(np.abs(exact[i]).max() + 1)
    return c


def stated_ratios(
    job: CheckSpec,
    a: Any,
    b: Any,
    c_read: Any,
    noise: float,
    compute: str,
    stored_norms: Any = None,
) -> Any:
    """Per row: max over rounds of |C·r − A·(B·r)| / tolerance, the tolerance as
    pipeline/verify/check.py states it: TAU·(min(bound_i, noise_i) + verifier_i), with r set to 0 on
    B's non-finite columns and every non-finite value read as 0. ``c_read``: C as checked
    ((C − β·C_old)/α when accumulated), ``stored_norms``: the norms of the stored values whose
    rounding the tolerance allows (default: ‖C_i‖)."""
    a0, b0, c0 = zeroed(a), zeroed(b), zeroed(c_read)
    k, n = b.shape
    bad = ~np.isfinite(b).all(axis=0)
    a_norm = np.linalg.norm(a0, axis=1)
    b_norm = float(np.linalg.norm(b0[:, ~bad]))
    c_norm = np.linalg.norm(c0, axis=1)
    stored = unit(job.specs[2].dtype) * (c_norm if stored_norms is None else stored_norms)
    factors = 2 * TENSOR_UNIT[job.precision] * a_norm * b_norm
    root_k = math.sqrt(max(k, 1))
    bound = unit(compute) * root_k * a_norm * b_norm + factors + stored
    measured = noise * a_norm * b_norm + stored
    verifier = U64 * (root_k * a_norm * b_norm + math.sqrt(n) * c_norm)
    tol = STATED_TAU * (np.minimum(bound, measured) + verifier) + np.finfo(np.float64).tiny
    masked_r = np.where(bad[:, None], 0.0, job.r)
    residual = np.abs(c0 @ job.r - a0 @ (b0 @ masked_r))
    return (residual / tol[:, None]).max(axis=1, initial=0.0)


# --- the tolerance of one row --------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtypes", "shape", "compute"),
    [
        (("float32", "float32", "float32"), (10, 13, 11), "float32"),
        (("float64", "float64", "float64"), (10, 13, 11), "float64"),
        (("complex64", "complex64", "complex64"), (9, 6, 7), "complex64"),
        # float16 sums in float32; C as float64 (--dtype) still rounds the sums at float32's
        (("float16", "float16", "float64"), (9, 40, 6), "float32"),
        # C as float32 from float64 inputs: the coarser of the two accumulators
        (("float64", "float64", "float32"), (9, 7, 6), "float32"),
        (("int16", "int16", "int64"), (6, 5, 5), "int64"),  # exact sums: float64's rounding
        (("float32", "float32", "float32"), (7, 1, 9), "float32"),  # K = 1: √K is 1, not √2
        (("float64", "float64", "float64"), (7, 1, 9), "float64"),  # K = 1 in verifier_i too
        (("float32", "complex64", "complex64"), (6, 5, 7), "complex64"),  # real A, complex B
        (("complex64", "float64", "complex128"), (6, 5, 7), "complex128"),  # and the reverse
    ],
)
@pytest.mark.parametrize("noise", [0.0, 1e-3, 10.0])  # measured < bound, between, > bound
def test_a_rows_ratio_is_residual_over_the_stated_tolerance(
    tmp_path: Path, dtypes: tuple[str, str, str], shape: tuple[int, int, int], compute: str,
    noise: float,
) -> None:  # fmt: skip
    m, k, n = shape
    a, b = matrices(m, k, n, "float64", seed=k)
    a, b = (a * 3).astype(dtypes[0]), (b * 3).astype(dtypes[1])
    c = planted(a, b, dtypes[2], size=1e-3 if "int" not in dtypes[0] else 1.0)
    job = make_job(tmp_path, a, b, c)
    got = ratios(job, noise)
    want = stated_ratios(job, a, b, c, noise, compute)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert got.dtype == np.float64 and got.shape == (m,)


@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
def test_tensor_precisions_add_the_rounding_of_every_factor(tmp_path: Path, precision: str) -> None:
    """Each term a_ik·b_kj rounded at u_p: 2·u_p·‖A_i‖·‖B‖_F more per row (when the bound, not
    the measured noise, is the smaller)."""
    a, b = matrices(8, 30, 9, "float32")
    c = planted(a, b, "float32", size=3e-3)
    job = make_job(tmp_path, a, b, c, precision=precision)
    (tmp_path / "plain").mkdir()
    plain = make_job(tmp_path / "plain", a, b, c)
    got = ratios(job, 1.0)
    np.testing.assert_allclose(got, stated_ratios(job, a, b, c, 1.0, "float32"), rtol=1e-9)
    assert (got < ratios(plain, 1.0) / 2).all()  # 2·u_p > √30·u: the tolerance more than doubles


def test_a_zero_row_of_a_passes_only_with_a_zero_row_of_c(tmp_path: Path) -> None:
    """A zero row of A (and of C) has a tolerance of the float64 tiny alone: the ratio is 0,
    not NaN; a non-zero element in that row of C fails by far."""
    a, b = matrices(6, 5, 7, "float32")
    a[2] = 0
    c = (a.astype("float64") @ b.astype("float64")).astype("float32")
    job = make_job(tmp_path, a, b, c)
    got = ratios(job, 0.0)
    assert got[2] == 0 and (got < 1).all()
    c[2, 4] = 1e-30
    (tmp_path / "wrong").mkdir()
    assert ratios(make_job(tmp_path / "wrong", a, b, c), 0.0)[2] > 1e6


@pytest.mark.parametrize(("alpha", "beta"), [(2.5, 0.0), (-0.5, 3.0), (1.0, -2.0)])
def test_an_accumulated_product_allows_the_rounding_of_the_stored_values(
    tmp_path: Path, alpha: float, beta: float
) -> None:
    """C = α·A·B + β·C_old is checked as (C − β·C_old)/α, its tolerance allowing the rounding
    of the stored values: u_C·(‖C_i‖ + |β|·‖C_old,i‖)/|α| (pipeline/verify/accumulated.py)."""
    a, b = matrices(9, 12, 7, "float32")
    old = matrices(9, 7, 7, "float32", seed=4)[0] * 100
    product = planted(a, b, "float64", size=1e-3)
    c = (alpha * product + beta * old.astype("float64")).astype("float32")
    job = make_job(tmp_path, a, b, c, scaled=(old, alpha, beta))
    read = (c.astype("float64") - beta * old.astype("float64")) / alpha
    size = np.abs(c.astype("float64")) + np.abs(beta * old.astype("float64"))
    norms = np.linalg.norm(size, axis=1) / abs(alpha)
    for noise in (0.0, 1.0):
        want = stated_ratios(job, a, b, read, noise, "float32", stored_norms=norms)
        np.testing.assert_allclose(ratios(job, noise), want, rtol=1e-9)


def test_non_finite_rows_and_columns_are_checked_by_their_pattern(tmp_path: Path) -> None:
    """A non-finite row of A implies a non-finite row of C, a column of B a column; elsewhere
    a non-finite element is unexpected, and an overflow when ‖A_i‖·‖B_j‖ reaches half of the
    largest value both the float32 accumulator and the float16 C hold (65504). Such rows are
    judged by the pattern (ratio 0); the others by the residual on the finite part."""
    a, b = matrices(8, 6, 7, "float16")
    b /= 7  # |b| < 1: row 7 of C fits float16
    b[:, 0] = 1
    a[7] = 6000  # C[7, 0] = 36000 fits; its bound, as large, x 2 reaches 65504
    a[1, 2], a[4, 0], b[3, 5] = np.nan, np.inf, -np.inf
    c = planted(a, b, "float16", size=1e-2)
    c[1], c[:, 5] = np.nan, np.nan  # implied: correct
    c[6, 2], c[7, 0] = np.nan, np.inf  # unexpected; the second maybe an overflow
    job = make_job(tmp_path, a, b, c, chunk=3)
    checks = check_all(job, 1e-3)
    got = np.concatenate([x.ratios for x in checks])
    mismatched = np.concatenate([x.mismatched for x in checks])
    assert np.flatnonzero(mismatched).tolist() == [4, 6, 7]  # 4: finite where A implies not
    assert np.concatenate([x.a_counts for x in checks]).tolist() == [0, 1, 0, 0, 1, 0, 0, 0]
    counts = [(x.unexpected, x.overflow, x.missing) for x in checks]
    assert counts == [(0, 0, 0), (0, 0, 6), (2, 1, 0)]
    assert [x.first_mismatch for x in checks] == [None, (4, 0), (6, 2)]
    assert (got[[1, 4, 6, 7]] == 0).all()
    judged = [0, 2, 3, 5]
    want = stated_ratios(job, a, b, c, 1e-3, "float32")
    np.testing.assert_allclose(got[judged], want[judged], rtol=1e-9)
    assert got[judged].max() > 1  # the planted errors count


# --- the passes over B and the reference ---------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
@pytest.mark.parametrize("transposed", [(False, False), (True, True), (True, False)])
def test_a_pass_over_b_sums_what_its_k_block_contributes(
    tmp_path: Path, dtype: str, transposed: tuple[bool, bool]
) -> None:
    a, b = matrices(10, 13, 11, dtype)
    a[1, 5], b[6, 3], b[5, 3], b[9, 8] = np.nan, np.inf, np.nan, np.nan
    c = np.zeros((10, 11), dtype)
    sample = [(0, 3), (7, 9)]
    job = make_job(tmp_path, a, b, c, sample=sample, transposed=transposed)
    a0, b0, s = zeroed(a), zeroed(b), [0, 1, 2, 7, 8]
    for k0, k1 in ((4, 8), (12, 13), (0, 13)):
        part = tasks.b_pass(job, (k0, k1))
        np.testing.assert_allclose(part.br, b0[k0:k1] @ job.r, rtol=1e-12)
        np.testing.assert_allclose(part.squares, (np.abs(b0[k0:k1]) ** 2).sum(axis=0), rtol=1e-12)
        np.testing.assert_allclose(part.exact, a0[s, k0:k1] @ b0[k0:k1], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(part.a_squares, (np.abs(a0[s, k0:k1]) ** 2).sum(axis=1))
        assert part.squares.dtype == part.a_squares.dtype == np.float64
        bad = ~np.isfinite(a[s, k0:k1]).all(axis=1)
        np.testing.assert_array_equal(part.sample_bad, bad)
        np.testing.assert_array_equal(part.b_counts, (~np.isfinite(b[k0:k1])).sum(axis=0))
        assert part.b_counts.dtype == np.int64  # counts, as _BPart declares
    assert tasks.b_pass(job, (4, 8)).sample_bad.tolist() == [False, True, False, False, False]


def test_a_pass_over_b_with_no_sampled_rows(tmp_path: Path) -> None:
    a, b = matrices(5, 6, 4, "float64")
    job = make_job(tmp_path, a, b, np.zeros((5, 4)), sample=[])
    part = tasks.b_pass(job, (2, 6))
    assert part.exact.shape == (0, 4) and part.a_squares.shape == (0,)
    assert part.sample_bad.shape == (0,) and part.sample_bad.dtype == bool
    np.testing.assert_allclose(part.br, b[2:6] @ job.r)


def test_the_reference_combines_the_k_blocks(tmp_path: Path) -> None:
    a, b = matrices(10, 13, 11, "float64")
    a[8, 12], b[2, 7], b[11, 7], b[0, 1] = np.nan, np.nan, np.inf, np.nan
    job = make_job(tmp_path, a, b, np.zeros((10, 11)), sample=[(0, 3), (7, 9)])
    ref = tasks.reference(job, [tasks.b_pass(job, ks) for ks in blocks(13, 4)])
    a0, b0, s = zeroed(a), zeroed(b), [0, 1, 2, 7, 8]
    np.testing.assert_allclose(ref.br, b0 @ job.r, rtol=1e-12)  # all columns, before masking
    norms = np.where(np.isfinite(b).all(axis=0), np.linalg.norm(b0, axis=0), 0.0)
    np.testing.assert_allclose(ref.b_norms, norms, rtol=1e-12)
    assert ref.b_norms[[1, 7]].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(ref.exact, a0[s] @ b0, rtol=1e-12)
    np.testing.assert_allclose(ref.a_norms, np.linalg.norm(a0[s], axis=1), rtol=1e-12)
    assert ref.sample_bad.tolist() == [False, False, False, False, True]
    assert ref.b_counts.tolist() == [0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 0]
    assert tasks.count_b(ref) == (3, 2)
    assert tasks.nonfinite_columns(ref).tolist() == [j in (1, 7) for j in range(11)]
    # the masked pass: r is 0 on B's non-finite columns, which read as 0
    bad = tasks.nonfinite_columns(ref)
    masked = [tasks.b_masked_pass(job, ks, bad) for ks in blocks(13, 4)]
    assert [x.shape for x in masked] == [(4, 3), (4, 3), (4, 3), (1, 3)]
    kept = np.where(bad[:, None], 0.0, job.r)
    np.testing.assert_allclose(tasks.with_br(ref, masked).br, b0 @ kept, rtol=1e-12)
    assert tasks.with_br(ref, []) is ref
    assert tasks.with_br(ref, masked).exact is ref.exact


def test_the_reference_of_an_empty_k(tmp_path: Path) -> None:
    a, b = np.zeros((5, 0)), np.zeros((0, 4))
    job = make_job(tmp_path, a, b, np.zeros((5, 4)), rounds=2, sample=[(0, 2), (3, 5)])
    ref = tasks.reference(job, [])
    assert ref.br.shape == (0, 2)
    assert ref.b_norms.tolist() == [0.0] * 4
    assert ref.exact.shape == (4, 4) and not ref.exact.any()
    assert ref.a_norms.tolist() == [0.0] * 4
    assert ref.sample_bad.dtype == bool and ref.sample_bad.tolist() == [False] * 4
    assert ref.b_counts.dtype == np.int64 and ref.b_counts.tolist() == [0] * 4
    assert tasks.count_b(ref) == (0, 0)
    assert tasks.measure_noise(job, ref) == 0.0  # nothing to measure: every scale is 0


@pytest.mark.parametrize(("a_dtype", "b_dtype"), [("float32", "complex64"), ("complex64", "int16")])
def test_a_pass_over_b_of_mixed_dtypes(tmp_path: Path, a_dtype: str, b_dtype: str) -> None:
    """One operand real, one complex: both read as complex128 (neither loses its imaginary
    part)."""
    a, b = matrices(6, 5, 4, "complex128")
    a, b = ((x * 4 if np.dtype(d).kind == "c" else (x * 4).real).astype(d)
            for x, d in ((a, a_dtype), (b, b_dtype)))  # fmt: skip
    job = make_job(tmp_path, a, b, np.zeros((6, 4), "complex64"), sample=[(1, 4)])
    part = tasks.b_pass(job, (0, 5))
    a0, b0 = a.astype("complex128"), b.astype("complex128")
    np.testing.assert_allclose(part.br, b0 @ job.r, rtol=1e-12)
    np.testing.assert_allclose(part.exact, a0[1:4] @ b0, rtol=1e-12)
    assert part.exact.dtype == part.br.dtype == np.complex128


# --- the measured noise --------------------------------------------------------------------


def stated_noise(a: Any, b: Any, c: Any, sample: list[int]) -> float:
    """SAFETY x max over the sampled rows of median_j(|C − exact|_sj / (‖A_s‖·‖B_j‖)) / 0.6745,
    over the finite rows of A, columns of B and elements of C."""
    a0, b0 = zeroed(a), zeroed(b)
    exact = a0[sample] @ b0
    good_cols = np.isfinite(b).all(axis=0)
    rms = []
    for row, s in enumerate(sample):
        if not np.isfinite(a[s]).all():
            continue
        usable = good_cols & np.isfinite(c[s])
        scale = np.linalg.norm(a0[s]) * np.linalg.norm(b0[:, usable], axis=0)
        rms.append(np.median(np.abs(c[s, usable] - exact[row, usable]) / scale) / STATED_MAD)
    return STATED_SAFETY * max(rms)


def noise_slack(k: int) -> float:
    """How far the noise may move when the task's float64 exact product and stated_noise's
    sum in different orders (the BLAS kernel's, the k-blocks'): each element within
    √2·γ(K+2)·‖A_s‖·‖B_j‖ (a complex dot product; Cauchy-Schwarz), so each scaled residual,
    their median and max within twice that, times SAFETY / MAD."""
    return STATED_SAFETY / STATED_MAD * 2 * math.sqrt(2) * (k + 2) * U64 * 1.01


def test_the_noise_is_the_stated_robust_estimate(tmp_path: Path) -> None:
    """Rows with different noise levels (the largest counts), one outlier per row (the median
    ignores it; a mean would not), a NaN in C, a non-finite column of B and a non-finite
    sampled row of A (left out)."""
    a, b = matrices(12, 9, 11, "float64")
    exact = a @ b
    rng = np.random.default_rng(7)
    scale = np.linalg.norm(a, axis=1)[:, None] * np.linalg.norm(b, axis=0)[None, :]
    level = np.geomspace(1e-9, 1e-6, 12)[:, None]
    c = exact + rng.normal(size=exact.shape) * level * scale
    c[:, 3] += 1e-2 * scale[:, 3]  # one wrong element per row
    c[1, 6], b[4, 9], a[9, 1] = np.nan, np.inf, np.nan
    sample = [(0, 3), (5, 7), (8, 11)]
    job = make_job(tmp_path, a, b, c, chunk=4, sample=sample)
    got = tasks.measure_noise(job, reference(job))
    want = stated_noise(a, b, c, [0, 1, 2, 5, 6, 8, 9, 10])
    assert got == pytest.approx(want, rel=1e-9, abs=noise_slack(9))
    assert 4 * 3e-7 < got < 4 * 1e-6  # the noisiest sampled row (10, at 5.3e-7) sets it


def test_no_noise_to_measure(tmp_path: Path) -> None:
    a, b = matrices(6, 5, 4, "float64")
    c = a @ b + 1e-3
    (tmp_path / "x").mkdir()
    none_sampled = make_job(tmp_path / "x", a, b, c, sample=[])
    assert tasks.measure_noise(none_sampled, reference(none_sampled)) == 0.0
    b[0] = np.nan  # every column of B non-finite: nothing usable
    job = make_job(tmp_path, a, b, c, sample=[(0, 3)])
    assert tasks.measure_noise(job, reference(job)) == 0.0


# --- a Gram product's mirror, and the small helpers -----------------------------------------


def test_asymmetric_counts_elements_not_bitwise_equal_to_their_mirror(tmp_path: Path) -> None:
    """Each row block compares its part right of (and on) its diagonal block with the mirror:
    a pair across blocks counts once, a pair inside a diagonal block twice (both halves are
    on the row block's side), +0.0 vs -0.0 differs in bits."""
    x = np.random.default_rng(2).uniform(-1, 1, (8, 8))
    c = (x + x.T).astype("float32")
    c[0, 7] = np.nextafter(c[7, 0], np.float32(2))  # across blocks: once
    c[3, 4], c[4, 3] = 0.0, -0.0  # inside the diagonal block (3..5): twice
    c[6, 1] += 1  # below the diagonal: its mirror's row block (0..2) counts it
    url = write_array(tmp_path / "c.zarr", c, (3, 3))
    spec = spec_of(c, (3, 3))
    job = CheckSpec((url, url, url), {}, (spec, spec, spec), np.ones((8, 1)), [])
    found = [tasks.asymmetric(job, rows) for rows in blocks(8, 3)]
    assert found == [2, 2, 0]


def test_bits() -> None:
    assert tasks._bits(np.array([0.0, -0.0], "float32")).tolist() == [0, 2**31]
    assert tasks._bits(np.array([1 + 2j], "complex64")).dtype == np.dtype("u4")
    assert tasks._bits(np.array([1 + 2j], "complex128")).shape == (2,)
    assert tasks._bits(np.array([[1.0], [2.0]], "float16").T).dtype == np.dtype("u2")
    flags = np.array([True, False])
    assert tasks._bits(flags) is not None and tasks._bits(flags).dtype == bool


@pytest.mark.parametrize(
    ("dtype", "u"),
    [("float16", 2.0**-11), ("float32", 2.0**-24), ("complex64", 2.0**-24),
     ("float64", 2.0**-53), ("complex128", 2.0**-53), ("int32", 2.0**-53), ("bool", 2.0**-53)],
)  # fmt: skip
def test_unit_roundoff(dtype: str, u: float) -> None:
    assert tasks._unit(dtype) == u


@pytest.mark.parametrize(
    ("dtypes", "largest"),
    [
        (("float32", "float16"), 65504.0),
        (("float64", "float32"), float(np.finfo("float32").max)),
        (("complex128", "complex128"), float(np.finfo("float64").max)),
        (("int64", "float16"), 65504.0),
        (("int64", "int32"), math.inf),
    ],
)
def test_largest_value_both_hold(dtypes: tuple[str, str], largest: float) -> None:
    assert tasks._largest(dtypes) == largest


def test_constants_are_the_stated_ones() -> None:
    assert (tasks.TAU, tasks.SAFETY, tasks.GAUSSIAN_MAD) == (STATED_TAU, STATED_SAFETY, STATED_MAD)
    assert tasks.U64 == U64


def test_a_missing_operand_is_named(tmp_path: Path) -> None:
    a, b = matrices(4, 4, 4, "float64")
    job = make_job(tmp_path, a, b, a @ b)
    for index, name in ((0, "A"), (1, "B")):
        missing = CheckSpec(
            tuple(str(tmp_path / "gone") if i == index else u for i, u in enumerate(job.urls)),
            {}, job.specs, job.r, job.sample,
        )  # type: ignore[arg-type]  # fmt: skip
        with pytest.raises(InputNotFoundError, match=rf"^{name} \("):
            tasks.b_pass(missing, (0, 4))


def test_a_wrong_element_in_a_row_of_tiny_values_fails(tmp_path: Path) -> None:
    """The float64 tiny floor of the tolerance keeps it positive where the row's scale is
    below float64's normal range (1e-300 x u is subnormal): a wrong 1e-300 in a zero row fails
    (a tolerance gone negative would pass any residual)."""
    a, b = matrices(5, 4, 7, "float64")
    a[3] = 0
    c = a @ b
    c[3, 2] = 1e-300
    assert ratios(make_job(tmp_path, a, b, c), 0.0)[3] > 1e6


def test_no_rounds_checks_nothing(tmp_path: Path) -> None:
    a, b = matrices(5, 4, 6, "float32")
    c = planted(a, b, "float32")
    assert ratios(make_job(tmp_path, a, b, c, rounds=0), 0.0).tolist() == [0.0] * 5


def test_complex_b_with_non_finite_columns_and_a_real_a(tmp_path: Path) -> None:
    """The masked pass over B reads it as complex128 whatever A's dtype (B·r is complex)."""
    a, b = matrices(6, 5, 7, "float64")
    b = (b + 1j * b[::-1]).astype("complex64")
    a = a.astype("float32")
    b[2, 4] = np.inf
    c = planted(a, b, "complex64")
    c[:, 4] = np.nan
    job = make_job(tmp_path, a, b, c)
    got = ratios(job, 1e-3)
    np.testing.assert_allclose(got, stated_ratios(job, a, b, c, 1e-3, "complex64"), rtol=1e-9)
    assert tasks.measure_noise(job, reference(job)) == pytest.approx(
        stated_noise(a, b, c, [0, 1, 2]), rel=1e-9, abs=noise_slack(5)
    )  # complex C read as complex128


def test_the_noise_of_small_values(tmp_path: Path) -> None:
    """‖A_s‖·‖B_j‖ below 1 is still a scale (only 0, a non-finite column, is left out)."""
    a, b = matrices(6, 5, 7, "float64")
    a, b = a * 1e-3, b * 1e-3
    exact = a @ b
    c = exact * (1 + np.random.default_rng(4).normal(size=exact.shape) * 1e-9)
    job = make_job(tmp_path, a, b, c, sample=[(0, 4)])
    got = tasks.measure_noise(job, reference(job))
    want = stated_noise(a, b, c, [0, 1, 2, 3])
    assert got == pytest.approx(want, rel=1e-9, abs=noise_slack(5)) and got > 0


def test_a_missing_c_is_named(tmp_path: Path) -> None:
    a, b = matrices(4, 4, 4, "float64")
    job = make_job(tmp_path, a, b, a @ b)
    gone = CheckSpec((*job.urls[:2], str(tmp_path / "gone")), {}, job.specs, job.r, job.sample)
    for run in (
        lambda: tasks.asymmetric(gone, (0, 4)),
        lambda: tasks.measure_noise(gone, reference(job)),
        lambda: tasks.check_rows(gone, (0, 4), reference(job), 0.0),
    ):
        with pytest.raises(InputNotFoundError, match=r"^C \("):
            run()


def test_every_task_opens_its_arrays_with_the_jobs_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The storage options (credentials, endpoint) reach every open, each array named."""
    a, b = matrices(6, 5, 6, "float32")
    c = planted(a, b, "float32")
    job = make_job(tmp_path, a, b, c)
    job = dataclasses.replace(job, options={"anon": True})  # dropped for local paths
    opened: list[tuple[str, Any, str]] = []
    real = inputs.open_input

    def spy(url: str, options: Any = None, name: str = "A") -> Any:
        opened.append((Path(url).name, options, name))
        return real(url, options, name)

    monkeypatch.setattr(inputs, "open_input", spy)
    check_all(job, 0.0)
    tasks.measure_noise(job, reference(job))
    tasks.asymmetric(job, (0, 4))
    assert {(url, name) for url, _, name in opened} == {
        ("a.zarr", "A"), ("b.zarr", "B"), ("c.zarr", "C"),
    }  # fmt: skip
    assert all(options == {"anon": True} for _, options, _ in opened)


# --- pipeline/verify/check.py's client side without a cluster ------------------------------------


def row_check(ratios: list[float], **fields: Any) -> tasks.RowCheck:
    n = len(ratios)
    values: dict[str, Any] = {
        "ratios": np.array(ratios, dtype=float), "mismatched": np.zeros(n, dtype=bool),
        "a_counts": np.zeros(n, dtype=np.int64), "unexpected": 0, "overflow": 0, "missing": 0,
        "first_mismatch": None,
    }  # fmt: skip
    return tasks.RowCheck(**{**values, **fields})


def test_summary_of_passing_and_failing_blocks() -> None:
    outcomes = [
        row_check([0.2, 0.9, 0.1]),
        row_check([0.5, 1.5, 0.3]),  # fails: 1.5 > 1
        row_check([1.0, 0.0]),  # exactly 1 passes
    ]
    rows = [(0, 3), (3, 6), (6, 8)]
    got = verify._summarize(outcomes, rows, 3, 0.25, (2, 1))
    assert got.passed is False and got.failing_row_blocks == ((3, 6),)
    assert (got.worst_ratio, got.worst_row, got.rounds, got.noise) == (1.5, 4, 3, 0.25)
    assert (got.b_nonfinite, got.b_nonfinite_columns) == (2, 1)
    passing = verify._summarize([outcomes[0], outcomes[2]], [(0, 3), (6, 8)], 1, 0.0, (0, 0))
    assert passing.passed and passing.failing_row_blocks == ()
    assert (passing.worst_ratio, passing.worst_row) == (1.0, 6)  # the first of the ties


def test_summary_of_non_finite_rows_and_patterns() -> None:
    """Rows of A that are not finite and rows whose pattern differs are not checked by their
    ratio; a mismatched pattern fails its block; a NaN ratio fails and is the worst."""
    a_bad = row_check([7.0, 0.5], a_counts=np.array([2, 0]))
    pattern = row_check([0.0, 0.4], mismatched=np.array([True, False]), unexpected=1,
                        overflow=1, first_mismatch=(2, 5))  # fmt: skip
    missing = row_check([0.1, 0.2], missing=3, first_mismatch=(4, 1), a_counts=np.array([0, 1]))
    got = verify._summarize([a_bad, pattern, missing], [(0, 2), (2, 4), (4, 6)], 2, 0.0, (0, 0))
    assert got.failing_row_blocks == ((0, 2), (2, 4))  # 7.0 in a bad row of A still counts
    assert (got.worst_ratio, got.worst_row) == (0.5, 1)  # not the unchecked 7.0
    assert (got.a_nonfinite, got.a_nonfinite_rows) == (3, 2)
    assert (got.c_unexpected, got.c_overflow, got.c_missing) == (1, 1, 3)
    assert got.first_mismatch == (2, 5)
    assert not got.pattern_matches and not got.finite_inputs
    nan = verify._summarize([row_check([0.3, float("nan")])], [(0, 2)], 1, 0.0, (0, 0))
    assert not nan.passed and nan.worst_row == 1 and np.isnan(nan.worst_ratio)
    none = verify._summarize([row_check([0.0], a_counts=np.array([1]))], [(0, 1)], 1, 0.0, (0, 0))
    assert (none.worst_ratio, none.worst_row) == (0.0, -1)  # no row checked


def test_itemsize() -> None:
    assert verify._itemsize(ArraySpec((2, 2), (1, 1), "float16")) == 2


def test_result_properties() -> None:
    clean = verify.VerifyResult(True, 2, 0.1, 0, ())
    assert clean.pattern_matches and clean.finite_inputs
    assert not dataclasses.replace(clean, c_missing=1).pattern_matches
    assert not dataclasses.replace(clean, b_nonfinite=1).finite_inputs
    assert not dataclasses.replace(clean, a_nonfinite=1).finite_inputs


@pytest.mark.parametrize(("m", "chunk"), [(100, 10), (100, 30), (7, 10), (3, 2), (40, 3)])
def test_sampled_rows(m: int, chunk: int) -> None:
    """SAMPLE_ROWS consecutive rows (fewer where a block is shorter) from each of
    SAMPLE_BLOCKS distinct row blocks (all of them when fewer), in order."""
    assert (verify.SAMPLE_BLOCKS, verify.SAMPLE_ROWS) == (4, 4)
    for seed in range(5):
        got = verify._sample_rows(np.random.default_rng(seed), m, chunk)
        blocks = [r0 // chunk for r0, _ in got]
        assert len(got) == min(4, -(-m // chunk)) and blocks == sorted(set(blocks))
        for r0, r1 in got:
            start, stop = r0 // chunk * chunk, min(r0 // chunk * chunk + chunk, m)
            assert start <= r0 < r1 <= stop and r1 - r0 == min(4, stop - start)
    spread = {verify._sample_rows(np.random.default_rng(s), 100, 10)[0] for s in range(30)}
    assert len(spread) > 3  # random blocks and offsets, not always the first rows


def test_shapes_that_are_no_product_are_refused(tmp_path: Path) -> None:
    a, b = matrices(4, 5, 6, "float32")
    urls = [write_array(tmp_path / f"{n}.zarr", x, (2, 2)) for n, x in (("a", a), ("b", b))]
    c_url = write_array(tmp_path / "c.zarr", np.zeros((4, 7), "float32"), (2, 2))
    want = "shapes do not match: A 4x5, B 5x6, C 4x7; C must be 4x6"
    with pytest.raises(InputError, match=f"^{re.escape(want)}$"):
        verify.check_shapes(*urls, c_url, None)
    stored = [write_array(tmp_path / f"{n}t.zarr", np.ascontiguousarray(x.T), (2, 2))
              for n, x in (("a", a), ("b", b))]  # fmt: skip
    want_t = "shapes do not match: Aᵀ 4x5, Bᵀ 5x6, C 4x7; C must be 4x6"
    with pytest.raises(InputError, match=f"^{re.escape(want_t)}$"):
        verify.check_shapes(*stored, c_url, None, (True, True))
    good = write_array(tmp_path / "good.zarr", np.zeros((4, 6), "float32"), (2, 3))
    specs, transposed, symmetric = verify.check_operation(*urls, good, {})
    assert [s.shape for s in specs] == [(4, 5), (5, 6), (4, 6)]
    assert (transposed, symmetric) == ((False, False), False)


def test_what_c_records(tmp_path: Path) -> None:
    """α and the precision default to what C's attributes record; an unfinished C of ours
    is refused with the command that finishes it."""
    a, b = matrices(4, 5, 6, "float32")
    urls = [write_array(tmp_path / f"{n}.zarr", x, (2, 2)) for n, x in (("a", a), ("b", b))]
    made = Output(str(tmp_path / "c.zarr"))
    made.create((4, 6), (2, 3), "float32", {"alpha": 2.5, "precision": "tf32", "symmetric": True})
    assert verify._recorded_alpha(recorded(made.url)) == 2.5
    assert verify._recorded_precision(recorded(made.url)) == "tf32"
    assert verify.check_operation(*urls, made.url, {})[2] is True
    plain = write_array(tmp_path / "plain.zarr", np.zeros((4, 6), "float32"), (2, 3))
    assert verify._recorded_alpha(recorded(plain)) == 1.0
    assert verify._recorded_precision(recorded(plain)) == "fp32"
    zarr.open_array(plain, mode="r+").attrs[ATTRS_KEY] = "not ours"
    assert (
        verify._recorded_alpha(recorded(plain)),
        verify._recorded_precision(recorded(plain)),
    ) == (
        1.0,
        "fp32",
    )
    odd = Output(str(tmp_path / "odd.zarr"))
    odd.create((4, 6), (2, 3), "float32", {"precision": "bf16"})
    want = (
        "C records precision 'bf16', not one of fp32, tf32, 3xtf32; pass --precision to say "
        "which it was computed at"
    )
    with pytest.raises(InputError, match=f"^{re.escape(want)}$"):
        verify._recorded_precision(recorded(odd.url))
    unfinished = Output(str(tmp_path / "u.zarr"))
    unfinished.create((4, 6), (2, 3), "float32", {"complete": False})
    want = (
        f"C ({unfinished.url}) is a product `multiply` has not finished writing (its "
        f"{ATTRS_KEY}.complete attribute is false), so its unwritten tiles would be reported as "
        f"wrong; finish it with `python -m pipeline multiply {urls[0]} {urls[1]} "
        f"{unfinished.url} --resume`, then verify"
    )
    with pytest.raises(UnfinishedOutputError, match=f"^{re.escape(want)}$"):
        verify.check_operation(*urls, unfinished.url, {})
    finished = Output(str(tmp_path / "f.zarr"))
    finished.create((4, 6), (2, 3), "float32", {"complete": True})
    verify.check_operation(*urls, finished.url, {})


def test_what_c_records_by_default(tmp_path: Path) -> None:
    """Our C without α or a precision recorded (before those options): 1 and fp32."""
    made = Output(str(tmp_path / "c.zarr"))
    made.create((2, 2), (2, 2), "float32", {"fingerprint": "f0"})
    assert verify._recorded_alpha(recorded(made.url)) == 1.0
    assert verify._recorded_precision(recorded(made.url)) == "fp32"


def test_the_worst_row_is_the_first_of_equals() -> None:
    got = verify._summarize(
        [row_check([0.1, 0.5]), row_check([0.5, 0.2])], [(0, 2), (2, 4)], 1, 0.0, (0, 0)
    )
    assert (got.worst_ratio, got.worst_row) == (0.5, 1)


@pytest.mark.parametrize(
    ("transposed", "want"),
    [
        ((True, False), "shapes do not match: Aᵀ 4x5, B 5x6, C 4x7; C must be 4x6"),
        ((False, True), "shapes do not match: A 4x5, Bᵀ 5x6, C 4x7; C must be 4x6"),
    ],
)
def test_shape_refusals_name_each_transpose(
    tmp_path: Path, transposed: tuple[bool, bool], want: str
) -> None:
    a, b = matrices(4, 5, 6, "float32")
    stored = [
        np.ascontiguousarray(x.T) if t else x for x, t in zip((a, b), transposed, strict=True)
    ]
    urls = [
        write_array(tmp_path / f"{n}.zarr", x, (2, 2)) for n, x in zip("ab", stored, strict=True)
    ]
    c_url = write_array(tmp_path / "c.zarr", np.zeros((4, 7), "float32"), (2, 2))
    with pytest.raises(InputError, match=f"^{re.escape(want)}$"):
        verify.check_shapes(*urls, c_url, {}, transposed)
    good = write_array(tmp_path / "good.zarr", np.zeros((4, 6), "float32"), (2, 2))
    specs = verify.check_shapes(*urls, good, {}, transposed)
    assert [s.shape for s in specs] == [(4, 5), (5, 6), (4, 6)]


def test_a_transpose_that_c_does_not_record_is_refused(tmp_path: Path) -> None:
    a, b = matrices(4, 4, 4, "float32")
    urls = [
        write_array(tmp_path / f"{n}.zarr", x, (2, 2)) for n, x in zip("ab", (a, b), strict=True)
    ]
    made = Output(str(tmp_path / "c.zarr"))
    made.create((4, 4), (2, 2), "float32", {"fingerprint": "f0"})
    with pytest.raises(UsageError, match=rf"^C \({re.escape(made.url)}\) records the product"):
        verify.check_operation(*urls, made.url, {}, (True, None))


@pytest.mark.parametrize("name", ["A", "B", "C"])
def test_each_operand_is_named(tmp_path: Path, name: str) -> None:
    """A missing or 1-D operand is named in the refusal (by check_operation, and C also where
    verify opens it to read its record)."""
    a, b = matrices(4, 4, 4, "float32")
    urls = {
        n: write_array(tmp_path / f"{n}.zarr", x, (2, 2))
        for n, x in zip("ABC", (a, b, a @ b), strict=True)
    }
    missing = {**urls, name: str(tmp_path / "gone")}
    with pytest.raises(InputNotFoundError, match=rf"^{name} \("):
        verify.check_operation(missing["A"], missing["B"], missing["C"], {})
    flat = {**urls, name: write_array(tmp_path / "flat.zarr", np.ones(4), (2,))}  # type: ignore[arg-type]
    with pytest.raises(InputError, match=rf"^{name} has 1 dimension\(s\) \(4,\)"):
        verify.check_operation(flat["A"], flat["B"], flat["C"], {})
    if name == "C":
        with pytest.raises(InputNotFoundError, match=r"^C \("):
            verify._open_c(missing["C"], {})


def test_the_client_side_reads_with_the_storage_options(tmp_path: Path) -> None:
    """A, B and C on an object store that needs its options (a credential)."""
    fsspec.register_implementation("tokenfs", TokenFileSystem, clobber=True)
    root, options = f"tokenfs://v-{tmp_path.name}", {"token": "secret"}
    a, b = matrices(4, 5, 6, "float32")
    urls = []
    for name, x in (("a", a), ("b", b)):
        zarr.create_array(f"{root}/{name}", data=x, chunks=(2, 2), storage_options=options)
        urls.append(f"{root}/{name}")
    made = Output(f"{root}/c", options)
    made.create((4, 6), (2, 3), "float32", {"alpha": 3.0, "precision": "3xtf32"})
    try:
        assert [s.shape for s in verify.check_shapes(*urls, made.url, options)][2] == (4, 6)
        assert verify._recorded_alpha(recorded(made.url, options)) == 3.0
        assert verify._recorded_precision(recorded(made.url, options)) == "3xtf32"
    finally:
        with contextlib.suppress(FileNotFoundError):
            TokenFileSystem(token="secret").rm(f"v-{tmp_path.name}", recursive=True)

"""verify's tolerance for a standardized Gram product (pipeline/verify/tasks.py, check_rows): the
worst case k·u of repeated values, not √k·u, and nothing looser. An error planted just over it in
each row of C is caught, one just under it passes (benchmarks/mutate.py, target
verify-standardized)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.plan.standardize import Standardize, block_moments, measured
from pipeline.verify import tasks
from tests.pipeline.test_verify_unit import blocks, make_job, reference

TAU = 6.0
"""As pipeline/verify/check.py's docstring states it (not imported: a change must fail here)."""
U32, U64 = 2.0**-24, 2.0**-53
K, N = 10, 6
"""X: K samples (rows, summed over) of N variables: C = X'ᵀX' is N x N."""


def standardized(x: Any, mode: str) -> tuple[Standardize, Any]:
    """The measured standardization of X's columns and X' = (X − shift)·scale in float64, as
    verify reads the operands."""
    std = measured(Standardize(mode, 1), block_moments(x, 1))
    assert std.shift is not None and std.scale is not None
    return std, (x.astype(np.float64) - std.shift) * std.scale


def tolerance(xs: Any, c: Any, factor_unit: float = 0.0) -> Any:
    """Per row of C: TAU·(u·(k + 2)·‖A_i‖·‖B‖ + u_C·‖C_i‖ + verifier), u float32's (X's dtype,
    never finer than C's), u_C C's own (its stored values' rounding)."""
    a_norm = np.linalg.norm(xs.T, axis=1)
    b_norm = float(np.linalg.norm(xs))
    c_norm = np.linalg.norm(c.astype(np.float64), axis=1)
    stored = (U32 if c.dtype == np.float32 else U64) * c_norm
    k, n = xs.shape
    factors = 2 * factor_unit * a_norm * b_norm  # tensor cores round both factors of a term
    expected = U32 * (k + 2) * a_norm * b_norm + factors + stored
    verifier = U64 * (math.sqrt(k) * a_norm * b_norm + math.sqrt(n) * c_norm)
    return TAU * (expected + verifier)


def row_ratios(tmp_path: Path, x: Any, c: Any, std: Standardize, precision: str = "fp32") -> Any:
    job = make_job(tmp_path, x.T.copy(), x, c, transposed=(True, False), precision=precision)
    job = dataclasses.replace(job, standardize=std)
    ref = reference(job)
    checks = [tasks.check_rows(job, rows, ref, 0.0) for rows in blocks(x.shape[1], 4)]
    return np.concatenate([check.ratios for check in checks])


def planted(xs: Any, factor: float) -> Any:
    """X'ᵀX' in float64 with one element of each row off by ``factor`` x its row's tolerance
    (the ±1 vectors give a residual of exactly that size)."""
    c = xs.T @ xs
    off = factor * tolerance(xs, c)
    c[np.arange(N), (np.arange(N) * 5) % N] += off
    return c


@pytest.mark.parametrize("mode", ["center", "scale"])
@pytest.mark.parametrize(
    ("factor", "caught"),
    [
        (1.03, True),  # just over the tolerance: every row fails
        (0.97, False),  # just under: every row passes
        (0.0, False),  # C exact
    ],
)
def test_an_error_just_over_the_standardized_tolerance_is_caught(
    tmp_path: Path, mode: str, factor: float, caught: bool
) -> None:
    rng = np.random.default_rng(11)
    x = (280.0 + 3.0 * rng.standard_normal((K, N))).astype(np.float32)
    std, xs = standardized(x, mode)
    ratios = row_ratios(tmp_path, x, planted(xs, factor), std)
    assert ratios.shape == (N,)
    assert ((ratios > 1.0) == caught).all(), ratios
    if factor:
        np.testing.assert_allclose(ratios, factor, rtol=5e-3)


def test_the_tolerance_grows_with_k_not_its_square_root(tmp_path: Path) -> None:
    """Repeated values (a binary variable) round alike: u·(k + 2), ~2.4 x √k·u at k = 10.
    A C off by 2 x √k·u per row, which an unstandardized check would catch, passes."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 2, (K, N)).astype(np.float32)
    x[0], x[1] = 0.0, 1.0  # every variable varies
    std, xs = standardized(x, "center")
    c = xs.T @ xs
    full = tolerance(xs, c)
    root_k = full * math.sqrt(K) / (K + 2)  # the same with √k in place of k + 2
    c[np.arange(N), np.arange(N)] += 2 * root_k
    ratios = row_ratios(tmp_path, x, c, std)
    np.testing.assert_allclose(ratios, 2 * math.sqrt(K) / (K + 2), rtol=5e-3)
    assert (ratios < 1).all()


def test_each_rows_ratio_is_its_residual_over_the_stated_tolerance(tmp_path: Path) -> None:
    """C stored in float32 (its own rounding allowed too), an error in two rows: every row's
    ratio is max over rounds |C·r − A·(B·r)| / tolerance, as stated."""
    rng = np.random.default_rng(8)
    x = (1.0 + rng.standard_normal((K, N))).astype(np.float32)
    std, xs = standardized(x, "scale")
    c = (xs.T @ xs).astype(np.float32)
    c[1, 4] += np.float32(3e-5)
    c[4, 0] -= np.float32(1e-6)
    job = make_job(tmp_path, x.T.copy(), x, c, transposed=(True, False))
    job = dataclasses.replace(job, standardize=std)
    ref = reference(job)
    got = np.concatenate([tasks.check_rows(job, rows, ref, 0.0).ratios for rows in blocks(N, 4)])
    residual = np.abs(c.astype(np.float64) @ job.r - xs.T @ (xs @ job.r))
    stated = (residual / tolerance(xs, c)[:, None]).max(axis=1)
    np.testing.assert_allclose(got, stated, rtol=1e-6)
    assert got[1] > 1 and (np.delete(got, [1]) < 1).all()


@pytest.mark.parametrize(("factor", "caught"), [(1.03, True), (0.97, False)])
def test_tensor_precision_adds_the_factors_rounding(
    tmp_path: Path, factor: float, caught: bool
) -> None:
    """tf32 rounds both factors of every term (u = 2**-11): 2·u·‖A_i‖·‖B‖ more per row."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((K, N)).astype(np.float32)
    std, xs = standardized(x, "center")
    c = xs.T @ xs
    off = factor * tolerance(xs, c, 2.0**-11)
    c[np.arange(N), np.arange(N)] += off
    ratios = row_ratios(tmp_path, x, c, std, precision="tf32")
    assert ((ratios > 1.0) == caught).all(), ratios
    np.testing.assert_allclose(ratios, factor, rtol=5e-3)


@pytest.mark.parametrize(("factor", "caught"), [(1.03, True), (0.97, False)])
def test_a_kinship_of_one_variant_allows_three_roundings(
    tmp_path: Path, factor: float, caught: bool
) -> None:
    """k = 1 (one variant, X's one row): u·(1 + 2), not less and not more."""
    x = np.array([[0.0, 2.0, 2.0, 0.0, 2.0, 1.0]], dtype=np.float32)  # no sample at 2p
    std = measured(Standardize("kinship", 0), block_moments(x, 0))
    assert std.shift is not None and std.scale is not None
    xs = (x.astype(np.float64) - std.shift[:, None]) * std.scale[:, None]
    c = xs.T @ xs
    c[np.arange(N), np.arange(N)] += factor * tolerance(xs, c)
    ratios = row_ratios(tmp_path, x, c, std)
    assert ((ratios > 1.0) == caught).all(), ratios
    np.testing.assert_allclose(ratios, factor, rtol=5e-3)

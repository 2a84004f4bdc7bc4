"""verify held to its promise: the tolerance it enforces is the one pipeline/verify/check.py states
(an error just above it fails, just below passes, per dtype), and extra rounds do catch errors
that cancel under one random vector, at the rate Freivalds' check gives: a pair +e, −e in one
row escapes a ±1 vector when its two signs agree, probability 1/2, so R rounds miss it with
probability 2⁻ᴿ."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import verify_product
from pipeline.verify.check import SAFETY, TAU, U64
from tests.pipeline.test_verify import matrices, product

COMPUTE = {"float16": "float32", "float32": "float32", "float64": "float64"}
"""The accumulator of each input dtype (float16 sums in float32): u in verify's bound."""
MARGIN = {"float16": 0.02, "float32": 0.02, "float64": 0.15}
"""How close to the bound the planted errors are: float64's own check rounds at about the
bound's scale (its U64 term), float32 and float16 C round far above it."""


def unit(dtype: str) -> float:
    return float(np.finfo(dtype).eps) / 2


def stated_tolerance(a: Any, b: Any, c: Any, noise: float, i: int, dtype: str) -> float:
    """Row i's tolerance as pipeline/verify/check.py's docstring states it:
    TAU·(min(bound_i, noise_i) + verifier_i)."""
    (k, n), a64, c64 = b.shape, a.astype("float64"), c.astype("float64")
    a_norm, b_norm, c_norm = (np.linalg.norm(a64[i]), np.linalg.norm(b.astype("float64")),
                              np.linalg.norm(c64[i]))  # fmt: skip
    stored = unit(dtype) * c_norm
    bound = unit(COMPUTE[dtype]) * np.sqrt(k) * a_norm * b_norm + stored
    measured = SAFETY * noise * a_norm * b_norm + stored
    verifier = U64 * (np.sqrt(k) * a_norm * b_norm + np.sqrt(n) * c_norm)
    return float(TAU * (min(bound, measured) + verifier))


def test_tau_is_the_stated_false_alarm_rate() -> None:
    """TAU's promise (pipeline/verify/tasks.py): a correct row's Gaussian residual passes
    TAU standard deviations about once in 10⁹ rows. The tests below take TAU from the code, so
    this pins what loosening it would break."""
    assert 1e-10 < math.erfc(TAU / math.sqrt(2)) < 1e-8


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_an_error_just_past_the_stated_bound_fails(
    tmp_path: Path, client: Client, dtype: str
) -> None:
    """Row i of A is one 1 among zeros, so row i of C is a row of B with no rounding at all:
    its residual is the planted error alone, measured against the tolerance computed here
    from the documented formula (the other rows are random and set the measured noise)."""
    a, b = matrices("symmetric", 64, 300, 96, dtype, seed=5)
    i, k0 = 37, 11
    a[i], a[i, k0] = 0, 1
    urls = product(tmp_path, client, a, b, chunks=32)
    c = zarr.open_array(urls[2], mode="r+")
    good = c[:]
    np.testing.assert_array_equal(good[i], b[k0])  # exact: nothing to hide an error behind
    clean = verify_product(client, *urls, seed=1)
    assert clean.passed and clean.worst_ratio < 0.5 and clean.noise > 0
    j = int(np.argmin(np.abs(good[i])))  # the smallest element: the planted error stays exact
    margin = MARGIN[dtype]
    for factor, passes in ((1 - margin, True), (1 + margin, False)):
        aim = factor * stated_tolerance(a, b, good, clean.noise, i, dtype)
        c[i, j] = good[i, j].astype("float64") + aim
        planted = c[:]
        error = float(planted[i, j]) - float(good[i, j])
        result = verify_product(client, *urls, seed=1)
        ratio = error / stated_tolerance(a, b, planted, result.noise, i, dtype)
        assert abs(ratio - factor) < margin / 2, (factor, ratio)  # landed where aimed
        assert result.passed is passes, (dtype, ratio, result)
        if not passes:
            assert result.worst_row == i and result.failing_row_blocks == ((32, 64),)
        c[i, j] = good[i, j]


def test_compensating_errors_need_rounds(tmp_path: Path, client: Client) -> None:
    """+e and −e in one row, each over a thousand times the tolerance: one round catches the pair in
    about half the seeds (12 of 24 expected; 5–19 holds with probability 0.998), eight rounds
    in every seed (each misses with probability 1/256)."""
    a, b = matrices("symmetric", 48, 100, 64, "float32", seed=9)
    urls = product(tmp_path, client, a, b, chunks=16)
    c = zarr.open_array(urls[2], mode="r+")
    i, (j1, j2), e = 21, (3, 40), np.float32(2.0**-6)
    c[i, j1], c[i, j2] = c[i, j1] + e, c[i, j2] - e
    caught_once = sum(not verify_product(client, *urls, rounds=1, seed=s).passed for s in range(24))
    assert 5 <= caught_once <= 19, caught_once
    assert caught_once < 24, "one round caught every seed: the errors do not compensate"
    for seed in range(8):
        result = verify_product(client, *urls, rounds=8, seed=seed)
        assert not result.passed and result.worst_row == i, (seed, result)

"""The suite's yardstick: assert_product must fail a product computed in a lower precision than
its dtype claims, and pass every honest one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from tests.helpers import assert_product, product_error_bound, random_matrix


def round_tf32(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """float32 rounded to TF32 (10 stored mantissa bits), to nearest, ties away from zero as
    PTX cvt.rna.tf32.f32 does."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def operands(k: int, dtype: str = "float32", seed: int = 0) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed + k)
    return random_matrix(rng, (48, k), dtype), random_matrix(rng, (k, 40), dtype)


def through_fp16(a: Any, b: Any) -> Any:
    """Inputs rounded to float16, summed in float32 (a half-precision tensor-core product)."""
    return a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(np.float32)


def through_tf32(a: Any, b: Any) -> Any:
    return round_tf32(a) @ round_tf32(b)


def summed_in_fp16(a: Any, b: Any) -> Any:
    """Exact products, a float16 running sum (a kernel with a half accumulator)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for j in range(a.shape[1]):
        acc += np.multiply.outer(a[:, j], b[j]).astype(np.float16)
    return acc


@pytest.mark.parametrize("k", [1, 16, 256, 2048])
@pytest.mark.parametrize(
    ("lower", "precision"),
    [
        (through_fp16, "fp16"),  # inputs through half
        (through_tf32, "tf32"),  # inputs through TF32 (what a TF32 kernel must claim)
    ],
)
def test_lower_precision_fails_fp32_and_passes_its_own(k: int, lower: Any, precision: str) -> None:
    a, b = operands(k)
    got = lower(a, b)
    assert got.dtype == np.float32
    with pytest.raises(AssertionError, match=r"error .* > bound .*fp32"):
        assert_product(got, a, b)
    assert_product(got, a, b, precision=precision)


@pytest.mark.parametrize("k", [16, 256])
def test_half_output_needs_its_own_dtype(k: int) -> None:
    """A float32 product rounded once into float16 passes as float16, fails as float32; one
    summed in float16 fails even as float16 (its error grows with K, not once)."""
    a, b = (x.astype(np.float16) for x in operands(k))
    rounded = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    assert_product(rounded, a, b)
    with pytest.raises(AssertionError, match="> bound"):
        assert_product(rounded.astype(np.float32), a, b, "float32")
    with pytest.raises(AssertionError, match="> bound"):
        assert_product(summed_in_fp16(a, b), a, b)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 9, 64, 1000, 4096])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_honest_products_pass(k: int, dtype: str) -> None:
    """numpy's BLAS and a one-by-one running sum (the CUDA kernels' order) are both within."""
    a, b = operands(k, dtype, seed=1)
    assert_product(a @ b, a, b)
    running = np.zeros((a.shape[0], b.shape[1]), dtype)
    for j in range(k):
        running += np.multiply.outer(a[:, j], b[j])
    assert_product(running, a, b)
    positive = np.abs(a).astype(dtype), np.abs(b).astype(dtype)  # no cancellation
    assert_product(positive[0] @ positive[1], *positive)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_ulp_too_many_is_caught_where_the_bound_is_tight(dtype: str) -> None:
    """K = 1: the bound is a few units of roundoff, so an error a bit above it fails and one a
    bit below passes (the tolerance is not K-linear slack)."""
    a, b = operands(1, dtype, seed=2)
    want = a.astype("float64") @ b.astype("float64")
    bound = product_error_bound(a, b, dtype)
    assert (bound <= 4 * np.finfo(dtype).eps * np.abs(a) @ np.abs(b) + 1e-300).all()
    assert_product((want + 0.5 * bound).astype(dtype), a, b)
    with pytest.raises(AssertionError, match="> bound"):
        assert_product((want + 3 * bound).astype(dtype), a, b)


def test_integers_are_exact() -> None:
    a, b = operands(5, "int32")
    got = a @ b
    assert_product(got, a, b)
    got[0, 0] += 1
    with pytest.raises(AssertionError):
        assert_product(got, a, b)


def test_extreme_integers_mixed_with_floats() -> None:
    """|int16 -32768| overflows in int16: the bound must take it in float64."""
    a = np.full((3, 4), np.iinfo(np.int16).min, np.int16)
    b = np.linspace(0.1, 1, 20).reshape(4, 5).astype(np.float32)
    got = (a.astype(np.float64) @ b).astype(np.float32)
    assert_product(got, a, b)
    with pytest.raises(AssertionError, match="> bound"):
        assert_product(got * np.float32(1 + 2**-18), a, b)

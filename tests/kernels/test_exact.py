"""Exact integer products through float BLAS: kernels.exact's choices (pure), and
CpuAccumulator's exact route bit for bit against numpy's integer products, in every K-block
regime, including a block one longer than allowed, which must really round."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernels import exact
from kernels.cpu import CpuAccumulator
from kernels.exact import UNLIMITED, k_block, panel_dtype, plan_blocks, product_dtype

Plan = tuple[str, int]
Call = tuple[Plan, int]
TOP = 2**26 - 1
"""TOP·TOP is odd and just under 2**52: two such products sum exactly in float64, three don't."""


@pytest.mark.parametrize(
    ("a", "b", "acc", "want"),
    [
        ("int8", "int8", "int32", "float32"),
        ("uint8", "int8", "int64", "float32"),
        ("bool", "bool", "bool", "float32"),  # bool into bool: OR of ANDs, from a float product
        ("bool", "int16", "int64", "float32"),
        ("int16", "int16", "int64", "float32"),  # 2**15 <= 2**24: float32 holds every value
        ("uint16", "uint16", "uint64", "float32"),
        ("int32", "int8", "int64", "float64"),  # 2**31 > 2**24: float64
        ("uint32", "uint32", "uint64", "float64"),
        ("int64", "int8", "int64", "int64"),  # no float holds 2**63: numpy's integer product
        ("uint64", "uint64", "uint64", "uint64"),
        ("int8", "int8", "float64", "float64"),  # a float accumulator: its own dtype
        ("int8", "float32", "int32", "int32"),  # a float input: the accumulator's dtype
    ],
)
def test_panel_dtype(a: str, b: str, acc: str, want: str) -> None:
    assert panel_dtype(a, b, acc) == want


@pytest.mark.parametrize(
    ("a", "b", "acc", "want"),
    [
        ("int8", "int8", "int32", "float32"),  # 128·128: blocks of 1023
        ("uint8", "uint8", "uint32", "float32"),  # 255·255: blocks of 258, just over 256
        ("bool", "int8", "int16", "float32"),
        ("int8", "int16", "int64", "float64"),  # 2**7·2**15: blocks of 3, too short for float32
        ("uint16", "uint16", "uint64", "float64"),  # one product may reach 2**32
        ("int32", "int32", "int64", "float64"),
        ("int64", "int64", "int64", "int64"),  # the planner models this one ~60x slower
        ("int8", "int8", "float32", "float32"),
    ],
)
def test_product_dtype(a: str, b: str, acc: str, want: str) -> None:
    assert product_dtype(a, b, acc) == want


@pytest.mark.parametrize(
    ("dtype", "a_max", "b_max", "want"),
    [
        ("float32", 128, 128, 1023),
        ("float32", 255, 255, 258),
        ("float32", 2047, 2047, 4),
        ("float32", 4096, 4096, 0),  # 2**24 itself: not one product below it
        ("float32", 1, 1, 2**24 - 1),
        ("float64", 2**15, 2**15, 2**23 - 1),
        ("float64", TOP, TOP, 2),
        ("float64", 2**31, 2**31, 0),
    ],
)
def test_k_block_is_the_longest_block_below_the_significand(
    dtype: str, a_max: int, b_max: int, want: int
) -> None:
    """k·|a|·|b| stays below 2**bits; one more term would reach it."""
    k, top, limit = k_block(dtype, a_max, b_max), a_max * b_max, 2 ** exact.SIGNIFICAND_BITS[dtype]
    assert k == want
    assert k * top < limit <= (k + 1) * top


def test_k_block_of_a_zero_panel_is_unlimited() -> None:
    assert k_block("float32", 0, 127) == k_block("float64", 2**31, 0) == UNLIMITED


@pytest.mark.parametrize(
    ("dtype", "value"),
    [
        ("float32", 2047),  # 4 terms of 2047² sum to 16,760,836; 5 to 20,951,045 (odd > 2**24)
        ("float32", 255),  # 258 terms exact, 259 sum to 16,841,475
        ("float64", TOP),  # 2 terms exact, 3 sum to an odd number > 2**53
    ],
)
def test_a_block_one_longer_really_rounds(dtype: str, value: int) -> None:
    """The boundary is real, not a margin: BLAS's own sum of k_block terms is exact, of one more
    it is not (the values are odd, so the sum is odd past 2**bits)."""
    k = k_block(dtype, value, value)
    for terms, exact_sum in ((k, True), (k + 1, False)):
        row, col = np.full((1, terms), value, dtype), np.full((terms, 1), value, dtype)
        assert (int((row @ col)[0, 0]) == terms * value * value) is exact_sum


@pytest.mark.parametrize(
    ("dtype", "value", "k", "want"),
    [
        ("float32", 127, 1000, ("float32", 1040)),  # |-128| unseen: the panels' own max
        ("float32", 255, 1000, ("float32", 258)),
        ("float32", 2047, 4, ("float32", 4)),  # one block of all K: float32 however short
        ("float32", 2047, 5, ("float64", (2**53 - 1) // 2047**2)),  # blocks of 4 < 256: float64
        ("float32", 0, 1000, ("float32", UNLIMITED)),
        ("float64", 3, 1000, ("float64", (2**53 - 1) // 9)),  # float64 panels stay float64
        ("float64", TOP, 6, ("float64", 2)),
        ("float64", 2**31 - 1, 2, None),  # past 2**53 in one product: integers only
    ],
)
def test_plan_blocks(dtype: str, value: int, k: int, want: Plan | None) -> None:
    a = np.full((3, k), value, dtype)
    a[0, ::2] *= -1  # |values|, both signs
    assert plan_blocks(a, np.full((k, 2), value, dtype)) == want


def test_plan_blocks_takes_the_larger_of_both_signs() -> None:
    """|-2048| over 2047: blocks of 4 would be exact at 2047 only (then float32 over K = 4)."""
    a = np.zeros((1, 300), "float32")
    a[0, :2] = -2048, 1
    want = ("float64", (2**53 - 1) // (2048 * 2047))
    assert plan_blocks(a, np.full((300, 1), 2047, "float32")) == want


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """((float dtype, K block), K) of each exact output block CpuAccumulator computes from
    now on; the dtype is "" for numpy's integer product."""
    seen: list[Call] = []
    original = CpuAccumulator._exact_block

    def recording(self: CpuAccumulator, plan: Plan, a: Any, *args: Any) -> None:
        seen.append((plan, a.shape[1]))
        original(self, plan, a, *args)

    monkeypatch.setattr(CpuAccumulator, "_exact_block", recording)
    return seen


def values(rng: np.random.Generator, shape: tuple[int, int], dtype: str, spread: str) -> Any:
    """Integers of ``dtype``: its full range ("full"), or small ones of both signs ("small")."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    info = np.iinfo(dtype)
    if spread == "small":
        return rng.integers(max(int(info.min), -9), 10, shape).astype(dtype)
    return rng.integers(int(info.min), int(info.max), shape, endpoint=True).astype(dtype)


def numpy_product(a: Any, b: Any, acc: str) -> Any:
    """numpy's integer product in the accumulator's dtype (int64: no 8-bit wrap)."""
    return a.astype(acc) @ b.astype(acc)


def accumulate(
    acc_dtype: str, a: Any, b: Any, panels: int = 3, block: tuple[int, int] = (5, 4), **kw: Any
) -> Any:
    """acc += a @ b over ``panels`` K panels of unequal width, in 5 x 4 blocks."""
    acc = CpuAccumulator((a.shape[0], b.shape[1]), acc_dtype, block, **kw)
    cuts = [0, *sorted({a.shape[1] * p // panels + p % 2 for p in range(1, panels)}), a.shape[1]]
    for k0, k1 in zip(cuts, cuts[1:], strict=False):
        acc.add(a[:, k0:k1], b[k0:k1])
    return acc.result()


@pytest.mark.parametrize(
    ("dtype", "spread", "k", "acc", "regime"),
    [
        ("int8", "full", 6000, "int64", "float32 blocks"),  # K panels of 2000, blocks of 1023
        ("int8", "small", 300, "int64", "float32"),
        ("uint8", "full", 1800, "int64", "float32 blocks"),  # panels of 600 in blocks of 258
        ("uint8", "small", 300, "int64", "float32"),
        ("int16", "full", 300, "int64", "float64"),  # one product up to 2**30
        ("int16", "small", 300, "int64", "float32"),  # the panels' values decide, not dtypes
        ("uint16", "full", 300, "int64", "float64"),
        ("uint16", "small", 300, "int64", "float32"),
        ("int32", "full", 2, "int64", "integers"),  # 2**62 a product: numpy's integers
        ("int32", "small", 300, "int64", "float64"),  # float64 panels: float64
        ("uint32", "full", 1, "uint64", "integers"),  # (2**32 - 1)**2: uint64 holds one
        ("uint32", "small", 300, "int64", "float64"),
        ("bool", "", 300, "int64", "float32"),  # path counts
        ("bool", "", 300, "int16", "float32"),
        ("bool", "", 300, "bool", "float32"),  # numpy's bool matmul: OR of ANDs
    ],
)
@pytest.mark.parametrize("given", ["integers", "floats"])  # as stored, or as the pipeline reads
def test_exact_route_is_numpys_integer_product(
    plans: list[Call], dtype: str, spread: str, k: int, acc: str, regime: str, given: str
) -> None:
    rng = np.random.default_rng(k + len(dtype))
    a, b = values(rng, (13, k), dtype, spread), values(rng, (k, 11), dtype, spread)
    if dtype == "int32" and spread == "full":  # two products of (-2**31)**2 would wrap int64
        a[a == -(2**31)] = 0
    if given == "floats":
        panels = panel_dtype(dtype, dtype, acc)
        a, b = a.astype(panels), b.astype(panels)
    want = numpy_product(a, b, acc)
    got = accumulate(acc, a, b)
    assert got.dtype == np.dtype(acc)
    np.testing.assert_array_equal(got, want)
    assert_regime(plans, regime)


def assert_regime(plans: list[Call], regime: str) -> None:
    """Every output block ran in ``regime``: "float32"/"float64" one block per K panel,
    "float32 blocks" several blocks of at least 256 per panel, "integers" numpy's integer
    product."""
    assert plans, "the exact route was not taken"
    assert {dtype for (dtype, _), _ in plans} == {regime.split()[0].replace("integers", "")}
    if regime == "float32 blocks":
        assert all(256 <= step < width for (_, step), width in plans)
    elif regime != "integers":
        assert all(step >= width for (_, step), width in plans)


def test_many_float64_blocks_are_exact(plans: list[Call]) -> None:
    """Values up to 2**20 in float64: blocks of 8191 over K = 20,000, each added into int64."""
    rng = np.random.default_rng(5)
    a = rng.integers(-(2**20), 2**20, (6, 20_000), endpoint=True).astype("int32")
    b = rng.integers(-(2**20), 2**20, (20_000, 5), endpoint=True).astype("int32")
    a[0, 0], b[0, 0] = -(2**20), 2**20
    np.testing.assert_array_equal(accumulate("int64", a, b, panels=1), numpy_product(a, b, "int64"))
    assert {plan for plan, _ in plans} == {("float64", (2**53 - 1) // 2**40)}


def float32_near_the_limit() -> tuple[Any, Any]:
    """255s over K = 1000 (blocks of 258, and of 259 one longer: a sum of 16,841,475, odd)."""
    a = np.full((3, 1000), 255, "uint8")
    a[1, 500:] = 3  # rows of other sums beside it
    return a, np.full((1000, 2), 255, "uint8")


def float64_near_the_limit() -> tuple[Any, Any]:
    """TOP in int32 (blocks of 2, and of 3 one longer: TOP·TOP·3 is odd past 2**53); the signs
    keep the running sum below 2**53, so only the blocks' own sums can round."""
    a = np.array([[TOP, TOP, TOP, -TOP, -TOP, 0]], "int32")
    return a, np.full((6, 1), TOP, "int32")


@pytest.mark.parametrize("case", [float32_near_the_limit, float64_near_the_limit])
def test_a_block_one_longer_than_k_block_is_caught(
    monkeypatch: pytest.MonkeyPatch, case: Any
) -> None:
    """The check above is not blind: with K blocks one longer than kernels.exact allows, the
    same comparison with numpy fails."""
    a, b = case()
    want = numpy_product(a, b, "int64")
    np.testing.assert_array_equal(accumulate("int64", a, b, panels=1), want)
    original = exact.k_block
    monkeypatch.setattr(exact, "k_block", lambda *args: original(*args) + 1)
    assert not np.array_equal(accumulate("int64", a, b, panels=1), want)


@pytest.mark.parametrize(
    ("dtype", "spread", "acc"),
    [
        ("int8", "full", "int64"),  # float32 (the second K panel in 2 blocks), ?syrk
        ("int16", "full", "int64"),  # float64
        ("int32", "full", "int64"),  # numpy's integers
        ("bool", "", "bool"),
    ],
)
@pytest.mark.parametrize("bands", [[(0, 17)], [(0, 5), (5, 15), (15, 17)]])
def test_upper_tiles_hold_the_gram_upper_triangle(
    plans: list[Call], dtype: str, spread: str, acc: str, bands: list[tuple[int, int]]
) -> None:
    """A Gram product's diagonal tile (X·Xᵀ, Xᵀ a transposed view), band by band over two K
    panels: the upper triangle is numpy's, bit for bit."""
    rng = np.random.default_rng(3)
    k = 2 if dtype == "int32" else 3000
    x = values(rng, (17, k), dtype, spread)
    if dtype == "int32":  # two squares of -2**31 would wrap int64
        x[x == -(2**31)] = 0
    got = CpuAccumulator((17, 17), acc, (5, 5), upper=True)
    for k0, k1 in ((0, k // 3), (k // 3, k)):
        for r0, r1 in bands:
            got.add(x[r0:r1, k0:k1], x[:, k0:k1].T, rows=(r0, r1))
    np.testing.assert_array_equal(np.triu(got.result()), np.triu(numpy_product(x, x.T, acc)))
    assert plans


@pytest.mark.parametrize(
    ("dtype", "acc"), [("int8", "int32"), ("int16", "int64"), ("bool", "bool")]
)
def test_transposed_views_and_bands(dtype: str, acc: str) -> None:
    """Panels read transposed (views of K-major blocks) into bands of block rows: numpy's
    product, bit for bit, as the C-ordered panels give."""
    rng = np.random.default_rng(8)
    a_stored, b_stored = values(rng, (700, 23), dtype, "full"), values(rng, (9, 700), dtype, "full")
    a, b = a_stored.T, b_stored.T  # (23, 700) and (700, 9), neither C-ordered
    got = CpuAccumulator((23, 9), acc, (5, 4))
    for r0, r1 in ((0, 10), (10, 20), (20, 23)):
        got.add(a[r0:r1], b, rows=(r0, r1))
    np.testing.assert_array_equal(got.result(), numpy_product(a, b, acc))


@pytest.mark.parametrize("panels", [1, 3])
def test_an_int64_accumulator_past_2_53_stays_exact(panels: int) -> None:
    """Each block is exact (TOP² < 2**52), but their running sum passes 2**53: the addition
    into the int64 accumulator must be an integer one. int16 @ int32 into int64 over K below
    2**17 is a product the planner allows, with sums up to 2**63."""
    a = np.array([[TOP, TOP, 1, TOP, TOP, TOP]], "int32")
    b = np.array([[TOP], [TOP], [1], [TOP], [TOP], [TOP]], "int32")
    want = numpy_product(a, b, "int64")
    assert int(want[0, 0]) == 5 * TOP * TOP + 1 > 2**53
    np.testing.assert_array_equal(accumulate("int64", a, b, panels=panels), want)

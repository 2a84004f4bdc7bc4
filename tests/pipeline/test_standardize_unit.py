"""pipeline.plan.standardize, pure: per-block moments merged by Chan's formulas against numpy's
mean and variance, the in-place standardization of blocks at offsets, a correlation's tile
finish, and the refusals, against float64 numpy."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import InputError, UsageError
from pipeline.plan.standardize import (
    MAX_STORED,
    Moments,
    Standardize,
    block_moments,
    from_record,
    measured,
    merge,
    output_dtype,
    parse_ddof,
    requested,
)

# ---------------------------------------------------------------------------------------------
# Moments: block_moments + merge (Chan, Golub and LeVeque)


def kelvin(rng: np.random.Generator, shape: tuple[int, int]) -> Any:
    """Temperatures: a large mean (280) and a small spread (3), where a naive Σx² − n·mean²
    loses every digit in float32."""
    return 280.0 + 3.0 * rng.standard_normal(shape)


def cut(x: Any, edges: list[int], axis: int) -> list[Any]:
    """x cut along the summed axis (rows for ``axis`` 1, columns for 0) at ``edges``."""
    bounds = [0, *edges, x.shape[1 - axis]]
    if axis == 1:
        return [x[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return [x[:, a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def fold(parts: list[Moments], shape: str) -> Moments:
    """The parts merged in a tree of ``shape``: left, right, balanced (as pipeline.run.moments
    pairs them) or alternating."""
    if shape == "left":
        total = parts[0]
        for p in parts[1:]:
            total = merge(total, p)
        return total
    if shape == "right":
        total = parts[-1]
        for p in reversed(parts[:-1]):
            total = merge(p, total)
        return total
    if shape == "balanced":
        while len(parts) > 1:
            pairs = [merge(p, q) for p, q in zip(parts[::2], parts[1::2], strict=False)]
            parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
        return parts[0]
    mid = len(parts) // 2  # "split": each half folded from its outside in
    if mid == 0:
        return parts[0]
    return merge(fold(parts[:mid], "right"), fold(parts[mid:], "left"))


def assert_moments(got: Moments, x: Any, axis: int) -> None:
    """got == numpy's over x's summed axis, to ~1e-12 relative."""
    summed = 0 if axis == 1 else 1
    assert got.count == x.shape[summed]
    np.testing.assert_allclose(got.mean, x.mean(axis=summed), rtol=1e-13, atol=0)
    np.testing.assert_allclose(
        got.m2, x.var(axis=summed) * x.shape[summed], rtol=1e-11, atol=1e-300
    )
    np.testing.assert_array_equal(got.low, x.min(axis=summed))
    np.testing.assert_array_equal(got.high, x.max(axis=summed))
    np.testing.assert_array_equal(got.nonfinite, np.zeros(x.shape[1 - summed], np.int64))


@pytest.mark.parametrize("tree", ["left", "right", "balanced", "split"])
@pytest.mark.parametrize(
    ("edges", "axis"),
    [
        ([1], 1),  # one row, then the rest
        ([7, 8, 30, 31, 90], 1),  # uneven: 7, 1, 22, 1, 59, 11
        ([50, 50, 77], 1),  # an empty block between two others
        ([3, 17, 40, 41], 0),  # per row: the columns cut unevenly
        ([], 0),  # one block
    ],
)
def test_merged_block_moments_are_numpys(edges: list[int], axis: int, tree: str) -> None:
    rng = np.random.default_rng(len(edges) + axis)
    x = kelvin(rng, (101, 13) if axis == 1 else (13, 101)).astype(np.float32)
    parts = [block_moments(b, axis) for b in cut(x, edges, axis)]
    assert_moments(fold(parts, tree), x.astype(np.float64), axis)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 5),
    data=st.data(),
    axis=st.sampled_from([0, 1]),
    tree=st.sampled_from(["left", "right", "balanced", "split"]),
)
def test_any_split_and_tree_gives_numpys_moments(
    rows: int, cols: int, data: st.DataObject, axis: int, tree: str
) -> None:
    summed = rows if axis == 1 else cols * 8
    edges = sorted(data.draw(st.lists(st.integers(0, summed), max_size=8)))
    rng = np.random.default_rng(rows * 100 + cols)
    x = kelvin(rng, (summed, cols) if axis == 1 else (cols, summed))
    parts = [block_moments(b, axis) for b in cut(x, edges, axis)]
    assert_moments(fold(parts, tree), x, axis)


def test_non_finite_values_are_counted_per_variable_and_left_out() -> None:
    x = np.arange(24, dtype=np.float64).reshape(6, 4)
    x[1, 2], x[4, 2], x[0, 0] = np.nan, np.inf, -np.inf
    total = merge(block_moments(x[:2], 1), block_moments(x[2:], 1))
    np.testing.assert_array_equal(total.nonfinite, [1, 0, 1, 0])  # ±inf
    np.testing.assert_array_equal(total.absent, [0, 0, 1, 0])  # NaN: missing
    np.testing.assert_array_equal(total.present, [5, 6, 4, 6])
    assert total.mean[2] == np.mean([2.0, 10, 14, 22])  # each variable over its own values
    assert np.isfinite(total.mean).all() and np.isfinite(total.m2).all()
    assert np.isfinite(total.low).all() and np.isfinite(total.high).all()


# ---------------------------------------------------------------------------------------------
# Standardize.apply: blocks at offsets, in both axes


def with_moments(std: Standardize, variables: int, seed: int = 0) -> Standardize:
    rng = np.random.default_rng(seed)
    shift = rng.uniform(270, 290, variables)
    scale = rng.uniform(0.1, 2.0, variables)
    return replace(std, shift=shift, scale=scale, count=7, used=variables)


@pytest.mark.parametrize(
    ("axis", "shape", "rows", "cols"),
    [
        (1, (40, 30), (0, 40), (0, 30)),  # the whole of X
        (1, (40, 30), (13, 27), (11, 30)),  # a ragged corner block: columns 11..29
        (0, (40, 30), (21, 40), (3, 17)),  # per row: rows 21..39
        (1, (300_000, 4), (0, 300_000), (0, 4)),  # several slabs (2**20 elements each)
        (0, (300_000, 4), (0, 300_000), (0, 4)),  # several slabs, a shift per row
    ],
)
def test_apply_standardizes_the_block_at_its_offset(
    axis: int, shape: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]
) -> None:
    std = with_moments(Standardize("center", axis), shape[1] if axis == 1 else shape[0])
    rng = np.random.default_rng(1)
    x = kelvin(rng, shape).astype(np.float32)
    block = x[rows[0] : rows[1], cols[0] : cols[1]].copy()
    std.apply(block, rows, cols)
    assert std.shift is not None and std.scale is not None
    lo, hi = cols if axis == 1 else rows
    shift, scale = std.shift[lo:hi], std.scale[lo:hi]
    if axis == 0:
        shift, scale = shift[:, None], scale[:, None]
    want = (x[rows[0] : rows[1], cols[0] : cols[1]].astype(np.float64) - shift) * scale
    # computed in float64 and rounded once: exactly numpy's float64 result, rounded
    np.testing.assert_array_equal(block, want.astype(np.float32))


def test_apply_in_float64_keeps_the_digits_float32_arithmetic_loses() -> None:
    """280.1 − 280.0999 in float32 would be 0 or 3e-5 off; float64 first, then rounded, is
    within one float32 rounding of the true value."""
    std = replace(
        Standardize("center", 1),
        shift=np.array([280.0999]),
        scale=np.array([1.0]),
    )
    block = np.array([[280.1], [280.0]], dtype=np.float32)
    want = (block.astype(np.float64) - 280.0999).astype(np.float32)
    std.apply(block, (0, 2), (0, 1))
    np.testing.assert_array_equal(block, want)


def test_apply_with_a_constant_variables_nan_scale_gives_nan_silently() -> None:
    std = replace(
        Standardize("scale", 1), shift=np.array([1.0, 2.0]), scale=np.array([np.nan, 0.5])
    )
    block = np.array([[1.0, 4.0], [1.0, 0.0]])
    std.apply(block, (0, 2), (0, 2))  # warnings are errors here: none may be raised
    assert np.isnan(block[:, 0]).all()
    np.testing.assert_array_equal(block[:, 1], [1.0, -1.0])


def test_apply_refuses_before_the_moments_are_measured() -> None:
    with pytest.raises(ValueError, match="not measured yet"):
        Standardize("center", 1).apply(np.zeros((2, 2)), (0, 2), (0, 2))


# ---------------------------------------------------------------------------------------------
# Standardize.finish: a correlation's tile


@pytest.mark.parametrize(
    ("row0", "col0", "shape"),
    [
        (0, 0, (6, 6)),  # a tile on the diagonal
        (12, 12, (5, 5)),  # the ragged last diagonal tile
        (10, 5, (8, 12)),  # rectangular, crossing the diagonal at 10..16
        (5, 10, (12, 8)),  # its mirror
        (0, 12, (6, 5)),  # above the diagonal: no diagonal element
        (12, 0, (5, 6)),  # below it
        (3, 3, (1, 1)),  # one element, on the diagonal
        (0, 0, (0, 0)),  # empty
    ],
)
def test_finish_sets_only_the_global_diagonal_and_clips(
    row0: int, col0: int, shape: tuple[int, int]
) -> None:
    rng = np.random.default_rng(row0 * 31 + col0)
    tile = rng.uniform(-1.5, 1.5, shape)
    tile[tile.shape[0] // 2 :, :1] = np.nan  # NaN rows: a constant variable's
    before = tile.copy()
    Standardize("scale", 1).finish(tile, row0, col0)
    i, j = np.indices(shape)
    on_diagonal = (i + row0) == (j + col0)
    want = np.clip(before, -1.0, 1.0)
    want[on_diagonal & ~np.isnan(before)] = 1.0
    np.testing.assert_array_equal(tile, want)
    assert on_diagonal.any() == (row0 < col0 + shape[1] and col0 < row0 + shape[0])


@pytest.mark.parametrize("mode", ["center", "kinship"])
def test_finish_leaves_a_covariance_and_a_kinship_alone(mode: str) -> None:
    """A kinship's diagonal is 1 + F (above 1 for inbred samples); a covariance is not
    bounded: neither is clipped nor given a unit diagonal."""
    tile = np.array([[1.7, -2.5], [0.3, 0.8]])
    before = tile.copy()
    Standardize(mode, 1).finish(tile, 0, 0)
    np.testing.assert_array_equal(tile, before)


# ---------------------------------------------------------------------------------------------
# requested(): the options as a Standardize, or refused


@pytest.mark.parametrize(
    ("center", "scale", "kinship", "ddof", "rows", "want"),
    [
        (False, False, False, None, False, None),  # a plain Gram product
        (True, False, False, None, False, ("center", 1, 1)),  # XᵀX: the columns are variables
        (True, False, False, None, True, ("center", 0, 1)),  # X Xᵀ: the rows are
        (True, False, False, 0, False, ("center", 1, 0)),
        (True, False, False, 5, True, ("center", 0, 5)),
        (False, True, False, None, False, ("scale", 1, 1)),
        (True, True, False, None, True, ("scale", 0, 1)),  # --scale implies --center
        (False, False, True, None, True, ("kinship", 1, 1)),  # samples x variants: per column
        (False, False, True, None, False, ("kinship", 0, 1)),  # variants x samples: per row
    ],
)
def test_requested(
    center: bool,
    scale: bool,
    kinship: bool,
    ddof: int | None,
    rows: bool,
    want: tuple[str, int, int] | None,
) -> None:
    got = requested(center, scale, kinship, ddof, rows)
    assert (None if got is None else (got.mode, got.axis, got.ddof)) == want


@pytest.mark.parametrize(
    ("center", "scale", "kinship", "ddof", "match"),
    [
        (True, False, True, None, r"^--kinship centres each variant itself; drop --center"),
        (False, True, True, None, r"^--kinship centres"),
        (False, False, False, 1, r"^--ddof sets --center's divisor n − ddof; add --center"),
        (False, False, True, 0, r"^--ddof sets --center's divisor"),
        (True, False, False, -1, r"^--ddof takes a whole number >= 0 .*; got -1$"),
        (True, False, False, 1.5, r"got 1\.5$"),
        (True, False, False, True, r"got True$"),
    ],
)
def test_requested_refuses(center: bool, scale: bool, kinship: bool, ddof: Any, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        requested(center, scale, kinship, ddof, rows=False)


def test_parse_ddof() -> None:
    assert parse_ddof("5") == 5
    with pytest.raises(UsageError, match=r"^--ddof takes a whole number >= 0, e.g. 1; got 'x'$"):
        parse_ddof("x")


@pytest.mark.parametrize(
    ("x_dtype", "asked", "want"),
    [
        ("float32", None, "float32"),
        ("float64", None, "float64"),
        ("float16", None, "float32"),
        ("int8", None, "float32"),  # genotypes
        ("uint16", None, "float32"),
        ("int8", "float64", "float64"),
        ("float64", "float32", "float32"),
    ],
)
def test_output_dtype(x_dtype: str, asked: str | None, want: str) -> None:
    assert output_dtype(Standardize("center", 1), x_dtype, asked) == want


def test_output_dtype_refuses_integers_and_complex_data() -> None:
    with pytest.raises(UsageError, match=r"^--dtype int32: a covariance is not whole numbers"):
        output_dtype(Standardize("center", 1), "float32", "int32")
    with pytest.raises(UsageError, match=r"^--dtype int64: a kinship is not whole numbers"):
        output_dtype(Standardize("kinship", 1), "int8", "int64")
    with pytest.raises(InputError, match=r"^--scale takes real data; X is complex64$"):
        output_dtype(Standardize("scale", 1), "complex64", None)


# ---------------------------------------------------------------------------------------------
# measured(): shifts, scales and counts from the moments; refusals


def moments_of(x: Any, axis: int) -> Moments:
    return block_moments(np.asarray(x, dtype=np.float64), axis)


@pytest.mark.parametrize("ddof", [0, 1, 5])
def test_measured_center(ddof: int) -> None:
    x = kelvin(np.random.default_rng(ddof), (9, 4))
    std = measured(Standardize("center", 1, ddof), moments_of(x, 1))
    assert std.shift is not None and std.scale is not None
    np.testing.assert_allclose(std.shift, x.mean(axis=0), rtol=1e-14)
    np.testing.assert_array_equal(std.scale, np.full(4, 1 / math.sqrt(9 - ddof)))
    assert (std.count, std.used, std.constant) == (9, 4, 0)
    record = std.record()
    assert record == {
        "mode": "center", "axis": "columns", "ddof": ddof, "count": 9, "divisor": 9 - ddof,
        "digest": std.digest(),
    }  # fmt: skip
    z = (x - std.shift) * std.scale
    np.testing.assert_allclose(z.T @ z, np.cov(x, rowvar=False, ddof=ddof), rtol=1e-12)


@pytest.mark.parametrize("ddof", [9, 10])
def test_measured_center_refuses_a_ddof_that_leaves_no_divisor(ddof: int) -> None:
    with pytest.raises(UsageError, match=rf"^--ddof {ddof} leaves no divisor: each variable has 9"):
        measured(Standardize("center", 0, ddof), moments_of(np.ones((4, 9)), 0))


def test_measured_scale_gives_a_constant_variable_nan() -> None:
    x = kelvin(np.random.default_rng(3), (12, 5))
    x[:, 2] = 281.5
    std = measured(Standardize("scale", 1), moments_of(x, 1))
    assert std.scale is not None and std.shift is not None
    assert np.isnan(std.scale[2]) and np.isfinite(np.delete(std.scale, 2)).all()
    assert std.constant == 1 and std.record()["constant"] == 1 and "ddof" not in std.record()
    z = (x - std.shift) * std.scale
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.corrcoef(x, rowvar=False)
    np.testing.assert_allclose(z.T @ z, want, rtol=1e-12, atol=1e-14)  # NaN where numpy's is


def test_measured_kinship_leaves_monomorphic_variants_out() -> None:
    """Variants are rows here (axis 0, X variants x samples): all 0s, all 2s are left out of
    G and of m; all 1s (p = 0.5: every sample heterozygous) stay in, with p in (0, 1)."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 3, (10, 6)).astype(np.int8)
    x[2], x[5], x[7] = 0, 2, 1
    std = measured(Standardize("kinship", 0), moments_of(x, 0))
    assert std.scale is not None and std.shift is not None
    p = x.mean(axis=1) / 2
    varies = (p > 0) & (p < 1)
    m = int(varies.sum())
    assert not varies[2] and not varies[5] and varies[7]
    assert (std.used, std.constant, std.count) == (m, 10 - m, 6)
    np.testing.assert_array_equal(std.scale[~varies], 0.0)
    np.testing.assert_allclose(std.shift, 2 * p, rtol=1e-15)
    np.testing.assert_allclose(std.scale[varies], 1 / np.sqrt(2 * p * (1 - p) * m)[varies])
    assert std.record() | {"digest": ""} == {
        "mode": "kinship", "axis": "rows", "count": 6, "variants_used": m,
        "monomorphic": 10 - m, "digest": "", "form": "standardized",
    }  # fmt: skip
    stored = std.stored()
    assert stored is not None and set(stored) == {"tilegemm_mean", "tilegemm_scale"}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (3, r"variant row 1 holds values from 0 to 3; if a value marks a missing call"),
        (-1, r"variant row 1 holds values from -1 to 1"),
        (np.nan, r"^X holds 1 NaN value\(s\) in 1 row\(s\) \(the first in row 1\); --kinship"),
    ],
)
def test_measured_kinship_refuses_values_that_are_not_dosages(value: float, match: str) -> None:
    x = np.array([[0, 1, 2], [1, 2, 0], [2, 2, 1]], dtype=np.float64)
    x[1, 1] = value
    with pytest.raises(InputError, match=match):
        measured(Standardize("kinship", 0), moments_of(x, 0))


def test_measured_kinship_refuses_when_no_variant_varies() -> None:
    x = np.array([[0, 0, 0], [2, 2, 2]], dtype=np.float64)
    with pytest.raises(InputError, match=r"^--kinship: no variant of X has both alleles"):
        measured(Standardize("kinship", 0), moments_of(x, 0))


def test_measured_refuses_non_finite_values() -> None:
    x = np.ones((4, 3))
    x[2, 1] = np.inf
    with pytest.raises(
        InputError, match=r"^X holds 1 infinite value\(s\) \(the first in column 1\); --center"
    ):
        measured(Standardize("center", 1), moments_of(x, 1))


def test_stored_moments_only_up_to_max_stored() -> None:
    few = replace(Standardize("center", 1), shift=np.zeros(3), scale=np.ones(3))
    assert few.stored() == {"tilegemm_mean": [0.0, 0.0, 0.0], "tilegemm_scale": [1.0, 1.0, 1.0]}
    many = replace(few, shift=np.zeros(MAX_STORED + 1), scale=np.ones(MAX_STORED + 1))
    assert many.stored() is None and Standardize("center", 1).stored() is None


def test_record_round_trip_and_digest() -> None:
    std = measured(Standardize("center", 0, 3), moments_of(np.arange(20.0).reshape(4, 5), 0))
    again = from_record(std.record())
    assert (again.mode, again.axis, again.ddof) == ("center", 0, 3)
    assert std.shift is not None
    assert std.digest() != replace(std, shift=std.shift + 1e-12).digest()
    assert Standardize("scale", 1).record() == {"mode": "scale", "axis": "columns"}
    with pytest.raises(ValueError, match="no standardization"):
        from_record({"mode": "whiten", "axis": "rows"})

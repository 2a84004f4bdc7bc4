"""pipeline.plan.standardize, the edges test_standardize_unit.py leaves open: the refusals' whole
words, the plan's line for each standardization, a record written by another run read back
(its digest, its axis, its default ddof), the smallest divisor and spread that are answers, and
a panel standardized in slabs, never as one float64 copy (benchmarks/mutate.py, target
standardize)."""

from __future__ import annotations

import hashlib
import re
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from pipeline.errors import InputError, UsageError
from pipeline.plan.standardize import (
    MAX_STORED,
    Standardize,
    block_moments,
    describe,
    from_record,
    measured,
    output_dtype,
    requested,
)


def whole(pattern: str) -> str:
    """A message matched from its first word to its last."""
    return "^" + re.escape(pattern) + "$"


# ---------------------------------------------------------------------------------------------
# The refusals, word for word: each says what is wrong and what to do instead


@pytest.mark.parametrize(
    ("center", "scale", "kinship", "ddof", "message"),
    [
        (True, False, True, None, "--kinship centres each variant itself; drop --center "
         "and --scale (they standardize the variables G is indexed by: a covariance or "
         "correlation)"),
        (False, True, False, 1, "--ddof has no effect on a correlation (the divisor cancels, "
         "as in np.corrcoef); drop --ddof, or use --center for a covariance"),
        (False, False, False, 0, "--ddof sets --center's divisor n − ddof; add --center, or "
         "drop --ddof"),
        (True, False, False, -1, "--ddof takes a whole number >= 0 (1: np.cov's default); "
         "got -1"),
    ],
)  # fmt: skip
def test_requested_refuses_in_whole_words(
    center: bool, scale: bool, kinship: bool, ddof: int | None, message: str
) -> None:
    with pytest.raises(UsageError, match=whole(message)):
        requested(center, scale, kinship, ddof, rows=False)


def test_an_integer_dtype_for_a_standardized_product_is_refused_naming_the_floats() -> None:
    message = "--dtype int32: a correlation is not whole numbers; choose float32 or float64"
    with pytest.raises(UsageError, match=whole(message)):
        output_dtype(Standardize("scale", 1), "float32", "int32")


def test_dosages_outside_0_to_2_are_refused_with_the_fix() -> None:
    x = np.array([[0.0, 1.0], [2.0, -1.0]])  # variants are rows (axis 0)
    message = (
        "--kinship takes genotype dosages 0, 1 or 2 (0..2 for imputed ones), but X's variant "
        "row 1 holds values from -1 to 2; if a value marks a missing call (e.g. -1 or 3), pass "
        "--missing-code with it"
    )
    with pytest.raises(InputError, match=whole(message)):
        measured(Standardize("kinship", 0), block_moments(x, 0))


def test_a_kinship_where_nothing_varies_is_refused_in_whole_words() -> None:
    message = (
        "--kinship: no variant of G has both alleles among the samples (each is all 0 or all "
        "2), so the relationship matrix is undefined"
    )
    with pytest.raises(InputError, match=whole(message)):
        measured(Standardize("kinship", 1), block_moments(np.full((3, 2), 2.0), 1), "G")


@pytest.mark.parametrize(("rows", "ddof", "left"), [(3, 3, 0), (2, 5, -3)])
def test_a_ddof_that_leaves_no_divisor_says_what_is_left(rows: int, ddof: int, left: int) -> None:
    message = (
        f"--ddof {ddof} leaves no divisor: each variable has {rows} value(s) (n − ddof = "
        f"{left}); pass a smaller --ddof"
    )
    with pytest.raises(UsageError, match=whole(message)):
        measured(Standardize("center", 1, ddof), block_moments(np.ones((rows, 2)), 1))


# ---------------------------------------------------------------------------------------------
# The smallest answers: a divisor of 1, a spread below 1


def test_a_divisor_of_one_is_a_covariance() -> None:
    x = np.array([[1.0, 5.0], [3.0, 5.0]])
    std = measured(Standardize("center", 1, 1), block_moments(x, 1))
    np.testing.assert_array_equal(std.scale, [1.0, 1.0])  # type: ignore[arg-type]
    assert (std.count, std.used) == (2, 2)


def test_a_small_spread_is_a_correlation_not_a_constant() -> None:
    """Σ(x − mean)² = 0.02 < 1: a variable that varies, scaled, not NaN."""
    x = np.array([[1.0, 7.0], [1.1, 7.0], [1.2, 7.0]])
    std = measured(Standardize("scale", 1), block_moments(x, 1))
    np.testing.assert_allclose(std.scale[0], 1 / np.sqrt(0.02), rtol=1e-12)  # type: ignore[index]
    assert np.isnan(std.scale[1])  # type: ignore[index]
    assert (std.count, std.used, std.constant) == (3, 2, 1)
    assert std.record() == {
        "mode": "scale", "axis": "columns", "count": 3, "digest": std.digest(), "constant": 1,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Standardize.apply, finish and stored at their edges


def test_apply_refuses_shifts_without_scales() -> None:
    half = replace(Standardize("center", 1), shift=np.zeros(2))
    with pytest.raises(ValueError, match=whole("the moments are not measured yet")):
        half.apply(np.zeros((2, 2)), (0, 2), (0, 2))
    assert half.stored() is None


@pytest.mark.parametrize(
    ("shape", "axis"),
    [
        ((8192, 256), 1),  # 2**20 values a slab: two slabs of 4096 rows
        ((8192, 256), 0),  # per row: each slab its rows' shifts
        ((2, 2**20 + 1), 1),  # a row wider than 2**20 values: one row a slab
    ],
)
def test_apply_works_in_slabs_never_a_float64_copy_of_the_block(
    shape: tuple[int, int], axis: int
) -> None:
    """A float32 panel standardized in place, half of it at a time here: two float64
    temporaries of a slab at once (the cast and the difference) are 2 x 8 MiB, where the whole
    panel at once would be 2 x 16 MiB, four times the panel's own memory."""
    rng = np.random.default_rng(0)
    block = rng.standard_normal(shape, dtype=np.float32) + np.float32(280)
    n = shape[0] if axis == 0 else shape[1]
    shift, scale = np.full(n, 280.0), np.full(n, 0.5)
    std = replace(Standardize("center", axis), shift=shift, scale=scale)
    expected = ((block.astype(np.float64) - 280.0) * 0.5).astype(np.float32)
    tracemalloc.start()
    try:
        std.apply(block, (0, shape[0]), (0, shape[1]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(block, expected)
    assert peak < 1.5 * block.size * 8, f"{peak:,} bytes at once for {block.size:,} values"


def test_a_one_element_tile_of_a_correlation_is_finished() -> None:
    std = Standardize("scale", 1)
    on = np.array([[0.9999]], dtype=np.float32)
    std.finish(on, 3, 3)
    assert on[0, 0] == 1.0
    off = np.array([[1.0001]], dtype=np.float32)
    std.finish(off, 3, 4)
    assert off[0, 0] == 1.0
    empty = np.empty((0, 3), dtype=np.float32)
    std.finish(empty, 0, 0)  # nothing to finish, and no error
    assert empty.shape == (0, 3)


def test_exactly_max_stored_variables_are_stored() -> None:
    std = replace(Standardize("kinship", 0), shift=np.zeros(MAX_STORED), scale=np.ones(MAX_STORED))
    stored = std.stored()
    assert stored is not None and len(stored["tilegemm_mean"]) == MAX_STORED


# ---------------------------------------------------------------------------------------------
# A record written by another run: what verify reads back


def test_the_digest_is_the_sha256_of_the_little_endian_shifts_and_scales() -> None:
    """verify compares the digest OUT's record holds with X's measured again: its spelling is
    part of OUT's format (a product written by an earlier run still verifies)."""
    shift, scale = np.array([1.5, -2.0]), np.array([0.25, 4.0])
    std = replace(Standardize("center", 1), shift=shift, scale=scale)
    h = hashlib.sha256(b"".join(v.astype("<f8").tobytes() for v in (shift, scale)))
    assert std.digest() == h.hexdigest()[:32]
    assert len(std.digest()) == 32
    # the values digested, whatever arrays hold them (an API caller's float32, big-endian)
    narrow = replace(std, shift=shift.astype(np.float32), scale=scale.astype(">f8"))
    assert narrow.digest() == std.digest()


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"mode": "center", "axis": "columns"}, Standardize("center", 1, 1)),
        ({"mode": "center", "axis": "rows", "ddof": 0}, Standardize("center", 0, 0)),
        ({"mode": "scale", "axis": "columns"}, Standardize("scale", 1, 1)),
        ({"mode": "kinship", "axis": "rows"}, Standardize("kinship", 0, 1)),
    ],
)
def test_a_record_names_its_standardization(
    record: dict[str, object], expected: Standardize
) -> None:
    """A record without ``ddof`` (a correlation's, a kinship's) is np.cov's default 1."""
    got = from_record(record)
    assert (got.mode, got.axis, got.ddof) == (expected.mode, expected.axis, expected.ddof)


# ---------------------------------------------------------------------------------------------
# The plan's line


@pytest.mark.parametrize(
    ("std", "line"),
    [
        (Standardize("center", 1, 1), "covariance of X's columns, divided by n - 1; one more "
         "pass over X first, for their means"),
        (Standardize("center", 0, 0), "covariance of X's rows, divided by n - 0; one more "
         "pass over X first, for their means"),
        (Standardize("scale", 1), "correlation of X's columns; one more pass over X first, "
         "for their means and spreads"),
        (Standardize("scale", 0), "correlation of X's rows; one more pass over X first, for "
         "their means and spreads"),
        (Standardize("kinship", 0), "kinship (standardized, GCTA's): X's rows are the "
         "variants, each centred by 2p and scaled by 1/sqrt(2p(1-p)), G divided by the "
         "variants that vary; "
         "one more pass over X first, for p"),
        (Standardize("kinship", 1), "kinship (standardized, GCTA's): X's columns are the "
         "variants, each centred by 2p and scaled by 1/sqrt(2p(1-p)), G divided by the "
         "variants that vary; "
         "one more pass over X first, for p"),
        (Standardize("kinship", 1, form="vanraden", missing="impute", code=-1.0),
         "kinship (VanRaden's first method): X's columns are the variants, each centred by "
         "2p, G = ZZᵀ / (2 Σ p(1-p)); monomorphic variants left out; missing values (NaN and "
         "-1): its variable's mean; one more pass over X first, for p"),
        (Standardize("center", 1, 1, missing="drop-columns"), "covariance of X's columns, "
         "divided by n - 1; missing values (NaN): its variable left out (NaN in G); one more "
         "pass over X first, for their means"),
    ],
)  # fmt: skip
def test_describe(std: Standardize, line: str) -> None:
    assert describe(std) == line

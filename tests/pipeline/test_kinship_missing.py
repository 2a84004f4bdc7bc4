"""Both kinship forms, missing values and dimension names: the standardization's arithmetic
against float64 numpy and pandas references (plink's and sgkit's mean imputation, pandas'
dropna then cov), then end to end on the cluster; the refusals by dimension name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import zarr
from distributed import Client

from pipeline import gram
from pipeline.errors import InputError, UsageError
from pipeline.plan.genotypes import check_kinship_orientation
from pipeline.plan.standardize import (
    Standardize,
    block_moments,
    kinship_form,
    measured,
    merge,
    requested,
)
from pipeline.summary import format_summary
from tests.helpers import write_array

# ---------------------------------------------------------------------------------------------
# References (float64)


def calls(seed: int, samples: int, variants: int, missing: float = 0.1) -> Any:
    """Dosages 0/1/2, samples x variants, a share of them missing (NaN), one monomorphic
    variant and one with no call at all."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.95, variants)
    g = rng.binomial(2, p, (samples, variants)).astype(np.float64)
    g[:, 0] = 2.0  # monomorphic
    g[rng.random(g.shape) < missing] = np.nan
    g[:, 1] = np.nan  # no call: left out
    return g


def imputed_kinship(g: Any, form: str) -> Any:
    """plink's and sgkit's: each missing call the variant's mean dosage; polymorphic variants
    only; GCTA's standardized mean, or VanRaden's ZZᵀ / (2 Σ p(1-p))."""
    present = (~np.isnan(g)).sum(axis=0)
    p = np.where(present > 0, np.nansum(g, axis=0) / np.maximum(present, 1), np.nan) / 2
    keep = np.isfinite(p) & (p > 0) & (p < 1)
    filled = np.where(np.isnan(g), 2 * p, g)[:, keep]
    p = p[keep]
    z = filled - 2 * p
    if form == "vanraden":
        return z @ z.T / (2 * (p * (1 - p)).sum())
    z = z / np.sqrt(2 * p * (1 - p))
    return z @ z.T / keep.sum()


def dropped(x: Any, mode: str) -> Any:
    """pandas: the columns holding a NaN dropped, then cov or corr; NaN in their places."""
    df = pd.DataFrame(x)
    keep = ~df.isna().any().to_numpy()
    kept = df.loc[:, keep]
    part = kept.cov(ddof=1) if mode == "center" else kept.corr()
    full = np.full((x.shape[1], x.shape[1]), np.nan)
    full[np.ix_(keep, keep)] = part.to_numpy()
    return full


def standardized(std: Standardize, x: Any, axis: int) -> Any:
    """X standardized by ``std`` measured over two blocks, in float64."""
    cut = x.shape[1 - axis] // 2
    parts = (x[:cut], x[cut:]) if axis == 1 else (x[:, :cut], x[:, cut:])
    found = measured(std, merge(*(block_moments(p, axis, std.code) for p in parts)))
    z = x.astype(np.float64).copy()
    found.apply(z, (0, x.shape[0]), (0, x.shape[1]))
    return found, z


# ---------------------------------------------------------------------------------------------
# The arithmetic, against the references


@pytest.mark.parametrize("form", ["standardized", "vanraden"])
@pytest.mark.parametrize("rows", [False, True])
def test_kinship_forms_with_imputed_calls_match_plink_and_sgkit(form: str, rows: bool) -> None:
    g = calls(1, 9, 40)  # samples x variants
    x = g if rows else g.T  # --rows: X is samples x variants
    std = requested(False, False, form, None, rows=rows)
    assert std is not None and (std.form, std.missing) == (form, "impute")
    found, z = standardized(std, x, std.axis)
    grm = z @ z.T if rows else z.T @ z
    np.testing.assert_allclose(grm, imputed_kinship(g, form), rtol=1e-12, atol=1e-12)
    called = ~np.isnan(g).all(axis=0)
    p = np.nansum(g, axis=0) / np.maximum((~np.isnan(g)).sum(axis=0), 1) / 2
    varies = called & (p > 0) & (p < 1)
    monomorphic = (called & ~varies).sum()
    assert (found.used, found.constant, found.dropped) == (varies.sum(), monomorphic, 1)
    assert found.constant >= 1  # the all-2 variant at least
    assert found.imputed == int(np.isnan(np.delete(g, 1, axis=1)).sum()) > 0
    record = found.record()
    assert (record["form"], record["imputed"], record["dropped"]) == (form, found.imputed, 1)


def test_the_two_forms_differ_on_real_like_data() -> None:
    g = calls(2, 30, 200, missing=0.0)
    g[:, 1] = 1.0  # called after all
    standard, vanraden = imputed_kinship(g, "standardized"), imputed_kinship(g, "vanraden")
    assert np.abs(standard - vanraden).max() > 0.02  # they are two matrices, not one


def test_a_missing_code_is_a_missing_call() -> None:
    g = calls(3, 8, 30)
    coded = np.where(np.isnan(g), -1.0, g)
    std = requested(False, False, True, None, rows=True, missing_code=-1)
    assert std is not None and std.code == -1.0
    _, z = standardized(std, coded, std.axis)
    np.testing.assert_allclose(z @ z.T, imputed_kinship(g, "standardized"), rtol=1e-12)
    plain = requested(False, False, True, None, rows=True)
    assert plain is not None
    with pytest.raises(InputError, match=r"from -1 to -?[12]; if a value marks a missing call"):
        standardized(plain, coded, plain.axis)


def test_drop_columns_leaves_out_every_variable_holding_a_missing_value() -> None:
    x = 280 + np.random.default_rng(4).standard_normal((25, 7))
    x[:, 2] = np.nan  # a land point
    x[5, 4] = np.nan  # a partly missing one
    for mode in ("center", "scale"):
        std = requested(mode == "center", mode == "scale", False, None, False, "drop-columns")
        assert std is not None
        found, z = standardized(std, x, 1)
        got = z.T @ z
        if mode == "scale":
            np.fill_diagonal(got, np.where(np.isnan(np.diag(got)), np.nan, 1.0))
        np.testing.assert_allclose(got, dropped(x, mode), rtol=1e-12, atol=1e-14)
        assert (found.dropped, found.used, found.imputed) == (2, 5, 0)


def test_impute_for_a_covariance_is_the_covariance_of_the_filled_data() -> None:
    x = np.random.default_rng(5).standard_normal((30, 6))
    x[np.random.default_rng(6).random(x.shape) < 0.2] = np.nan
    std = requested(True, False, False, 1, False, "impute")
    assert std is not None
    found, z = standardized(std, x, 1)
    filled = np.where(np.isnan(x), np.nanmean(x, axis=0), x)
    np.testing.assert_allclose(z.T @ z, np.cov(filled, rowvar=False), rtol=1e-12, atol=1e-14)
    assert found.imputed == int(np.isnan(x).sum())


def test_without_a_policy_missing_values_are_refused_naming_the_flags() -> None:
    x = np.ones((6, 4))
    x[3, 2] = np.nan
    std = requested(True, False, False, None, False)
    assert std is not None and std.missing is None
    with pytest.raises(InputError, match=r"^X holds 1 NaN value\(s\) in 1 column\(s\) \(the "
                       r"first in column 2\); --center needs a policy for them: --missing "
                       r"drop-columns .* --missing impute"):  # fmt: skip
        standardized(std, x, 1)


@pytest.mark.parametrize(
    ("value", "form"), [(True, "standardized"), ("vanraden", "vanraden"), (False, None)]
)
def test_kinship_takes_a_form_or_a_switch(value: Any, form: str | None) -> None:
    assert kinship_form(value) == form


def test_an_unknown_form_is_refused() -> None:
    with pytest.raises(UsageError, match=r"--kinship takes standardized or vanraden"):
        kinship_form("gcta")


# ---------------------------------------------------------------------------------------------
# Dimension names: a kinship sums over the variants


@pytest.mark.parametrize(
    ("names", "rows", "says"),
    [
        (("variants", "samples"), True, r"are \('variants', 'samples'\) and this product "
         r"\(G = X·Xᵀ\) sums over its second, 'samples'; sum over the variants with --over "
         r"variants \(or G = XᵀX: no --rows\)$"),
        (("samples", "variants"), False, r"are \('samples', 'variants'\) and this product "
         r"\(G = XᵀX\) sums over its first, 'samples'; sum over the variants with --over "
         r"variants \(or G = X·Xᵀ: --rows\)$"),
        (("sid", "iid"), True, r"'iid'; sum over the variants with --over sid \(or G = XᵀX"),
        (("samples", None), False, r"'samples'; sum over the variants with G = X·Xᵀ: --rows$"),
    ],
)  # fmt: skip
def test_an_orientation_the_names_contradict_is_refused(
    names: tuple[str, str], rows: bool, says: str
) -> None:
    with pytest.raises(UsageError, match=r"^--kinship sums over the variants, but X's dim" + ""):
        check_kinship_orientation(names, rows)
    with pytest.raises(UsageError, match=says):
        check_kinship_orientation(names, rows)


@pytest.mark.parametrize(
    ("names", "rows"),
    [(("variants", "samples"), False), (("samples", "variants"), True), ((None, None), True),
     (("i", "j"), False), (("VARIANTS", None), False)],
)  # fmt: skip
def test_an_orientation_the_names_agree_with_or_dont_name_runs(
    names: tuple[str | None, str | None], rows: bool
) -> None:
    check_kinship_orientation(names, rows)


# ---------------------------------------------------------------------------------------------
# End to end, on the cluster


def sgkit_store(root: Path, g: Any, zarr_format: int = 2) -> str:
    """A dataset as sgkit writes one: call_dosage (variants, samples), NaN for no call (v2:
    xarray's _ARRAY_DIMENSIONS; v3: dimension_names)."""
    xr = pytest.importorskip("xarray")
    ds = xr.Dataset({"call_dosage": (("variants", "samples"), g.T.astype(np.float32))})
    ds = ds.chunk({"variants": 16, "samples": 4})
    path = root / "geno.zarr"
    ds.to_zarr(path, zarr_format=zarr_format, consolidated=zarr_format == 2)
    return str(path)


@pytest.mark.parametrize("form", ["standardized", "vanraden"])
def test_grm_of_sgkit_style_calls_with_missing_values(
    tmp_path: Path, client: Client, form: str
) -> None:
    g = calls(7, 10, 48)
    store = sgkit_store(tmp_path, g, 2 if form == "standardized" else 3)
    out = f"{store}/grm_{form}"
    result = gram(f"{store}/call_dosage", out, client=client, kinship=form, verify=True)
    assert result.verified is True
    grm: Any = zarr.open_array(out, mode="r")
    np.testing.assert_allclose(grm[:], imputed_kinship(g, form), rtol=2e-5, atol=2e-5)
    std = json.loads(grm.attrs["tilegemm"])["standardize"]
    assert (std["form"], std["variants_used"] + std["monomorphic"], std["dropped"]) == (
        form, 47, 1,
    )  # fmt: skip
    assert std["monomorphic"] >= 1
    assert std["imputed"] == int(np.isnan(np.delete(g, 1, axis=1)).sum()) > 0
    assert result.standardize is not None and result.standardize.imputed == std["imputed"]
    done = format_summary(result)
    assert done.endswith(
        f"; kinship: {std['variants_used']} variants used, {std['monomorphic']} monomorphic "
        f"left out, 1 left out for missing values, {std['imputed']} missing value(s) imputed"
    ), done
    with pytest.raises(UsageError, match=r"dimensions are \('variants', 'samples'\) and "
                       r"this product \(G = X·Xᵀ\) sums over its second, 'samples'; sum over "
                       r"the variants with over"):  # fmt: skip
        gram(f"{store}/call_dosage", f"{store}/wrong", client=client, kinship=form, rows=True)
    assert "wrong" not in zarr.open_group(store, mode="r")


def test_a_fill_value_marks_missing_calls(tmp_path: Path, client: Client) -> None:
    g = calls(8, 8, 24)
    coded = np.where(np.isnan(g), -1, g).astype(np.int8)
    x = write_array(tmp_path / "x.zarr", coded, (8, 8), 3)
    zarr.open_array(x, mode="r+").attrs["_FillValue"] = -1  # as xarray marks an int's
    out = str(tmp_path / "grm.zarr")
    gram(x, out, client=client, kinship=True, rows=True)
    grm: Any = zarr.open_array(out, mode="r")
    np.testing.assert_allclose(grm[:], imputed_kinship(g, "standardized"), rtol=2e-5, atol=2e-5)
    assert json.loads(grm.attrs["tilegemm"])["standardize"]["missing_code"] == -1


def test_land_points_leave_nan_rows_and_columns(tmp_path: Path, client: Client) -> None:
    x = (280 + np.random.default_rng(9).standard_normal((40, 12))).astype(np.float32)
    x[:, [3, 7]] = np.nan
    url = write_array(tmp_path / "t.zarr", x, (10, 4), 3)
    out = str(tmp_path / "cov.zarr")
    result = gram(url, out, client=client, center=True, missing="drop-columns", verify=True)
    assert result.verified is True
    assert format_summary(result).endswith(
        "; covariance: 10 variables used, 2 left out for missing values, 0 missing value(s) imputed"
    )
    cov: Any = zarr.open_array(out, mode="r")
    want = dropped(x.astype(np.float64), "center")
    assert np.array_equal(np.isnan(cov[:]), np.isnan(want))
    np.testing.assert_allclose(cov[:], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match=r"holds 80 NaN value\(s\) in 2 column\(s\)"):
        gram(url, str(tmp_path / "refused.zarr"), client=client, center=True)


def test_the_readmes_numpy_check_is_both_forms() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    (code,) = [b for b in blocks if "vanraden = " in b]
    g = calls(10, 12, 50)
    found: dict[str, Any] = {"np": np, "geno": g}
    with np.errstate(invalid="ignore", divide="ignore"):
        exec(code, found)  # noqa: S102  (our own README's snippet)
    np.testing.assert_allclose(found["grm"], imputed_kinship(g, "standardized"), rtol=1e-12)
    np.testing.assert_allclose(found["vanraden"], imputed_kinship(g, "vanraden"), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# What G was started with: --resume with another form or policy is refused, never mixed


@pytest.mark.parametrize(
    ("first", "then", "says"),
    [
        ({"kinship": True}, {"kinship": "vanraden"},
         r"was started with kinship=True and this run has kinship='vanraden'|"
         r"was started with --kinship and this run has --kinship vanraden"),
        ({"kinship": True}, {"kinship": True, "missing": "drop-columns"},
         r"started with .*kinship.* and this run has .*drop-columns"),
        ({"center": True, "missing": "impute"}, {"center": True, "missing": "drop-columns"},
         r"started with .*impute.* and this run has .*drop-columns"),
    ],
)  # fmt: skip
def test_resume_with_another_form_or_policy_is_refused(
    tmp_path: Path, client: Client, first: dict[str, Any], then: dict[str, Any], says: str
) -> None:
    g = calls(14, 8, 24)
    url = write_array(tmp_path / "x.zarr", g, (8, 8), 3)
    out = str(tmp_path / "g.zarr")
    gram(url, out, client=client, rows=True, **first)
    before = zarr.open_array(out, mode="r")[:]
    with pytest.raises(UsageError, match=says):
        gram(url, out, client=client, rows=True, resume=True, **then)
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], before)


def test_a_dosage_is_no_missing_code() -> None:
    for code in (0, 1, 2, 0.5):
        with pytest.raises(UsageError, match=r"is a genotype dosage \(0\.\.2\), so real calls"):
            requested(False, False, True, None, rows=True, missing_code=code)
    requested(True, False, False, None, rows=False, missing_code=0)  # a covariance's may be


def test_a_code_other_than_the_fill_value_is_named(tmp_path: Path) -> None:
    coded = np.where(np.isnan(calls(15, 8, 16)), -1, calls(15, 8, 16)).astype(np.int8)
    x = write_array(tmp_path / "x.zarr", coded, (8, 8), 3)
    zarr.open_array(x, mode="r+").attrs["_FillValue"] = -1
    says = r"_FillValue=-1, and (missing_code=3|--missing-code 3) names another value"
    with pytest.raises(InputError, match=says):
        pipeline_prepare_gram(x, str(tmp_path / "g.zarr"), kinship=True, missing_code=3)


def pipeline_prepare_gram(x: str, out: str, **options: Any) -> Any:
    from pipeline import prepare_gram

    return prepare_gram(x, out, rows=True, **options)

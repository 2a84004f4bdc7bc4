"""The README's PCA recipes, run as printed: the samples' PCs of sgkit-style dosages by
dimension name, and the EOFs of a (time, lat, lon) field stacked and unstacked with its own
coordinates; each checked against scikit-learn."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from tests.pipeline.test_readme_recipes import block, command, ran

xr = pytest.importorskip("xarray")
decomposition = pytest.importorskip("sklearn.decomposition")
preprocessing = pytest.importorskip("sklearn.preprocessing")


def aligned(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """``ours`` with each row's sign matched to ``theirs`` (both sign rules pick a side)."""
    signs = np.sign((ours * theirs).sum(axis=1, keepdims=True))
    return ours * signs


def test_the_genotype_pcs_by_dimension_name(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    samples, variants = 40, 300
    groups = rng.integers(0, 3, samples)  # three populations, allele frequencies apart
    freq = np.clip(rng.beta(2, 2, (3, variants)) + 0.0, 0.05, 0.95)
    dosage = rng.binomial(2, freq[groups]).astype(np.int8)  # samples x variants
    ds = xr.Dataset({"call_dosage": (("variants", "samples"), dosage.T)})
    ds.chunk({"variants": 64, "samples": 16}).to_zarr(tmp_path / "geno.zarr", zarr_format=2)
    argv = command("geno.zarr/call_dosage geno_pcs.zarr")
    ran(argv, tmp_path)
    pcs = xr.open_zarr(tmp_path / "geno_pcs.zarr")
    assert pcs.scores.dims == ("samples", "component")
    assert pcs.components.dims == ("component", "variants")
    k = pcs.sizes["component"]
    standard = preprocessing.StandardScaler().fit_transform(dosage.astype(np.float64))
    exact = decomposition.PCA(k, svd_solver="full").fit(standard)
    # the populations' two PCs stand apart from the noise: those the sketch finds exactly;
    # the noise's a randomized SVD only bounds from below
    lead = 2
    ratio = pcs.explained_variance_ratio.values
    np.testing.assert_allclose(pcs.singular_values[:lead], exact.singular_values_[:lead], rtol=1e-6)
    np.testing.assert_allclose(ratio[:lead], exact.explained_variance_ratio_[:lead], rtol=1e-6)
    assert (pcs.singular_values.values <= exact.singular_values_ * (1 + 1e-9)).all()
    np.testing.assert_allclose(
        aligned(pcs.components.values[:lead], exact.components_[:lead]),
        exact.components_[:lead],
        atol=1e-4,  # (σ_(l+1)/σ_2)^(2q+1) ≈ 0.4^9 of the sketch's error left, spread over 300
    )


def test_the_eofs_of_a_field_stacked_and_unstacked(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    time, lat, lon = 120, 6, 8
    days = np.arange(time)
    patterns = rng.standard_normal((2, lat, lon))
    series = np.stack([3 * np.sin(days / 10), 1.5 * np.cos(days / 7)], axis=1)
    t2m = (
        280
        + np.einsum("tk,kyx->tyx", series, patterns)
        + 0.05 * rng.standard_normal((time, lat, lon))
    )
    era5 = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m.astype(np.float32))},
        coords={
            "time": np.datetime64("2000-01-01") + days.astype("timedelta64[D]"),
            "lat": np.linspace(-30, 30, lat),
            "lon": np.arange(lon) * 10.0,
        },
    )
    era5.chunk({"time": 40, "lat": 3, "lon": 4}).to_zarr(tmp_path / "era5.zarr", zarr_format=2)
    flat_code = block("python", "reset_index")
    found: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        source = flat_code.replace('"space": 4096', '"space": 16').replace(
            '"time": 365', '"time": 40'
        )
        with warnings.catch_warnings():  # xarray's v3 store: zarr's note on consolidation
            warnings.simplefilter("ignore", zarr.errors.ZarrUserWarning)
            exec(source, found)  # noqa: S102  (our own README's snippet, smaller chunks)
        ran(command("t2m_flat.zarr/t2m eofs.zarr"), tmp_path)
        exec(block("python", 'xr.open_zarr("eofs.zarr")'), found)  # noqa: S102
    unstacked, pcs = found["patterns"], found["series"]
    assert unstacked.dims == ("component", "lat", "lon")
    assert pcs.dims == ("time", "component")
    np.testing.assert_array_equal(pcs.time.values, era5.time.values)
    np.testing.assert_allclose(unstacked.lat.values, era5.lat.values)
    flat = t2m.reshape(time, -1).astype(np.float32).astype(np.float64)
    exact = decomposition.PCA(2, svd_solver="full").fit(flat)
    ours = unstacked.values[:2].reshape(2, -1)
    np.testing.assert_allclose(ours, exact.components_, atol=2e-4)
    np.testing.assert_allclose(pcs.values[:, :2], exact.transform(flat), rtol=1e-3, atol=2e-3)

"""The data as users hold it: an xarray dataset and an AnnData store, written by those
libraries, multiplied and grammed with the command line and the Python API, the results
opened with xarray as the README says and saved with ``to_netcdf``."""

from __future__ import annotations

import warnings
from pathlib import Path

import dask.array
import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client

import pipeline
from tests.helpers import assert_product, run_cli

ad = pytest.importorskip("anndata")


def opened(path: Path | str, **kwargs: object) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata that lists everything
        return xr.open_zarr(str(path), **kwargs).load()  # type: ignore[arg-type]


@pytest.fixture
def climate(tmp_path: Path) -> tuple[str, xr.Dataset]:
    rng = np.random.default_rng(11)
    time = (np.datetime64("2001-01-01") + np.arange(48).astype("timedelta64[D]")).astype("M8[ns]")
    ds = xr.Dataset(
        {
            "tas": (("time", "lat"), (280 + 3 * rng.standard_normal((48, 10))).astype("f4")),
            "pr": (("time", "lon"), rng.random((48, 7)).astype("f4")),
        },
        coords={"time": time, "lat": np.linspace(-45, 45, 10), "lon": np.arange(7) * 10.0},
    )
    path = tmp_path / "climate.zarr"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds.chunk({"time": 16}).to_zarr(str(path), mode="w")
    return str(path), ds


def test_xarray_dataset_with_the_cli(tmp_path: Path, climate: tuple[str, xr.Dataset]) -> None:
    store, ds = climate
    res = tmp_path / "res.zarr"
    done = run_cli("multiply", f"{store}/tas", f"{store}/pr", f"{res}/cross", "--transpose-a")
    assert done.returncode == 0, done.stderr
    cross = opened(res)["cross"]  # a new folder: written as a group xarray opens
    assert cross.dims == ("lat", "lon")
    assert_product(cross.values, ds.tas.values.T, ds.pr.values)
    done = run_cli("gram", f"{store}/tas", f"{store}/gram")  # into the dataset itself
    assert done.returncode == 0, done.stderr
    back = opened(store)
    assert back["gram"].dims == ("lat", "lat_2")
    np.testing.assert_array_equal(back["gram"].lat, ds.lat)  # the dataset's coordinates
    assert_product(back["gram"].values, ds.tas.values.T, ds.tas.values)
    xr.testing.assert_identical(back[["tas", "pr"]], ds)  # the inputs untouched
    saved = tmp_path / "res.nc"
    opened(res).to_netcdf(saved)
    with xr.open_dataset(saved) as nc:
        np.testing.assert_array_equal(nc["cross"].values, cross.values)
        assert nc["cross"].attrs["tilegemm"] == cross.attrs["tilegemm"]


def test_xarray_dataset_with_the_api(
    tmp_path: Path, climate: tuple[str, xr.Dataset], client: Client
) -> None:
    store, ds = climate
    shifted = ds.assign_coords(time=ds.time + np.timedelta64(365, "D"))
    other = tmp_path / "next-year.zarr"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        shifted.to_zarr(str(other), mode="w")
    with pytest.raises(pipeline.PipelineError, match="coordinates that differ at 48 of 48"):
        pipeline.multiply(f"{store}/tas", f"{other}/pr", f"{store}/bad", transpose_a=True)
    result = pipeline.multiply(
        f"{store}/tas", f"{store}/pr", f"{store}/cross", transpose_a=True, client=client
    )
    assert result.shape == (10, 7)
    pipeline.gram(f"{store}/pr", f"{store}/pr_gram", rows=True, client=client)
    back = opened(store)
    assert_product(back["cross"].values, ds.tas.values.T, ds.pr.values)
    assert back["pr_gram"].dims == ("time", "time_2")
    assert_product(back["pr_gram"].values, ds.pr.values, ds.pr.values.T)


def write_anndata(path: Path, rng: np.random.Generator, zarr_format: int) -> tuple[str, ad.AnnData]:
    x = rng.random((120, 30)).astype("f4")
    adata = ad.AnnData(
        X=x,
        layers={"counts": rng.integers(0, 50, (120, 30)).astype("f4")},
        obsm={"X_pca": rng.standard_normal((120, 8)).astype("f4")},
    )
    # v3 as anndata will write it by default: sharded
    shard = {"zarr_write_format": zarr_format, "auto_shard_zarr_v3": True}
    with ad.settings.override(**shard), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Writing zarr v2 data", category=UserWarning)
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        adata.write_zarr(str(path))
    return str(path), adata


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_anndata_store_with_the_cli_and_the_api(
    tmp_path: Path, client: Client, zarr_format: int
) -> None:
    rng = np.random.default_rng(12)
    store, adata = write_anndata(tmp_path / "cells.zarr", rng, zarr_format)
    res = tmp_path / "res.zarr"
    done = run_cli("gram", f"{store}/X", f"{res}/genes")
    assert done.returncode == 0, done.stderr
    assert_product(opened(res)["genes"].values, adata.X.T, adata.X)
    pipeline.multiply(
        f"{store}/layers/counts", f"{store}/obsm/X_pca", f"{res}/loadings",
        transpose_a=True, client=client,
    )  # fmt: skip
    pipeline.gram(f"{store}/obsm/X_pca", f"{res}/cells", rows=True, client=client)
    back = opened(res)
    assert_product(back["loadings"].values, adata.layers["counts"].T, adata.obsm["X_pca"])
    assert_product(back["cells"].values, adata.obsm["X_pca"], adata.obsm["X_pca"].T)
    back.to_netcdf(tmp_path / "res.nc")
    with xr.open_dataset(tmp_path / "res.nc") as nc:
        np.testing.assert_array_equal(nc["cells"].values, back["cells"].values)


def test_a_standalone_out_opens_as_the_readme_says(
    tmp_path: Path, climate: tuple[str, xr.Dataset]
) -> None:
    store, ds = climate
    out = str(tmp_path / "c.zarr")
    done = run_cli("multiply", f"{store}/tas", f"{store}/pr", out, "--transpose-a")
    assert done.returncode == 0, done.stderr
    names = zarr.open_array(out).metadata.dimension_names
    c = xr.DataArray(dask.array.from_zarr(out), dims=names)
    assert c.dims == ("lat", "lon")
    assert_product(c.values, ds.tas.values.T, ds.pr.values)

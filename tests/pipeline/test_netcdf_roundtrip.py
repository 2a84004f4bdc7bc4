"""Every OUT of every command, written inside a Zarr group, saves as netCDF: xarray opens the
group, ``to_netcdf`` writes it (h5netcdf) and ``open_dataset`` reads back the Zarr values
bit for bit, with OUT's attributes as they were (the record as JSON text: netCDF attributes are
strings, numbers and flat lists of numbers, never None, a bool or a dict)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client

from pipeline import gram, multiply
from pipeline.generate import write_random
from tests.helpers import random_matrix

pytest.importorskip("h5netcdf")

SHAPE, CHUNKS = (24, 16), (8, 8)
"""X: 24 samples by 16 variables, in 3x2 chunks."""


def opened(group: Path) -> xr.Dataset:
    """The group as xarray opens it (consolidated metadata: zarr warns v3's is not in the
    spec yet)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds: xr.Dataset = xr.open_zarr(str(group)).load()
    return ds


def write_inputs(group: Path, dtype: str, dosages: bool = False, zarr_format: int = 3) -> str:
    """X (samples x variables) and Y (samples x 8) as one xarray dataset; dosages: X holds
    0/1/2 as int8 (a kinship's), one variable monomorphic."""
    rng = np.random.default_rng(3)
    if dosages:
        x = rng.binomial(2, rng.uniform(0.1, 0.9, SHAPE[1]), SHAPE).astype(np.int8)
        x[:, 3] = 0
    else:
        x = random_matrix(rng, SHAPE, dtype)
    y = random_matrix(rng, (SHAPE[0], 8), dtype)
    ds = xr.Dataset({"X": (("sample", "variable"), x), "Y": (("sample", "trait"), y)})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        chunked = ds.chunk({"sample": CHUNKS[0], "variable": CHUNKS[1]})
        chunked.to_zarr(str(group), mode="w", zarr_format=zarr_format)
    return str(group)


def _random(res: Path, client: Client) -> None:
    write_random(f"{res}/OUT", SHAPE, CHUNKS, "float32", seed=4)


def _multiply(stored: str, **options: Any) -> Callable[[Path, Client], None]:
    """OUT = Xᵀ·Y, X and Y ``stored`` in their own group, OUT in a new one."""

    def run(res: Path, client: Client) -> None:
        inputs = write_inputs(res.parent / "inputs.zarr", stored)
        multiply(
            f"{inputs}/X", f"{inputs}/Y", f"{res}/OUT", client=client, transpose_a=True, **options
        )

    return run


def _multiply_plain(res: Path, client: Client) -> None:
    """OUT = X·B for a B of 16x8 (no transpose)."""
    inputs = write_inputs(res.parent / "inputs.zarr", "float64")
    rng = np.random.default_rng(5)
    b = xr.Dataset({"B": (("variable", "trait"), random_matrix(rng, (SHAPE[1], 8), "float64"))})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        b.to_zarr(str(res.parent / "b.zarr"), mode="w")
    multiply(f"{inputs}/X", f"{res.parent}/b.zarr/B", f"{res}/OUT", client=client)


def _accumulate(res: Path, client: Client) -> None:
    """OUT += Xᵀ·Y into an OUT xarray wrote, in the inputs' own dataset."""
    write_inputs(res, "float64")
    rng = np.random.default_rng(6)
    c = xr.Dataset({"OUT": (("variable", "trait"), random_matrix(rng, (SHAPE[1], 8), "float64"))})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        c.to_zarr(str(res), mode="a")
    multiply(f"{res}/X", f"{res}/Y", f"{res}/OUT", client=client, transpose_a=True, accumulate=True)


def _into_v2_group(res: Path, client: Client) -> None:
    """G = Xᵀ·X into the inputs' own Zarr v2 dataset (OUT is v2 there, its dimension names
    in ``_ARRAY_DIMENSIONS``)."""
    write_inputs(res, "float64", zarr_format=2)
    gram(f"{res}/X", f"{res}/OUT", client=client, verify=True)


def _gram(dosages: bool = False, **options: Any) -> Callable[[Path, Client], None]:
    def run(res: Path, client: Client) -> None:
        inputs = write_inputs(res.parent / "inputs.zarr", "float32", dosages=dosages)
        gram(f"{inputs}/X", f"{res}/OUT", client=client, **options)

    return run


@pytest.mark.parametrize(("write", "dtype"), [
    (_random, "float32"),
    (_multiply("float32"), "float32"),
    (_multiply("float64"), "float64"),
    (_multiply("int8", dtype="int32"), "int32"),  # exact integers
    (_multiply_plain, "float64"),
    (_accumulate, "float64"),  # into an xarray-written OUT
    (_multiply("float32", verify=True, alpha=2.0), "float32"),  # verified, α recorded
    (_into_v2_group, "float64"),
    (_gram(), "float32"),  # Xᵀ·X
    (_gram(rows=True), "float32"),  # X·Xᵀ
    (_gram(center=True), "float32"),  # a covariance: its moments recorded
    (_gram(scale=True), "float32"),  # a correlation
    (_gram(dosages=True, rows=True, kinship=True), "float32"),  # VanRaden's kinship
], ids=[
    "random", "multiply-float32", "multiply-float64", "multiply-int8-int32", "multiply-plain",
    "accumulate", "multiply-verify-alpha", "gram-v2-group", "gram", "gram-rows", "gram-center",
    "gram-scale", "gram-kinship",
])  # fmt: skip
def test_out_round_trips_through_netcdf(
    tmp_path: Path, client: Client, write: Callable[[Path, Client], None], dtype: str
) -> None:
    res = tmp_path / "res.zarr"
    write(res, client)
    stored = zarr.open_array(f"{res}/OUT", mode="r")
    assert stored.dtype == np.dtype(dtype)
    ds = opened(res)
    saved = tmp_path / "res.nc"
    ds.to_netcdf(saved, engine="h5netcdf")
    with xr.open_dataset(saved, engine="h5netcdf") as nc:
        back = nc.load()
    assert back["OUT"].dtype == stored.dtype
    np.testing.assert_array_equal(back["OUT"].values, stored[:], strict=True)
    assert set(back["OUT"].attrs) == set(ds["OUT"].attrs)
    assert "tilegemm" in back["OUT"].attrs or write is _accumulate  # ours, or left as it was
    for key, value in ds["OUT"].attrs.items():
        if isinstance(value, str):
            assert back["OUT"].attrs[key] == value, key
        else:  # numbers, or a flat list of numbers (a standardization's shifts and scales)
            np.testing.assert_array_equal(np.asarray(back["OUT"].attrs[key]), value, err_msg=key)
    xr.testing.assert_equal(back, ds)

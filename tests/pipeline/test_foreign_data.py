"""Inputs written by other tools and with other Zarr settings than ours: xarray datasets (Zarr v2
and v3, an array addressed inside its group), zarr v2 codecs, byte orders and memory orders, a
sharded v3 array, dask's to_zarr. Each product is checked against float64 numpy, and verified."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask.array as da
import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client

from pipeline import multiply, verify_product
from pipeline.errors import InputError
from tests.helpers import assert_product, random_matrix

Writer = Callable[[Path, str, Any, tuple[int, int]], str]
"""(folder, name, data, chunks) -> the URL of a Zarr array holding data."""


def xarray_writer(zarr_format: int) -> Writer:
    def write(root: Path, name: str, data: Any, chunks: tuple[int, int]) -> str:
        store = root / "ds.zarr"
        ds = xr.Dataset({name: ((f"{name}0", f"{name}1"), data)})
        mode = "a" if store.exists() else "w-"
        with warnings.catch_warnings():  # xarray consolidates v3 metadata; zarr says so
            warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
            ds.to_zarr(
                store, mode=mode, zarr_format=zarr_format, encoding={name: {"chunks": chunks}}
            )
        return str(store / name)  # the array inside the dataset's group

    return write


def zarr_writer(zarr_format: int, dtype: str | None = None, **options: Any) -> Writer:
    def write(root: Path, name: str, data: Any, chunks: tuple[int, int]) -> str:
        url = str(root / f"{name}.zarr")
        array = zarr.create_array(
            url, shape=data.shape, chunks=chunks, dtype=dtype or data.dtype,
            zarr_format=zarr_format, **options,
        )  # fmt: skip
        array[:] = data
        return url

    return write


def dask_writer(root: Path, name: str, data: Any, chunks: tuple[int, int]) -> str:
    url = str(root / f"{name}.zarr")
    da.to_zarr(da.from_array(data, chunks=chunks), url)
    return url


@pytest.mark.parametrize(
    ("writer", "dtype"),
    [
        pytest.param(xarray_writer(2), "float32", id="xarray-v2"),
        pytest.param(xarray_writer(3), "float64", id="xarray-v3"),
        pytest.param(
            zarr_writer(2, compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.BITSHUFFLE)),
            "float32",
            id="v2-blosc",
        ),
        pytest.param(zarr_writer(2, compressors=None), "float64", id="v2-uncompressed"),
        pytest.param(zarr_writer(2, dtype=">f4"), "float32", id="v2-big-endian"),
        pytest.param(
            zarr_writer(3, serializer=zarr.codecs.BytesCodec(endian="big")),
            "float64",
            id="v3-big-endian",
        ),
        pytest.param(zarr_writer(2, order="F"), "float64", id="v2-fortran-order"),
        pytest.param(
            zarr_writer(
                2, filters=[numcodecs.Delta(dtype="<f8")], compressors=numcodecs.Zlib(level=1)
            ),
            "float64",
            id="v2-delta-zlib",
        ),
        pytest.param(zarr_writer(2, dtype="<i2"), "int16", id="v2-int16"),
        pytest.param(zarr_writer(3, shards=(64, 64)), "float32", id="v3-sharded"),
        pytest.param(dask_writer, "float32", id="dask-to-zarr"),
    ],
)
def test_products_of_foreign_arrays(
    tmp_path: Path, client: Client, request: pytest.FixtureRequest, writer: Writer, dtype: str
) -> None:
    rng = np.random.default_rng(0)
    a, b = random_matrix(rng, (150, 130), dtype), random_matrix(rng, (130, 90), dtype)
    sharded = request.node.callspec.id == "v3-sharded"  # inner chunks 16x16 in 64x64 shards
    a_url = writer(tmp_path, "a", a, (16, 16) if sharded else (48, 40))
    b_url = writer(tmp_path, "b", b, (16, 16) if sharded else (30, 32))
    np.testing.assert_array_equal(zarr.open_array(a_url, mode="r")[:], a)  # written as meant
    out = str(tmp_path / "c.zarr")
    wide = "int64" if dtype == "int16" else None  # an int16 product could overflow int16
    result = multiply(a_url, b_url, out, client=client, dtype=wide)
    assert result.shape == (150, 90) and result.tiles_computed > 0
    assert_product(zarr.open_array(out, mode="r")[:], a, b, wide)
    check = verify_product(client, a_url, b_url, out)
    assert check.passed and check.worst_ratio < 0.5, check


def test_arrays_of_different_formats_together(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(1)
    a, b = random_matrix(rng, (120, 100), "float32"), random_matrix(rng, (100, 80), "float64")
    (tmp_path / "x").mkdir()
    a_url = xarray_writer(2)(tmp_path / "x", "a", a, (50, 30))
    b_url = zarr_writer(3, shards=(64, 64))(tmp_path, "b", b, (16, 32))
    out = str(tmp_path / "c.zarr")
    multiply(a_url, b_url, out, client=client)
    assert_product(zarr.open_array(out, mode="r")[:], a, b)
    assert verify_product(client, a_url, b_url, out).passed


def test_cf_packed_variables_are_refused(tmp_path: Path) -> None:
    """Once a finding (multiplied as their stored int16, wrapping, -9999 as a number): a
    CF-packed variable is refused, naming scale_factor and how to unpack it."""
    rng = np.random.default_rng(2)
    a, b = np.round(rng.uniform(-1, 1, (60, 50)), 2), np.round(rng.uniform(-1, 1, (50, 40)), 2)
    packed = {"dtype": "int16", "scale_factor": 0.01, "_FillValue": -9999, "chunks": (16, 16)}
    ds = xr.Dataset({"a": (("x", "y"), a), "b": (("y", "z"), b)})
    ds.to_zarr(tmp_path / "ds.zarr", zarr_format=2, encoding={"a": packed, "b": packed})
    urls = str(tmp_path / "ds.zarr" / "a"), str(tmp_path / "ds.zarr" / "b")
    with pytest.raises(InputError, match=r"CF-packed \(scale_factor=0\.01\).*unpack it first"):
        multiply(*urls, str(tmp_path / "c.zarr"))
    assert not (tmp_path / "c.zarr").exists()


def test_an_integer_product_beyond_its_dtype_is_not_wrapped(tmp_path: Path, client: Client) -> None:
    """Once a finding (int16 sums wrapped silently): refused before any work, and right in the
    wider dtype the refusal names."""
    a = np.full((20, 50), 100, dtype="int16")  # every element of C is 50·100·100 = 500000
    b = np.full((50, 10), 100, dtype="int16")
    urls = [zarr_writer(2)(tmp_path, n, x, (10, 10)) for n, x in (("a", a), ("b", b))]
    out = str(tmp_path / "c.zarr")
    with pytest.raises(InputError, match=r"integer overflow: int16 @ int16 .* dtype='int64'"):
        multiply(*urls, out, client=client)
    multiply(*urls, out, client=client, dtype="int64")
    c = zarr.open_array(out, mode="r")[:]
    assert c.dtype == np.int64 and (c == 500_000).all(), c[0, 0]

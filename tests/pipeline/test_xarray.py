"""Data written by xarray: OUT gets dimension names, lands in the dataset (its group's format,
consolidated metadata refreshed), and CF-encoded inputs (packed, missing markers) are refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client

from pipeline import multiply, prepare
from pipeline.errors import InputError, UsageError
from pipeline.plan.layout import dimension_names
from tests.helpers import assert_product, write_array


def write_dataset(path: Path, ds: xr.Dataset, zarr_format: int) -> str:
    """xarray's to_zarr, consolidated (its default); zarr warns that v3 consolidation is not
    in the spec yet."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds.to_zarr(str(path), zarr_format=zarr_format, mode="w", consolidated=True)
    return str(path)


def open_dataset(path: str) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        return xr.open_zarr(path).load()


def sample(rng: np.random.Generator) -> xr.Dataset:
    return xr.Dataset(
        {
            "A": (("x", "y"), rng.uniform(-1, 1, (30, 20))),
            "B": (("y", "z"), rng.uniform(-1, 1, (20, 25)).astype("float32")),
            "S": (("y", "x"), rng.uniform(-1, 1, (20, 30))),  # B-like, but y-by-x
        }
    )


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_product_lands_in_the_dataset(tmp_path: Path, client: Client, zarr_format: int) -> None:
    ds = sample(np.random.default_rng(zarr_format))
    store = write_dataset(tmp_path / "ds.zarr", ds, zarr_format)
    multiply(f"{store}/A", f"{store}/B", f"{store}/C", client=client)
    back = open_dataset(store)  # consolidated metadata: C is listed only if refreshed
    assert back["C"].dims == ("x", "z")
    assert_product(back["C"].values, ds["A"].values, ds["B"].values)
    # In a v2 group OUT is v2 (a v3 array there is invisible to the group and to xarray).
    assert zarr.open_array(f"{store}/C").metadata.zarr_format == zarr_format
    xr.testing.assert_identical(back[["A", "B", "S"]], ds)  # the inputs are untouched


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_colliding_names_are_told_apart(tmp_path: Path, client: Client, zarr_format: int) -> None:
    ds = sample(np.random.default_rng(5))
    store = write_dataset(tmp_path / "ds.zarr", ds, zarr_format)
    multiply(f"{store}/A", f"{store}/S", f"{store}/G", client=client)  # (x, y) @ (y, x)
    back = open_dataset(store)
    assert back["G"].dims == ("x", "x_2")
    assert_product(back["G"].values, ds["A"].values, ds["S"].values)


def test_out_in_a_nested_group(tmp_path: Path, client: Client) -> None:
    ds = sample(np.random.default_rng(6))
    store = write_dataset(tmp_path / "ds.zarr", ds, 3)
    zarr.open_group(store, mode="r+").create_group("results")
    multiply(f"{store}/A", f"{store}/B", f"{store}/results/C", client=client)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        back = xr.open_zarr(store, group="results").load()
    assert back["C"].dims == ("x", "z")
    assert_product(back["C"].values, ds["A"].values, ds["B"].values)


def test_plain_zarr_inputs_get_default_names(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.uniform(-1, 1, (12, 8)), rng.uniform(-1, 1, (8, 10))
    out = str(tmp_path / "c.zarr")
    multiply(
        write_array(tmp_path / "a.zarr", a, (4, 4)),
        write_array(tmp_path / "b.zarr", b, (4, 4), zarr_format=2),
        out,
        client=client,
    )
    assert zarr.open_array(out).metadata.dimension_names == ("i", "j")
    assert_product(zarr.open_array(out)[:], a, b)


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        (("x", "y"), ("y", "z"), ("x", "z")),  # the usual
        ((None, None), (None, None), ("i", "j")),  # unnamed
        (("x", None), (None, None), ("x", "j")),  # one side named
        (("x", "y"), ("y", "x"), ("x", "x_2")),  # collision
        (("j", "k"), (None, None), ("j", "j_2")),  # a name meets a default
    ],
)
def test_dimension_names(
    a: tuple[str | None, str | None], b: tuple[str | None, str | None], out: tuple[str, str]
) -> None:
    assert dimension_names(a, b) == out


def test_no_shards_in_a_v2_group(tmp_path: Path) -> None:
    store = write_dataset(tmp_path / "ds.zarr", sample(np.random.default_rng(8)), 2)
    with pytest.raises(
        UsageError, match=r"shards=\(10, 5\) needs Zarr v3, but OUT goes into a Zarr v2"
    ):
        prepare(f"{store}/A", f"{store}/B", f"{store}/C", shards="10x5")


def packed(rng: np.random.Generator) -> xr.Dataset:
    ds = xr.Dataset(
        {
            "P": (("x", "y"), np.round(rng.uniform(0, 100, (6, 4)), 1)),  # packed int16
            "M": (("x", "y"), rng.integers(0, 9, (6, 4))),  # ints with a missing marker
            "B": (("y", "z"), rng.uniform(-1, 1, (4, 5))),
        }
    )
    ds["P"].encoding = {"dtype": "int16", "scale_factor": 0.1, "add_offset": 50.0}
    ds["P"].encoding["_FillValue"] = -32768  # as usual for packed data
    ds["M"].encoding = {"_FillValue": -1}
    return ds


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("P", r"A \(.*/P\) is CF-packed \(scale_factor=0\.1, add_offset=50\.0\): its stored int16 "
         r"values .* multiplied raw; unpack it first, e\.g\. xr\.open_zarr"),
        ("M", r"A \(.*/M\) marks missing elements with _FillValue=-1, which would be multiplied "
         r"as a number"),
    ],
)  # fmt: skip
def test_cf_encoded_inputs_are_refused(
    tmp_path: Path, zarr_format: int, name: str, message: str
) -> None:
    store = write_dataset(tmp_path / "ds.zarr", packed(np.random.default_rng(9)), zarr_format)
    with pytest.raises(InputError, match=message):
        prepare(f"{store}/{name}", f"{store}/B", str(tmp_path / "c.zarr"))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_unpacked_as_the_refusal_says_then_multiplied(
    tmp_path: Path, client: Client, zarr_format: int
) -> None:
    """The refusal's recipe works: decode with xarray, write the floats, multiply those."""
    ds = packed(np.random.default_rng(10))
    store = write_dataset(tmp_path / "ds.zarr", ds, zarr_format)
    unpacked = write_dataset(tmp_path / "unpacked.zarr", open_dataset(store).drop_encoding(), 3)
    out = str(tmp_path / "c.zarr")
    multiply(f"{unpacked}/P", f"{unpacked}/B", out, client=client)
    want = open_dataset(store)  # decoded: what the user means by P
    assert_product(zarr.open_array(out)[:], want["P"].values, want["B"].values)
    assert np.abs(want["P"].values - ds["P"].values).max() <= 0.05 + 1e-9  # packing rounds

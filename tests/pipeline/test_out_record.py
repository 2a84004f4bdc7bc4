"""OUT's record (pipeline/store/record.py): one typed value, stored as JSON text under the
``tilegemm`` attribute; an earlier version's nested object still read for --resume, verify and
the ownership checks; a malformed one is no record (its array is not ours); and a product in an
xarray dataset survives ``to_netcdf`` with its record readable."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client

from pipeline import multiply, verify_product
from pipeline.errors import InputError, UnfinishedOutputError, UnsafeOutputError
from pipeline.generate import write_random
from pipeline.store import owned
from pipeline.store.output import Output
from pipeline.store.record import ATTRS_KEY, MAX_RECORD_CHARS, OutRecord, of_array, parse
from pipeline.verify import check as verify
from tests.helpers import assert_product, random_matrix, write_array

FULL = OutRecord(
    fingerprint="0123456789abcdef", complete=True, verified=False, tile_shape=(8, 4),
    transpose_a=True, transpose_b=False, symmetric=True, precision="tf32", alpha=2.5, seed=7,
)  # fmt: skip
"""Every field set."""


def old_style(out: str, **changes: Any) -> dict[str, Any]:
    """Rewrite OUT's record as earlier versions stored it (a nested object, written whole as
    their ``mark`` did); returns it."""
    array = zarr.open_array(out, mode="r+")
    stored = {**of_array(array).to_dict(), **changes}  # type: ignore[union-attr]
    array.attrs[ATTRS_KEY] = stored
    return stored


def inputs(tmp_path: Path, transpose_b: bool = False) -> tuple[str, str, Any, Any]:
    """A and B big enough for several tiles (B stored transposed with ``transpose_b``)."""
    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, (600, 96), "float32"), random_matrix(rng, (96, 520), "float32")
    stored_b = np.ascontiguousarray(b.T) if transpose_b else b
    a_url = write_array(tmp_path / "a.zarr", a, (200, 32))
    return a_url, write_array(tmp_path / "b.zarr", stored_b, (32, 32)), a, b


# --- the type and its stored form ------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        FULL,
        OutRecord(),  # an empty record is still ours
        OutRecord(seed=0),  # what `random` writes
        OutRecord(fingerprint="f0", complete=False, tile_shape=(1, 1), precision="fp32"),
    ],
)
def test_a_record_round_trips_as_json_text(record: OutRecord) -> None:
    text = record.attributes()[ATTRS_KEY]
    assert isinstance(text, str) and len(text) < MAX_RECORD_CHARS
    assert parse(text) == record
    assert parse(record.to_dict()) == record  # an earlier version's nested object
    assert OutRecord.from_dict(json.loads(text)) == record


def test_the_stored_fields_are_those_earlier_versions_wrote() -> None:
    assert FULL.to_dict() == {
        "complete": True, "fingerprint": "0123456789abcdef", "tile_shape": [8, 4],
        "transpose_a": True, "symmetric": True, "precision": "tf32", "alpha": 2.5,
        "verified": False, "generated": {"seed": 7},
    }  # fmt: skip
    assert OutRecord().to_dict() == {}
    assert parse({"alpha": 2}) == OutRecord(alpha=2.0)  # a whole α reads as a float


def test_create_and_mark_write_json_text(tmp_path: Path) -> None:
    out = Output(str(tmp_path / "c.zarr"))
    out.create((4, 6), (2, 3), "float32", OutRecord(fingerprint="f0", complete=False))
    out.mark("f1", complete=True)
    out.mark("f1", verified=True)
    stored = dict(zarr.open_array(out.url, mode="r").attrs)[ATTRS_KEY]
    assert isinstance(stored, str)
    assert parse(stored) == OutRecord(fingerprint="f1", complete=True, verified=True)
    assert out.record() == parse(stored)
    assert out.state() == {"fingerprint": "f1", "complete": True, "verified": True}


def test_random_writes_its_seed(tmp_path: Path) -> None:
    url = str(tmp_path / "r.zarr")
    write_random(url, (4, 4), (2, 2), "float32", 11)
    assert isinstance(dict(zarr.open_array(url, mode="r").attrs)[ATTRS_KEY], str)
    assert Output(url).record() == OutRecord(seed=11)


# --- malformed records: not ours ---------------------------------------------------------------

MALFORMED = [
    "not ours",  # not JSON
    '{"complete": fals',  # torn JSON
    "[1, 2]",  # JSON, not an object
    '"{}"',  # a JSON string
    " " * (MAX_RECORD_CHARS + 1) + "{}",  # too long to be ours
    "[" * 2000 + "]" * 2000,  # short, but deep enough to exhaust the parser
    json.dumps({"complete": "yes"}),  # wrong type
    json.dumps({"complete": None}),
    json.dumps({"fingerprint": 7}),
    json.dumps({"fingerprint": "f" * 300}),  # longer than any fingerprint
    json.dumps({"tile_shape": [2]}),
    json.dumps({"tile_shape": [2, 0]}),
    json.dumps({"tile_shape": [True, 2]}),
    json.dumps({"tile_shape": "2x2"}),
    json.dumps({"alpha": "2"}),
    json.dumps({"alpha": True}),
    '{"alpha": NaN}',
    json.dumps({"transpose_a": 1}),
    json.dumps({"generated": 3}),
    json.dumps({"generated": {"seed": -1}}),
    json.dumps({"generated": {"seed": 1, "x": 2}}),
    json.dumps({"fingerprint": "f0", "owner": "someone else"}),  # a field we never write
    {"complete": "no"},  # an earlier version's object, of the wrong type
    {"tile_shape": [2, 3], "x": 1},
    ["complete"],
    7,
    None,
]


@pytest.mark.parametrize("value", MALFORMED)
def test_a_malformed_record_is_no_record(value: Any) -> None:
    assert parse(value) is None


@pytest.mark.parametrize("value", [m for m in MALFORMED if m is not None][::3])
def test_an_array_with_a_malformed_record_is_not_ours(tmp_path: Path, value: Any) -> None:
    """Refused as any foreign array is: not replaced, its files foreign, checked as given."""
    url = str(tmp_path / "c.zarr")
    zarr.create_array(url, shape=(4, 6), chunks=(2, 3), dtype="f4", attributes={ATTRS_KEY: value})
    (tmp_path / "c.zarr" / "lock.json").write_text("{}")
    with pytest.raises(UnsafeOutputError, match="not a Zarr array written by this tool"):
        Output(url).state()
    _, foreign = owned.entries(url, {})
    assert foreign == ["lock.json"]  # only an array of ours holds a lock
    assert verify._open_c(url, {})[1] is None  # verify: a C without our record
    owned.check_finished(zarr.open_array(url, mode="r"), "A", url)  # an input like any other
    with pytest.raises(UnsafeOutputError, match="is no record this tool wrote"):
        Output(url).mark("f0", complete=True)  # never overwritten
    assert dict(zarr.open_array(url, mode="r").attrs)[ATTRS_KEY] == value


def test_a_huge_attribute_is_refused_unread(tmp_path: Path) -> None:
    url = str(tmp_path / "c.zarr")
    huge = json.dumps({"fingerprint": "f0"}) + " " * (4 << 20)
    zarr.create_array(url, shape=(2, 2), dtype="f4", attributes={ATTRS_KEY: huge})
    with pytest.raises(UnsafeOutputError, match="not a Zarr array written by this tool"):
        Output(url).state()


# --- an earlier version's record ---------------------------------------------------------------


@pytest.mark.parametrize("transpose_b", [False, True])
def test_an_old_record_resumes_and_verifies(
    tmp_path: Path, client: Client, transpose_b: bool
) -> None:
    a_url, b_url, a, b = inputs(tmp_path, transpose_b)
    out = str(tmp_path / "c.zarr")
    first = multiply(a_url, b_url, out, client=client, transpose_b=transpose_b)
    assert first.plan.n_tiles > 1
    old = old_style(out, complete=False)  # as an interrupted run of an earlier version left it
    assert old.get("transpose_b", False) is transpose_b and "fingerprint" in old
    min((tmp_path / "c.zarr" / "journal").glob("tile-*.json")).unlink()  # one tile left to do
    assert owned.entries(out, {})[1] == []  # its journal, listings and lock are ours
    with pytest.raises(UnfinishedOutputError, match="has not finished writing"):
        verify_product(client, a_url, b_url, out)
    result = multiply(a_url, b_url, out, client=client, resume=True, transpose_b=transpose_b)
    assert (result.tiles_computed, result.tiles_skipped) == (1, first.plan.n_tiles - 1)
    assert_product(zarr.open_array(out, mode="r")[:], a, b)
    stored = dict(zarr.open_array(out, mode="r").attrs)[ATTRS_KEY]
    assert isinstance(stored, str)  # marking rewrote it in today's form
    assert parse(stored) == dataclasses.replace(parse(old), complete=True)  # type: ignore[arg-type]
    assert verify_product(client, a_url, b_url, out).passed  # transposes read from the record


def test_an_old_record_is_replaced_by_overwrite(tmp_path: Path) -> None:
    url = str(tmp_path / "r.zarr")
    write_random(url, (4, 4), (2, 2), "float32", 1)
    zarr.open_array(url, mode="r+").attrs[ATTRS_KEY] = {"generated": {"seed": 1}}  # old style
    assert Output(url).record() == OutRecord(seed=1)
    write_random(url, (4, 4), (2, 2), "float32", 2, overwrite=True)
    assert Output(url).record() == OutRecord(seed=2)


def test_an_old_unfinished_product_is_refused_as_an_input(tmp_path: Path) -> None:
    url = write_array(tmp_path / "c.zarr", np.zeros((2, 2)), (2, 2))
    zarr.open_array(url, mode="r+").attrs[ATTRS_KEY] = {"complete": False, "fingerprint": "f"}
    with pytest.raises(InputError, match="unfinished product of this tool"):
        owned.check_finished(zarr.open_array(url, mode="r"), "A", url)


# --- xarray and netCDF -----------------------------------------------------------------------


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_product_in_a_dataset_saves_to_netcdf(
    tmp_path: Path, client: Client, zarr_format: int
) -> None:
    rng = np.random.default_rng(zarr_format)
    ds = xr.Dataset(
        {
            "A": (("x", "y"), rng.uniform(-1, 1, (12, 8))),
            "B": (("y", "z"), rng.uniform(-1, 1, (8, 10))),
        }
    )
    store = str(tmp_path / "ds.zarr")
    with warnings.catch_warnings():  # xarray consolidates v3 metadata; zarr says so
        warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
        ds.to_zarr(store, zarr_format=zarr_format, mode="w", consolidated=True)
        multiply(f"{store}/A", f"{store}/B", f"{store}/C", client=client)
        back = xr.open_zarr(store).load()
    written = parse(back["C"].attrs[ATTRS_KEY])
    assert written is not None and written.complete is True
    path = tmp_path / "ds.nc"
    back.to_netcdf(path, engine="scipy")  # netCDF3: flat attributes only
    with xr.open_dataset(path, engine="scipy") as saved:
        assert parse(saved["C"].attrs[ATTRS_KEY]) == written
        assert_product(saved["C"].values, ds["A"].values, ds["B"].values)

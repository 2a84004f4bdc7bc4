"""xarray's coordinates beside the operands: a contraction over a dimension whose coordinates
differ is refused; OUT written into a folder the job makes is a Zarr group xarray opens."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from pipeline import prepare
from pipeline.errors import InputError
from pipeline.store import coordinates, door, groups
from pipeline.store.coordinates import sibling
from pipeline.store.output import Output
from tests.helpers import run_cli

T = 12


def write(path: Path, ds: xr.Dataset, **kwargs: object) -> str:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds.to_zarr(str(path), mode="w", **kwargs)  # type: ignore[call-overload]
    return str(path)


def pair(
    tmp_path: Path, time_b: object, zarr_format: int = 3, time_a: object = None
) -> tuple[str, str]:
    """X (time, lat) and Y (time, lon), each in a dataset of its own with ``time`` beside."""
    rng = np.random.default_rng(0)
    time_a = np.arange(T) if time_a is None else time_a
    x = xr.Dataset({"X": (("time", "lat"), rng.random((T, 3)))}, coords={"time": time_a})
    y = xr.Dataset({"Y": (("time", "lon"), rng.random((T, 4)))}, coords={"time": time_b})
    one = write(tmp_path / "x.zarr", x, zarr_format=zarr_format)
    two = write(tmp_path / "y.zarr", y, zarr_format=zarr_format)
    return f"{one}/X", f"{two}/Y"


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_different_coordinates_are_refused_naming_the_first(
    tmp_path: Path, zarr_format: int
) -> None:
    shifted = np.arange(T).astype(float)
    shifted[5:] += 0.5
    x, y = pair(tmp_path, shifted, zarr_format)
    with pytest.raises(InputError) as caught:
        prepare(x, y, str(tmp_path / "c.zarr"), transpose_a=True)
    text = str(caught.value)
    assert "'time'" in text and "differ at 7 of 12 positions, first at index 5: 5 " in text
    assert "5.5" in text
    assert "ignore_coordinates=True" in text or "--ignore-coordinates" in text
    assert not os.path.exists(tmp_path / "c.zarr")  # nothing written


def test_equal_coordinates_and_the_option_pass(tmp_path: Path) -> None:
    x, y = pair(tmp_path, np.arange(T))
    prepare(x, y, str(tmp_path / "c.zarr"), transpose_a=True)
    x2, y2 = pair(tmp_path / "other", np.arange(T) + 365)
    prepare(x2, y2, str(tmp_path / "c.zarr"), transpose_a=True, ignore_coordinates=True)


def test_the_cli_refuses_with_exit_2_and_the_flag(tmp_path: Path) -> None:
    x, y = pair(tmp_path, np.arange(T) + 365)
    out = tmp_path / "c.zarr"
    done = run_cli("multiply", x, y, str(out), "--transpose-a")
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: A's dimension 'time' and B's dimension 'time'")
    assert "first at index 0: 0 " in line and "365" in line and "--ignore-coordinates" in line
    assert not out.exists()
    done = run_cli("multiply", x, y, str(out), "--transpose-a", "--ignore-coordinates")
    assert done.returncode == 0, done.stderr


def test_times_in_other_units_compare_as_times(tmp_path: Path) -> None:
    times = np.datetime64("2000-01-01") + np.arange(T).astype("timedelta64[D]")
    rng = np.random.default_rng(1)
    x = xr.Dataset({"X": (("time", "lat"), rng.random((T, 3)))}, coords={"time": times})
    y = xr.Dataset({"Y": (("time", "lon"), rng.random((T, 4)))}, coords={"time": times})
    hours = {"time": {"units": "hours since 1999-01-01"}}
    a = write(tmp_path / "x.zarr", x) + "/X"
    b = write(tmp_path / "y.zarr", y, encoding=hours) + "/Y"
    prepare(a, b, str(tmp_path / "c.zarr"), transpose_a=True)  # the same times: no refusal
    later = y.assign_coords(time=times + np.timedelta64(1, "D"))
    b = write(tmp_path / "later.zarr", later, encoding=hours) + "/Y"
    with pytest.raises(InputError, match="first at index 0: 2000-01-01 .* against 2000-01-02"):
        prepare(a, b, str(tmp_path / "c.zarr"), transpose_a=True)


def test_encodings_that_cannot_be_compared_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = xr.Dataset({"X": (("time", "lat"), rng.random((T, 3)))}, coords={"time": np.arange(T)})
    y = xr.Dataset({"Y": (("time", "lon"), rng.random((T, 4)))}, coords={"time": np.arange(T)})
    a = write(tmp_path / "x.zarr", x) + "/X"
    b = write(tmp_path / "y.zarr", y) + "/Y"
    zarr.open_array(str(tmp_path / "y.zarr/time"), mode="r+").attrs["units"] = "months"
    with pytest.raises(InputError, match="different encodings"):
        prepare(a, b, str(tmp_path / "c.zarr"), transpose_a=True)


def test_long_coordinates_are_compared_block_by_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinates, "BLOCK_BYTES", 40)  # 5 float64 values a read
    changed = np.arange(T).astype(float)
    changed[[3, 11]] = np.nan, -1.0  # a NaN on one side only differs too
    x, y = pair(tmp_path, changed)
    with pytest.raises(InputError, match="differ at 2 of 12 positions, first at index 3"):
        prepare(x, y, str(tmp_path / "c.zarr"), transpose_a=True)
    both = np.arange(T).astype(float)
    both[3] = np.nan
    x, y = pair(tmp_path / "nan", both, time_a=both)
    prepare(x, y, str(tmp_path / "c.zarr"), transpose_a=True)  # NaN meets NaN: equal


def test_unrelated_or_missing_coordinates_are_not_checked(tmp_path: Path) -> None:
    x, y = pair(tmp_path, np.arange(T) + 1)
    os.rename(Path(y.rsplit("/", 1)[0]) / "time", tmp_path / "time-moved")
    prepare(x, y, str(tmp_path / "c.zarr"), transpose_a=True)  # B has none beside it
    gram = pair(tmp_path / "g", np.arange(T) + 1)[0]
    prepare(gram, gram, str(tmp_path / "g.zarr"), transpose_a=True)  # X with itself


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/d/ds.zarr/X", "/d/ds.zarr/time"),
        ("s3://bucket/ds.zarr/X", "s3://bucket/ds.zarr/time"),
        ("s3://bucket/X", "s3://bucket/time"),
        ("s3://bucket", None),
        ("zip://ds/X::/d/a.zip", "zip://ds/time::/d/a.zip"),
        ("zip://X::/d/a.zip", "zip://time::/d/a.zip"),
    ],
)
def test_sibling(url: str, expected: str | None) -> None:
    assert sibling(url, "time") == expected


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "/etc/passwd", "a/b", "s3:x", "a\\b"])
def test_a_dimension_name_that_is_a_path_names_no_sibling(name: str) -> None:
    assert sibling("/d/ds.zarr/X", name) is None


def test_out_in_a_new_folder_is_a_group_xarray_opens(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    ds = xr.Dataset(
        {"X": (("time", "lat"), rng.random((T, 3))), "Y": (("time", "lon"), rng.random((T, 4)))}
    )
    store = write(tmp_path / "ds.zarr", ds)
    res = tmp_path / "res.zarr"
    done = run_cli("multiply", f"{store}/X", f"{store}/Y", f"{res}/C", "--transpose-a")
    assert done.returncode == 0, done.stderr
    assert json.loads((res / "zarr.json").read_text())["node_type"] == "group"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata there, listing C
        c = xr.open_zarr(str(res))["C"].load()
    assert c.dims == ("lat", "lon")
    np.testing.assert_allclose(c.values, ds.X.values.T @ ds.Y.values, rtol=1e-12)


def test_a_failed_job_takes_its_new_group_away(tmp_path: Path) -> None:
    res = tmp_path / "deeper" / "res.zarr"
    out = Output(str(res / "C"), {})
    with pytest.raises(RuntimeError), out.claim(None, overwrite=False, resume=False):
        assert json.loads((res / "zarr.json").read_text())["node_type"] == "group"
        raise RuntimeError("the job fails before writing anything")
    assert not (tmp_path / "deeper").exists()


def test_a_group_document_not_ours_stays(tmp_path: Path) -> None:
    out = tmp_path / "res.zarr" / "C"
    made = [door.Made(str(tmp_path / "res.zarr"), (0, 0)), door.Made(str(out), (0, 0))]
    os.makedirs(out)
    group = groups.new_group(str(out), made)
    assert group is not None
    os.rmdir(out)
    replaced = tmp_path / "res.zarr" / "zarr.json"
    os.unlink(replaced)
    replaced.write_text('{"theirs": true}')  # another writer's document, same name
    group.close()
    assert replaced.read_text() == '{"theirs": true}'
    assert groups.new_group(str(out), made) is None  # a document there already: not ours


def test_an_existing_parent_gets_no_group(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    out = Output(str(tmp_path / "plain" / "c.zarr"), {})
    with out.claim(None, overwrite=False, resume=False):
        pass
    assert os.listdir(tmp_path / "plain") == []


def by_hand(folder: Path, name: str, time: np.ndarray, attrs: dict[str, str]) -> str:
    """A v3 group as xarray lays one out: ``name`` (time x lat) and the ``time`` beside it."""
    group = zarr.open_group(str(folder), mode="w", zarr_format=3)
    variable = group.create_array(
        name, shape=(len(time), 3), dtype="f8", dimension_names=("time", "lat")
    )
    variable[:] = 1.0
    with warnings.catch_warnings():  # zarr: strings and records have no v3 spec yet
        warnings.filterwarnings("ignore", message="The data type")
        coordinate = group.create_array("time", shape=time.shape, dtype=time.dtype)
        coordinate[:] = time
        coordinate.attrs.update(attrs)
    return f"{folder}/{name}"


def test_cf_times_far_apart_never_wrap_into_equal(tmp_path: Path) -> None:
    days = {"units": "days since 2000-01-01"}
    a = by_hand(tmp_path / "a.zarr", "X", np.arange(6), days)
    hours = {"units": "hours since 2000-01-01"}
    far = by_hand(tmp_path / "b.zarr", "Y", 2**51 + 24 * np.arange(6), hours)  # wraps in ns
    with pytest.raises(InputError, match="differ at 6 of 6 positions"):
        prepare(a, far, str(tmp_path / "c.zarr"), transpose_a=True)
    beyond = by_hand(tmp_path / "d.zarr", "Y", 2**61 + 24 * np.arange(6), hours)
    with pytest.raises(InputError, match="cannot be compared .* beyond datetime64's"):
        prepare(a, beyond, str(tmp_path / "c.zarr"), transpose_a=True)


def test_cf_times_from_year_one_and_in_utc(tmp_path: Path) -> None:
    early = {"units": "days since 0001-01-01", "calendar": "proleptic_gregorian"}
    offset = int((np.datetime64("2000-01-01") - np.datetime64("0001-01-01")).astype(int))
    a = by_hand(tmp_path / "a.zarr", "X", offset + np.arange(6), early)
    utc = {"units": "hours since 2000-01-01 00:00:00 UTC"}
    b = by_hand(tmp_path / "b.zarr", "Y", 24 * np.arange(6), utc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's time-zone warning is not let out
        prepare(a, b, str(tmp_path / "c.zarr"), transpose_a=True)  # the same six days
    later = by_hand(tmp_path / "d.zarr", "Y", 24 * np.arange(1, 7), utc)
    with pytest.raises(InputError, match="first at index 0: 2000-01-01 .* against 2000-01-02 "):
        prepare(a, later, str(tmp_path / "c.zarr"), transpose_a=True)


def test_a_coordinate_of_records_is_not_compared(tmp_path: Path) -> None:
    pairs = np.zeros(6, dtype=[("x", "i4"), ("y", "i4")])
    a = by_hand(tmp_path / "a.zarr", "X", np.arange(6.0), {})
    b = by_hand(tmp_path / "b.zarr", "Y", pairs, {})
    done = run_cli("multiply", a, b, str(tmp_path / "c.zarr"), "--transpose-a", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr


def test_a_coordinate_of_long_fixed_strings_is_not_read(tmp_path: Path) -> None:
    long = np.array([f"{i}" * 300 for i in range(6)])  # 1,200 bytes an element
    a = by_hand(tmp_path / "a.zarr", "X", long, {})
    b = by_hand(tmp_path / "b.zarr", "Y", long[::-1].copy(), {})
    prepare(a, b, str(tmp_path / "c.zarr"), transpose_a=True)  # not compared: not refused


def test_a_coordinate_chunk_that_lies_is_named(tmp_path: Path) -> None:
    a = by_hand(tmp_path / "a.zarr", "X", np.arange(6), {})
    b = by_hand(tmp_path / "b.zarr", "Y", np.arange(6), {})
    chunk = tmp_path / "b.zarr" / "time" / "c" / "0"
    chunk.write_bytes(chunk.read_bytes() + b"\0" * 64)  # longer than 6 int64 can be
    with pytest.raises(InputError, match=r"B's dimension 'time''s coordinate array .*b\.zarr/time"):
        prepare(a, b, str(tmp_path / "c.zarr"), transpose_a=True)


def test_random_in_a_group_names_its_dimensions_for_xarray(tmp_path: Path) -> None:
    store = write(tmp_path / "ds.zarr", xr.Dataset({"X": (("obs", "var"), np.ones((4, 3)))}))
    for out in (f"{store}/R", str(tmp_path / "new.zarr" / "A")):
        done = run_cli("random", out, "--shape", "4x5", "--chunks", "2x2", "--seed", "1")
        assert done.returncode == 0, done.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert xr.open_zarr(store)["R"].dims == ("R_i", "R_j")
        assert xr.open_zarr(str(tmp_path / "new.zarr"))["A"].dims == ("A_i", "A_j")
    assert zarr.open_array(str(tmp_path / "alone.zarr"), mode="w", shape=(1,)).ndim == 1
    done = run_cli("random", str(tmp_path / "r.zarr"), "--shape", "4x5", "--chunks", "2x2")
    assert zarr.open_array(str(tmp_path / "r.zarr")).metadata.dimension_names is None

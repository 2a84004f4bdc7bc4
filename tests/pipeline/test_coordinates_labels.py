"""Coordinates of labels and of times with gaps (pipeline/store/coordinates.py,
pipeline/store/labels.py): strings of every kind zarr and xarray write, in Zarr v2 and v3, are
compared as numbers are, each chunk decoded within what its labels can take; NaT meets NaT as
NaN meets NaN."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Literal

import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr

from pipeline.errors import InputError
from pipeline.store import coordinates, inputs, labels
from pipeline.store.coordinates import check_contracted
from tests.helpers import refused, run_cli

N = 8
NAMES = np.array([f"s{i}" for i in range(N)])
OTHER = np.where(np.arange(N) == 3, "zz", NAMES)  # differs at index 3 only
DAYS = np.datetime64("2000-01-01") + np.arange(N).astype("m8[D]")
GAPPED = np.where(np.arange(N) == 2, np.datetime64("NaT"), DAYS)  # NaT at index 2
# seconds with NaT at index 4
SECONDS = np.where(np.arange(N) == 4, np.timedelta64("NaT"), np.arange(N).astype("m8[s]"))


def written(folder: Path, values: Any, zarr_format: int, **encoding: Any) -> str:
    """An N x N variable ``V`` over (t, i) and its coordinate ``t``, as xarray writes them."""
    ds = xr.Dataset({"V": (("t", "i"), np.ones((N, N)))}, coords={"t": values})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: strings have no v3 spec; consolidated metadata
        ds.to_zarr(str(folder), mode="w", zarr_format=zarr_format, encoding={"t": encoding})
    return f"{folder}/V"


def stored(folder: Path, values: Any, zarr_format: int, dtype: Any = None, **kwargs: Any) -> str:
    """The same laid out with zarr itself: the coordinate of ``dtype`` as zarr stores it."""
    version: Literal[2, 3] = 3 if zarr_format == 3 else 2
    group = zarr.open_group(str(folder), mode="w", zarr_format=version)
    named = {"dimension_names": ("t", "i")} if zarr_format == 3 else {"fill_value": None}
    variable = group.create_array("V", shape=(N, N), dtype="f8", **named)
    variable[:] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: strings and times have no v3 spec yet
        coordinate = group.create_array(
            "t", shape=(N,), dtype=values.dtype if dtype is None else dtype, **kwargs
        )
        coordinate[:] = values
    if zarr_format == 2:
        variable.attrs["_ARRAY_DIMENSIONS"] = ["t", "i"]
        coordinate.attrs["_ARRAY_DIMENSIONS"] = ["t"]
    return f"{folder}/V"


def compare(a: str, b: str) -> None:
    """op(A)·op(B) = Aᵀ·B: both operands' ``t`` summed over."""
    arrays = [inputs.open_input(url, None, name) for url, name in ((a, "A"), (b, "B"))]
    check_contracted(arrays, (a, b), (True, False))


WRITERS = [
    # xarray: Python strings (object) become zarr's variable-length strings
    pytest.param("xarray", object, id="xarray-object"),
    pytest.param("xarray", np.dtypes.StringDType(), id="xarray-StringDType"),
    pytest.param("xarray", "<U2", id="xarray-U2"),
    # zarr: `str` and numpy's StringDType are its variable-length strings
    pytest.param("zarr", str, id="zarr-str"),
    pytest.param("zarr", np.dtypes.StringDType(), id="zarr-StringDType"),
    pytest.param("zarr", "<U2", id="zarr-U2"),
]


def label_pair(tmp_path: Path, writer: str, dtype: Any, zarr_format: int) -> tuple[str, ...]:
    """A over NAMES and, beside it, B over NAMES (equal) and C over OTHER (differs at 3)."""
    made = []
    for name, values in (("a", NAMES), ("b", NAMES), ("c", OTHER)):
        folder = tmp_path / f"{name}.zarr"
        if writer == "xarray":
            made.append(written(folder, values.astype(dtype), zarr_format))
        else:
            made.append(stored(folder, values, zarr_format, dtype))
    return tuple(made)


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize(("writer", "dtype"), WRITERS)
def test_string_labels_of_every_writer_are_compared(
    tmp_path: Path, writer: str, dtype: Any, zarr_format: int
) -> None:
    a, same, other = label_pair(tmp_path, writer, dtype, zarr_format)
    compare(a, same)  # equal labels: no refusal
    with pytest.raises(InputError, match=r"differ at 1 of 8 positions, first at index 3: 's3' "):
        compare(a, other)


def test_differing_v3_strings_are_refused_by_the_cli_and_equal_ones_pass(tmp_path: Path) -> None:
    a, same, other = label_pair(tmp_path, "xarray", object, 3)
    out = str(tmp_path / "out.zarr")
    line = refused(run_cli("multiply", a, other, out, "--transpose-a", "--dry-run"))
    assert line.startswith("error: A's dimension 't' and B's dimension 't', which the product")
    where = [f"{tmp_path}/{name}.zarr/t" for name in "ac"]
    assert f"first at index 3: 's3' ({where[0]}) against 'zz' ({where[1]})" in line
    done = run_cli("multiply", a, same, out, "--transpose-a", "--dry-run")
    assert done.returncode == 0, done.stderr


def test_variable_length_bytes_are_compared(tmp_path: Path) -> None:
    a = stored(tmp_path / "a.zarr", NAMES.astype("S").astype(object), 3, "bytes")
    b = stored(tmp_path / "b.zarr", OTHER.astype("S").astype(object), 3, "bytes")
    with pytest.raises(InputError, match=r"first at index 3: b's3' .* against b'zz' "):
        compare(a, b)


GAPS = [
    # zarr's own datetime64 and timedelta64
    pytest.param("stored", 3, GAPPED.astype("M8[ns]"), GAPPED, {}, id="datetime64-v3"),
    pytest.param("stored", 2, GAPPED.astype("M8[ns]"), GAPPED, {}, id="datetime64-v2"),
    pytest.param("stored", 3, SECONDS, SECONDS, {}, id="timedelta64-v3"),
    pytest.param("stored", 2, SECONDS, SECONDS, {}, id="timedelta64-v2"),
    # xarray's CF times, NaT stored as int64's least: decoded where the units differ
    pytest.param("written", 3, GAPPED, GAPPED, {"units": "hours since 2000-01-01"}, id="cf-v3"),
    pytest.param("written", 2, GAPPED, GAPPED, {"units": "hours since 2000-01-01"}, id="cf-v2"),
    pytest.param("written", 3, GAPPED, GAPPED, {}, id="cf-same-units"),
    pytest.param("written", 3, SECONDS, SECONDS.astype("m8[ms]"), {"units": "milliseconds"},
                 id="cf-durations-v3"),
    pytest.param("written", 2, SECONDS, SECONDS.astype("m8[ms]"), {"units": "milliseconds"},
                 id="cf-durations-v2"),
]  # fmt: skip
"""(writer, zarr_format, A's times, B's, B's encoding): NaT at the same places."""


def gap_pair(
    tmp_path: Path, how: str, zarr_format: int, a: Any, b: Any, encoding: dict[str, str]
) -> tuple[str, str]:
    folders = tmp_path / "a.zarr", tmp_path / "b.zarr"
    if how == "stored":
        return stored(folders[0], a, zarr_format), stored(folders[1], b, zarr_format)
    return written(folders[0], a, zarr_format), written(folders[1], b, zarr_format, **encoding)


@pytest.mark.parametrize(("how", "zarr_format", "a", "b", "encoding"), GAPS)
def test_nat_at_the_same_places_is_equal(
    tmp_path: Path, how: str, zarr_format: int, a: Any, b: Any, encoding: dict[str, str]
) -> None:
    compare(*gap_pair(tmp_path, how, zarr_format, a, b, encoding))


@pytest.mark.parametrize(("how", "zarr_format", "a", "b", "encoding"), GAPS)
def test_nat_against_a_time_is_refused_naming_it(
    tmp_path: Path, how: str, zarr_format: int, a: Any, b: Any, encoding: dict[str, str]
) -> None:
    gap = int(np.flatnonzero(np.isnat(b))[0])
    whole = b.copy()
    whole[gap] = b[gap + 1] - (b[gap + 2] - b[gap + 1])  # the time missing there
    a_url, b_url = gap_pair(tmp_path, how, zarr_format, a, whole, encoding)
    with pytest.raises(InputError, match=f"differ at 1 of 8 positions, first at index {gap}: NaT "):
        compare(a_url, b_url)


def test_cf_durations_in_other_units_compare_as_durations(tmp_path: Path) -> None:
    millis = {"units": "milliseconds"}
    a = written(tmp_path / "a.zarr", SECONDS, 3)
    later = SECONDS.astype("m8[ms]") + np.timedelta64(1, "ms")
    b = written(tmp_path / "b.zarr", later, 3, **millis)
    with pytest.raises(InputError, match=r"first at index 0: 0 milliseconds .* against 1 milli"):
        compare(a, b)


def test_nat_equals_nat_only_between_times_of_one_kind() -> None:
    dates = np.array(["NaT", "2000-01-01", "NaT"], dtype="M8[D]")
    assert coordinates._equal(dates, dates.astype("M8[s]")).tolist() == [True, True, True]
    spans = np.array(["NaT", 1, "NaT"], dtype="m8[s]")
    assert coordinates._equal(spans, spans).tolist() == [True, True, True]
    assert coordinates._equal(spans, dates).tolist() == [False, False, False]


def test_cf_nat_decodes_to_nat_and_durations_to_timedelta64() -> None:
    days = coordinates._decoder({"units": "days since 2000-01-01"}, "s")
    assert days is not None
    assert [str(t) for t in days(np.array([1, coordinates.NAT]))] == ["2000-01-02T00:00:00", "NaT"]
    assert [str(t) for t in days(np.array([np.nan, 2.0]))] == ["NaT", "2000-01-03T00:00:00"]
    seconds = coordinates._decoder({"units": "seconds"}, "ms")
    assert seconds is not None
    spans = seconds(np.array([2, coordinates.NAT]))
    assert spans.dtype == np.dtype("m8[ms]")
    assert [str(t) for t in spans] == ["2000 milliseconds", "NaT"]
    assert coordinates._value(np.timedelta64(5, "s")) == "5 seconds"
    assert coordinates._value(np.timedelta64("NaT")) == "NaT"


# Every chunk of labels decodes within what its labels can take.


def chunk_file(url: str, zarr_format: int) -> Path:
    return Path(url).parent / "t" / ("c/0" if zarr_format == 3 else "0")


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("dtype", [str, "<U2"])
def test_a_label_chunk_decoding_past_its_labels_is_refused_undecoded(
    tmp_path: Path, dtype: Any, zarr_format: int
) -> None:
    zstd = [zarr.codecs.ZstdCodec()] if zarr_format == 3 else [numcodecs.Zstd()]
    a = stored(tmp_path / "a.zarr", NAMES, zarr_format, dtype, compressors=zstd)
    b = stored(tmp_path / "b.zarr", NAMES, zarr_format, dtype, compressors=zstd)
    bomb = numcodecs.Zstd().encode(np.zeros(1 << 20, np.uint8))  # 1 MiB in a few bytes
    chunk_file(b, zarr_format).write_bytes(bomb)
    declares = "a stored zstd chunk declares 1,048,576 bytes where it decodes into 8 labels"
    with pytest.raises(InputError, match=f"coordinate array .* cannot be read: {declares}"):
        compare(a, b)


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_a_variable_length_chunk_counting_more_labels_is_refused_unread(
    tmp_path: Path, zarr_format: int
) -> None:
    """numcodecs would fill an object array of 2**31 labels (16 GiB) for these 8 bytes."""
    a = stored(tmp_path / "a.zarr", NAMES, zarr_format, str, compressors=None)
    b = stored(tmp_path / "b.zarr", NAMES, zarr_format, str, compressors=None)
    chunk_file(b, zarr_format).write_bytes((2**31 - 1).to_bytes(4, "little") + bytes(4))
    with pytest.raises(InputError, match="counting 2,147,483,647 labels where its chunk holds 8"):
        compare(a, b)


def test_labels_in_a_layout_not_capped_are_not_compared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = stored(tmp_path / "a.zarr", NAMES, 3, str, shards=(N,), chunks=(N // 2,))
    b = stored(tmp_path / "b.zarr", OTHER, 3, str, shards=(N,), chunks=(N // 2,))
    with caplog.at_level(logging.DEBUG, logger="pipeline"):
        compare(a, b)  # sharded: not read, so not refused
    assert f"coordinate {tmp_path}/a.zarr/t of A not compared: its codecs" in caplog.messages


def test_a_chunk_of_more_labels_than_one_decode_holds_is_not_read(tmp_path: Path) -> None:
    huge = labels.CHUNK_BYTES // 4  # four bytes a count: even empty labels are too many
    a = stored(tmp_path / "a.zarr", NAMES, 3, str, chunks=(huge,))
    assert labels.capped(inputs.open_input(a.replace("/V", "/t")), 256) is None

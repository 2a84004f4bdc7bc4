"""The contracted dimension's coordinates (pipeline/store/coordinates.py) called directly on
the opened operands: for every combination of transposes, the dimension summed over on each
side is the one compared, not the other one beside it (benchmarks/mutate.py, target
coordinates)."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from pipeline.errors import InputError
from pipeline.store import coordinates, inputs
from pipeline.store.coordinates import check_contracted

N = 4
SAME = np.arange(N) * 10  # the contracted dimension "t" on both sides
OTHER = 100 + np.arange(N)  # the free dimensions: of the same length, other values


def operand(
    folder: Path, dims: tuple[str, str], coords: dict[str, Any], attrs: dict[str, Any] | None = None
) -> tuple[Any, str]:
    """An N x N variable named ``V`` with ``dims`` and, beside it in its group, the 1-D
    coordinate arrays ``coords``; the opened variable and its URL."""
    group = zarr.open_group(str(folder), mode="w", zarr_format=3)
    variable = group.create_array("V", shape=(N, N), dtype="f8", dimension_names=dims)
    variable[:] = 1.0
    with warnings.catch_warnings():  # zarr: strings have no v3 spec yet
        warnings.filterwarnings("ignore", message="The data type")
        for name, values in coords.items():
            values = np.asarray(values)
            array = group.create_array(name, shape=values.shape, dtype=values.dtype)
            array[:] = values
            array.attrs.update((attrs or {}).get(name, {}))
    url = f"{folder}/V"
    return inputs.open_input(url, None, "A"), url


def layout(transposed: bool, contracted: str, free: str, b_side: bool) -> tuple[str, str]:
    """An operand's dimension order: the contracted one where op() sums it (A: its columns,
    B: its rows; read transposed: the other axis)."""
    at_start = transposed != b_side  # A sums axis 1 (axis 0 transposed), B axis 0 (1)
    return (contracted, free) if at_start else (free, contracted)


TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]


def check(
    tmp_path: Path,
    transposed: tuple[bool, bool],
    t_a: Any,
    t_b: Any,
    free_a: Any = OTHER,
    free_b: Any = OTHER,
    **kwargs: Any,
) -> None:
    a, a_url = operand(
        tmp_path / "a.zarr", layout(transposed[0], "t", "i", False), {"t": t_a, "i": free_a},
        kwargs.get("attrs_a"),
    )  # fmt: skip
    b, b_url = operand(
        tmp_path / "b.zarr", layout(transposed[1], "t", "j", True), {"t": t_b, "j": free_b},
        kwargs.get("attrs_b"),
    )  # fmt: skip
    check_contracted([a, b], (a_url, b_url), transposed)


@pytest.mark.parametrize("transposed", TRANSPOSES)
def test_the_summed_dimensions_are_compared_not_the_free_ones(
    tmp_path: Path, transposed: tuple[bool, bool]
) -> None:
    """``t`` agrees; ``i`` and ``j`` (same length) hold other values: no refusal."""
    check(tmp_path, transposed, SAME, SAME)


@pytest.mark.parametrize("transposed", TRANSPOSES)
def test_a_summed_dimension_that_differs_is_refused_naming_both(
    tmp_path: Path, transposed: tuple[bool, bool]
) -> None:
    """``t`` differs at its last place; the free dimensions agree with A's ``t``."""
    late = SAME.copy()
    late[-1] = 99
    with pytest.raises(InputError) as refused:
        check(tmp_path, transposed, SAME, late, free_a=SAME, free_b=SAME)
    text = str(refused.value)
    assert text.startswith("A's dimension 't' and B's dimension 't', which the product sums")
    assert f"differ at 1 of {N} positions, first at index {N - 1}: 30 (" in text
    assert f"{tmp_path / 'a.zarr' / 't'}) against 99 ({tmp_path / 'b.zarr' / 't'})" in text
    assert text.endswith(
        "xarray would not align them. Select matching ranges first (e.g. ds.sel(...) for "
        "both), or pass --ignore-coordinates to multiply them by position"
    )


@pytest.mark.parametrize("transposed", TRANSPOSES)
def test_only_a_summed_dimension_with_coordinates_on_both_sides_is_checked(
    tmp_path: Path, transposed: tuple[bool, bool]
) -> None:
    """A's ``t`` has no array beside it; its free dimension does, and differs from B's ``t``."""
    a, a_url = operand(tmp_path / "a.zarr", layout(transposed[0], "t", "i", False), {"i": OTHER})
    b, b_url = operand(tmp_path / "b.zarr", layout(transposed[1], "t", "j", True), {"t": SAME})
    check_contracted([a, b], (a_url, b_url), transposed)
    check_contracted([b, a], (b_url, a_url), transposed[::-1])


def test_a_coordinate_of_another_length_is_not_compared(tmp_path: Path) -> None:
    a, a_url = operand(tmp_path / "a.zarr", ("i", "t"), {"t": np.arange(N + 1)})
    b, b_url = operand(tmp_path / "b.zarr", ("t", "j"), {"t": np.arange(N) + 7})
    check_contracted([a, b], (a_url, b_url), (False, False))
    a, a_url = operand(tmp_path / "c.zarr", ("i", "t"), {"t": np.arange(N)})
    b, b_url = operand(tmp_path / "d.zarr", ("t", "j"), {"t": np.arange(N - 1)})
    check_contracted([a, b], (a_url, b_url), (False, False))


def test_a_coordinate_of_two_dimensions_is_not_compared(tmp_path: Path) -> None:
    a, a_url = operand(tmp_path / "a.zarr", ("i", "t"), {"t": np.arange(N)})
    b, b_url = operand(tmp_path / "b.zarr", ("t", "j"), {"t": np.ones((N, 1))})
    check_contracted([a, b], (a_url, b_url), (False, False))


def test_strings_and_bytes_are_compared(tmp_path: Path) -> None:
    names = np.array(["w", "x", "y", "z"])
    with pytest.raises(InputError, match="first at index 2: 'y' .* against 'q' "):
        check(tmp_path, (False, False), names, np.array(["w", "x", "q", "z"]))
    with pytest.raises(InputError, match="first at index 0: b'a' .* against b'b' "):
        check(tmp_path / "b", (False, False), np.array([b"a"] * N), np.array([b"b"] * N))


def test_an_integer_coordinate_says_its_units(tmp_path: Path) -> None:
    """Both in the same units: the values are shown in them."""
    attrs = {"t": {"units": "days since 2000-01-01", "calendar": "noleap"}}
    with pytest.raises(InputError, match=r"first at index 0: 0 days since 2000-01-01 \(.*"
                       r"against 5 days since 2000-01-01 \("):  # fmt: skip
        check(tmp_path, (False, False), SAME, SAME + 5, attrs_a=attrs, attrs_b=attrs)


def test_times_in_other_units_are_compared_as_times(tmp_path: Path) -> None:
    days = {"t": {"units": "days since 2000-01-01"}}
    hours = {"t": {"units": "hours since 2000-01-01T00:00:00Z"}}
    check(tmp_path, (False, True), np.arange(N), 24 * np.arange(N), attrs_a=days, attrs_b=hours)
    with pytest.raises(InputError, match="first at index 1: 2000-01-02 .* against 2000-01-01T01"):
        check(tmp_path / "b", (False, True), np.arange(N), np.arange(N),
              attrs_a=days, attrs_b=hours)  # fmt: skip


def test_times_in_milliseconds_keep_their_resolution(tmp_path: Path) -> None:
    """One side in seconds, one in milliseconds: a millisecond apart is a difference."""
    seconds = {"t": {"units": "seconds since 2000-01-01"}}
    millis = {"t": {"units": "milliseconds since 2000-01-01"}}
    check(tmp_path, (False, False), np.arange(N), 1000 * np.arange(N),
          attrs_a=seconds, attrs_b=millis)  # fmt: skip
    off = 1000 * np.arange(N)
    off[2] += 1
    with pytest.raises(InputError, match=r"differ at 1 of 4 positions, first at index 2: "
                       r"2000-01-01T00:00:02 .* against 2000-01-01T00:00:02\.001 "):  # fmt: skip
        check(tmp_path / "b", (False, False), np.arange(N), off, attrs_a=seconds, attrs_b=millis)


def test_whole_float_times_are_decoded_and_fractions_refused(tmp_path: Path) -> None:
    days = {"t": {"units": "days since 2000-01-01"}}
    hours = {"t": {"units": "hours since 2000-01-01"}}
    check(tmp_path, (False, False), np.arange(N) * 1.0, 24.0 * np.arange(N),
          attrs_a=days, attrs_b=hours)  # fmt: skip
    with pytest.raises(InputError, match=r"cannot be compared .*float64 times in days are not "
                       r"whole numbers\); write both alike"):  # fmt: skip
        check(tmp_path / "b", (False, False), np.arange(N) + 0.5, 24 * np.arange(N),
              attrs_a=days, attrs_b=hours)  # fmt: skip


def test_different_calendars_cannot_be_decoded_and_are_refused(tmp_path: Path) -> None:
    noleap = {"t": {"units": "days since 2000-01-01", "calendar": "noleap"}}
    hours = {"t": {"units": "hours since 2000-01-01"}}
    with pytest.raises(InputError, match=r"stored in different encodings \(units 'days since "
                       r"2000-01-01', calendar 'noleap' against units 'hours since 2000-01-01'"
                       r"\); write both with the same encoding"):  # fmt: skip
        check(tmp_path, (False, False), np.arange(N), 24 * np.arange(N),
              attrs_a=noleap, attrs_b=hours)  # fmt: skip


def test_units_against_none_are_refused(tmp_path: Path) -> None:
    days = {"t": {"units": "days since 2000-01-01"}}
    with pytest.raises(InputError, match=r"\(units 'days since 2000-01-01' against no units\)"):
        check(tmp_path, (False, False), np.arange(N), np.arange(N), attrs_a=days)


@pytest.mark.parametrize(
    ("units", "values", "expected"),
    [
        ("days since 2000-01-01", [0, 1], ["2000-01-01T00:00:00", "2000-01-02T00:00:00"]),
        ("hours since 2000-01-01 06:00", [1], ["2000-01-01T07:00:00"]),
        ("minutes since 2000-01-01", [90], ["2000-01-01T01:30:00"]),
        ("seconds since 1970-01-01 00:00:00 UTC", [5], ["1970-01-01T00:00:05"]),
    ],
)
def test_cf_times_decode_to_seconds(units: str, values: list[int], expected: list[str]) -> None:
    decode = coordinates._decoder({"units": units}, "s")
    assert decode is not None
    got = decode(np.array(values))
    assert got.dtype == np.dtype("M8[s]")
    assert [str(t) for t in got] == expected


@pytest.mark.parametrize(
    ("units", "expected"),
    [
        (["days since 2000-01-01", "hours since 2000-01-01"], "s"),
        (["milliseconds since 2000-01-01", "days since 2000-01-01"], "ms"),
        (["microseconds since 2000-01-01", "milliseconds since 2000-01-01"], "us"),
        (["nanoseconds since 2000-01-01", "microseconds since 2000-01-01"], "ns"),
        (["days since 2000-01-01", "months since 2000-01-01"], None),
        (["days since 2000-01-01", ""], None),
    ],
)
def test_the_resolution_is_the_finer_sides(units: list[str], expected: str | None) -> None:
    assert coordinates._resolution([{"units": u} if u else {} for u in units]) == expected


@pytest.mark.parametrize(
    "encoding",
    [
        {"units": "days since 2000-01-01", "calendar": "360_day"},
        {"units": "days since the start"},
        {"units": "fortnights since 2000-01-01"},
        {"units": "days since 2000-01-01T00:00:00+05:00"},  # a time zone: numpy warns
    ],
)
def test_encodings_numpy_cannot_decode_give_no_decoder(encoding: dict[str, str]) -> None:
    assert coordinates._decoder(encoding, "s") is None


def test_a_time_at_the_edge_of_datetime64_is_decoded_and_one_past_refused() -> None:
    decode = coordinates._decoder({"units": "seconds since 1970-01-01"}, "s")
    assert decode is not None
    edge = coordinates.INT64 - 1
    assert decode(np.array([edge, -edge])).astype(np.int64).tolist() == [edge, -edge]
    with pytest.raises(ValueError, match="beyond datetime64's"):
        decode(np.array([edge + 1]))
    assert decode(np.array([], dtype=np.int64)).size == 0
    later = coordinates._decoder({"units": "seconds since 1970-01-01T00:00:10"}, "s")
    assert later is not None
    with pytest.raises(ValueError, match=f"a time {edge - 9} seconds from its origin"):
        later(np.array([0, edge - 9]))
    with pytest.raises(ValueError, match="beyond"):
        later(np.array([-(edge - 9)]))


def test_nan_equals_nan_only_between_floats() -> None:
    same = coordinates._equal(np.array([1.0, np.nan, np.nan]), np.array([1.0, np.nan, 2.0]))
    assert same.tolist() == [True, True, False]
    same = coordinates._equal(np.array([np.nan + 1j]), np.array([np.nan + 1j]))
    assert same.tolist() == [True]


def test_values_are_shown_as_a_reader_writes_them() -> None:
    assert coordinates._value(np.datetime64("2000-01-02")) == "2000-01-02"
    assert coordinates._value(np.float64(0.5)) == "0.5"
    assert coordinates._value("x") == "'x'"
    assert coordinates._described({}) == "no units"
    assert coordinates._described({"units": "m", "calendar": "c"}) == "units 'm', calendar 'c'"


def test_a_coordinate_of_the_longest_strings_read_is_compared(tmp_path: Path) -> None:
    """64 characters are 256 bytes, MAX_ITEM_BYTES: still read and compared."""
    names = np.array([c * 64 for c in "wxyz"])
    assert names.dtype.itemsize == coordinates.MAX_ITEM_BYTES
    with pytest.raises(InputError, match="differ at 4 of 4 positions"):
        check(tmp_path, (False, False), names, names[::-1].copy())


def test_a_difference_in_a_later_block_is_placed_in_the_whole_coordinate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinates, "BLOCK_BYTES", 16)  # 2 int64 values a read
    late = SAME.copy()
    late[3] = -1
    with pytest.raises(InputError, match="differ at 1 of 4 positions, first at index 3: 30 "):
        check(tmp_path, (False, False), SAME, late)


def test_strings_against_numbers_differ_everywhere(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="differ at 4 of 4 positions, first at index 0: 'a' "):
        check(tmp_path, (False, False), np.array(list("abcd")), SAME * 1.0)


def test_an_infinite_time_is_refused_as_not_whole(tmp_path: Path) -> None:
    """No RuntimeWarning on the way (warnings are errors here)."""
    days = {"t": {"units": "days since 2000-01-01"}}
    hours = {"t": {"units": "hours since 2000-01-01"}}
    times = np.array([0.0, 1.0, np.inf, 3.0])
    with pytest.raises(InputError, match="float64 times in days are not whole numbers"):
        check(tmp_path, (False, False), times, 24 * np.arange(N), attrs_a=days, attrs_b=hours)


def test_the_edge_of_datetime64_counts_the_origins_distance_and_the_unit() -> None:
    """An origin before 1970 takes as much of int64's range as one after; a day is 86400 s."""
    edge = coordinates.INT64 - 1
    before = coordinates._decoder({"units": "seconds since 1969-12-31T23:59:50"}, "s")
    assert before is not None
    assert before(np.array([edge - 10])).astype(np.int64)[0] == edge - 20
    with pytest.raises(ValueError, match="beyond"):
        before(np.array([edge - 9]))
    days = coordinates._decoder({"units": "days since 1970-01-01"}, "s")
    assert days is not None
    most = edge // 86400
    assert days(np.array([most])).astype(np.int64)[0] == most * 86400
    with pytest.raises(ValueError, match=f"a time {most + 1} days from its origin"):
        days(np.array([most + 1]))


def test_why_a_coordinate_is_not_compared_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    long = np.array([c * 65 for c in "wxyz"])  # 260 bytes an element
    a, a_url = operand(tmp_path / "a.zarr", ("i", "t"), {"t": SAME})
    b, b_url = operand(tmp_path / "b.zarr", ("t", "j"), {"t": long})
    (tmp_path / "c").mkdir()
    c, c_url = operand(tmp_path / "c" / "c.zarr", ("t", "j"), {})
    with caplog.at_level(logging.DEBUG, logger="pipeline"):
        check_contracted([a, b], (a_url, b_url), (False, False))
        check_contracted([a, c], (a_url, c_url), (False, False))
    where_b, where_c = tmp_path / "b.zarr" / "t", tmp_path / "c" / "c.zarr" / "t"
    assert f"coordinate {where_b} of B not compared: dtype <U65" in caplog.messages
    # the reason, as open_input words it for B's coordinate
    assert any(
        m.startswith(f"no coordinate {where_c} for B: B's coordinate (") for m in caplog.messages
    )


def test_encodings_that_cannot_be_told_apart_say_both_ways_out(tmp_path: Path) -> None:
    days = {"t": {"units": "days since 2000-01-01"}}
    message = (
        "A's dimension 't' and B's dimension 't', which the product sums over, have "
        "coordinates stored in different encodings (units 'days since 2000-01-01' against no "
        "units); write both with the same encoding, or pass --ignore-coordinates to multiply "
        "them by position"
    )
    with pytest.raises(InputError, match="^" + re.escape(message) + "$"):
        check(tmp_path, (False, False), np.arange(N), np.arange(N), attrs_a=days)


def test_a_coordinate_that_cannot_be_read_says_both_ways_out(tmp_path: Path) -> None:
    check(tmp_path, (False, False), SAME, SAME)
    chunk = tmp_path / "b.zarr" / "t" / "c" / "0"
    chunk.write_bytes(b"not a chunk")
    with pytest.raises(InputError) as refused:
        check_contracted(
            [inputs.open_input(f"{tmp_path}/{side}.zarr/V") for side in "ab"],
            (f"{tmp_path}/a.zarr/V", f"{tmp_path}/b.zarr/V"),
            (False, False),
        )
    text = str(refused.value)
    assert text.startswith(f"B's dimension 't''s coordinate array ({tmp_path}/b.zarr/t) cannot")
    assert text.endswith(
        "; repair it, or pass --ignore-coordinates to multiply the operands by position"
    )


def test_a_nanosecond_origin_is_kept_to_the_nanosecond(tmp_path: Path) -> None:
    """2000-01-01 plus 7 ns is no float64: the origin stays an exact int64."""
    odd = {"t": {"units": "nanoseconds since 2000-01-01T00:00:00.000000007"}}
    epoch = {"t": {"units": "nanoseconds since 1970-01-01"}}
    origin = 946684800 * 10**9 + 7
    times = np.arange(N) * 1000
    check(tmp_path, (False, False), times, origin + times, attrs_a=odd, attrs_b=epoch)
    with pytest.raises(InputError, match="differ at 4 of 4 positions"):
        check(tmp_path / "b", (False, False), times, origin + 1 + times,
              attrs_a=odd, attrs_b=epoch)  # fmt: skip


def test_a_comparison_that_fails_describes_each_side_and_both_ways_out(tmp_path: Path) -> None:
    days = {"t": {"units": "days since 2000-01-01"}}
    hours = {"t": {"units": "hours since 2000-01-01"}}
    with pytest.raises(InputError) as refused:
        check(tmp_path, (False, False), np.arange(N) + 0.5, 24 * np.arange(N),
              attrs_a=days, attrs_b=hours)  # fmt: skip
    text = str(refused.value)
    a, b = tmp_path / "a.zarr" / "t", tmp_path / "b.zarr" / "t"
    assert (
        f"that cannot be compared ({a}: float64 units 'days since 2000-01-01', {b}: int64 "
        "units 'hours since 2000-01-01': float64 times in days are not whole numbers); write "
        "both alike, or pass --ignore-coordinates to multiply them by position"
    ) in text
    assert text.endswith("multiply them by position")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/d/ds.zarr/X", "/d/ds.zarr/X_time"),  # an X in the name is no path
        ("zip://ds/X/::/d/a.zip", "zip://ds/X_time::/d/a.zip"),  # a trailing slash
        ("zip://ds/X::simplecache::s3://b/a.zip", "zip://ds/X_time::simplecache::s3://b/a.zip"),
        ("zip://a://X::/d/a.zip", "zip://a://X_time::/d/a.zip"),  # '://' inside the path
    ],
)
def test_siblings_of_chained_and_odd_urls(url: str, expected: str) -> None:
    assert coordinates.sibling(url, "X_time") == expected


def test_storage_options_reach_the_coordinates_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, a_url = operand(tmp_path / "a.zarr", ("i", "t"), {"t": SAME})
    b, b_url = operand(tmp_path / "b.zarr", ("t", "j"), {"t": SAME})
    seen = []
    real = inputs.open_input

    def open_input(url: str, options: Any = None, name: str = "A") -> Any:
        seen.append((url, options, name))
        return real(url, None, name)

    monkeypatch.setattr(inputs, "open_input", open_input)
    options = {"anon": True}
    check_contracted([a, b], (a_url, b_url), (False, False), options)
    where = [str(tmp_path / side / "t") for side in ("a.zarr", "b.zarr")]
    assert seen == [(where[0], options, "A's coordinate"), (where[1], options, "B's coordinate")]


def test_wide_strings_are_read_in_blocks_of_their_own_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BLOCK_BYTES bounds the bytes a read holds: 256-byte strings, 512 bytes, 2 a read."""
    monkeypatch.setattr(coordinates, "BLOCK_BYTES", 512)
    reads = []
    real = coordinates._read

    def counted(c: Any, start: int, stop: int) -> Any:
        reads.append((c.operand, start, stop))
        return real(c, start, stop)

    monkeypatch.setattr(coordinates, "_read", counted)
    names = np.array([ch * 64 for ch in "wxyz"])
    check(tmp_path, (False, False), names, names)
    assert reads == [("A", 0, 2), ("B", 0, 2), ("A", 2, 4), ("B", 2, 4)]

"""The coordinate arrays beside xarray's variables: op(A)·op(B) sums over one dimension, and
where both operands' copies of it have coordinates that differ (``time`` a year apart), the
product would pair unrelated rows; xarray itself would not align them. Refused, naming the
first difference, unless the caller says the positions are what they mean."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import InputError, PipelineError
from pipeline.store import groups, inputs, labels
from pipeline.store.fs import local_path

log = logging.getLogger("pipeline")

BLOCK_BYTES = 8 << 20
"""Coordinate bytes compared per read: a long dimension is never held whole, twice."""
MAX_ITEM_BYTES = 256
"""A coordinate's largest element: longer fixed-width strings (a dtype anyone may declare) are
not read, the check is skipped; a variable-length label is read to this length on average."""
KINDS = "biufcmMSUOT"
"""numpy kinds a coordinate may have: numbers, times, strings (numpy's variable-length ones
too: zarr's ``str``), bytes (structured ones are skipped)."""
LABELS = "SUOT"
"""Kinds whose chunks zarr decodes itself (pipeline.store.chunks.bounded caps the others')."""
ENCODING = ("units", "calendar")
"""CF attributes that give stored numbers their meaning (``days since 2000-01-01``)."""


@dataclass(frozen=True)
class Coordinate:
    operand: str
    """"A" or "B"."""
    dimension: str
    url: str
    array: Any


def check_contracted(
    arrays: list[Any],
    urls: tuple[str, str],
    transposed: tuple[bool, bool],
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Refuse op(A)·op(B) where the contracted dimension has coordinates beside both operands
    and they differ (InputError naming the first difference); nothing is checked where either
    side has none."""
    axes = (0 if transposed[0] else 1, 1 if transposed[1] else 0)  # stored axis summed over
    found = [
        _coordinate(name, array, url, axis, storage_options)
        for name, array, url, axis in zip(("A", "B"), arrays, urls, axes, strict=True)
    ]
    a, b = found
    if a is None or b is None:
        return
    _compare(a, b)


def _coordinate(
    operand: str, array: Any, url: str, axis: int, storage_options: dict[str, Any] | None
) -> Coordinate | None:
    """The 1-D array named as the operand's dimension ``axis``, beside it in its group, of that
    dimension's length; None where there is none (or it can't be read as one)."""
    dimension = inputs.dimension_names(array)[axis]
    if dimension is None:
        return None
    where = sibling(url, dimension)
    if where is None:
        return None
    try:
        coordinate = inputs.open_input(where, storage_options, f"{operand}'s coordinate")
    except PipelineError as e:  # none there, or not an array we would read: no check
        log.debug("no coordinate %s for %s: %s", where, operand, e)
        return None
    if coordinate.ndim != 1 or coordinate.shape[0] != array.shape[axis]:
        return None
    try:
        dtype = np.dtype(coordinate.dtype)
    except TypeError:  # a dtype numpy does not know
        return None
    if dtype.kind not in KINDS or dtype.itemsize > MAX_ITEM_BYTES:
        log.debug("coordinate %s of %s not compared: dtype %s", where, operand, dtype)
        return None
    if dtype.kind in LABELS:
        coordinate = labels.capped(coordinate, MAX_ITEM_BYTES)
        if coordinate is None:
            log.debug("coordinate %s of %s not compared: its codecs", where, operand)
            return None
    return Coordinate(operand, dimension, where, coordinate)


def sibling(url: str, name: str) -> str | None:
    """The URL of ``name`` in the group holding ``url`` (``ds.zarr/X`` -> ``ds.zarr/time``;
    fsspec's chained ``zip://ds/X::/d.zip`` -> ``zip://ds/time::/d.zip``); None at a root,
    or where the name (from the operand's metadata: anyone's) is not one array's name."""
    if not name or name in (".", "..") or any(c in name for c in "/\\:\0"):
        return None
    if "::" in url:
        head, tail = url.split("::", 1)
        protocol, inner = head.split("://", 1)
        parent, _, _ = inner.rstrip("/").rpartition("/")
        return f"{protocol}://{parent + '/' if parent else ''}{name}::{tail}"
    holder = groups.parent(url)
    if holder is None:
        return None
    return os.path.join(holder, name) if local_path(url) is not None else f"{holder}/{name}"


def _compare(a: Coordinate, b: Coordinate) -> None:
    encodings = [_encoding(c.array) for c in (a, b)]
    same_encoding = encodings[0] == encodings[1]
    resolution = _resolution(encodings)
    readers = [_decoder(e, resolution) for e in encodings] if resolution else [None, None]
    if not same_encoding and None in readers:
        raise InputError(
            f"{_named(a)} and {_named(b)}, which the product sums over, have coordinates "
            f"stored in different encodings ({_described(encodings[0])} against "
            f"{_described(encodings[1])}); write both with the same encoding, or pass "
            "--ignore-coordinates to multiply them by position"
        )
    n = a.array.shape[0]
    step = max(1, BLOCK_BYTES // max(_item_bytes(np.dtype(c.array.dtype)) for c in (a, b)))
    differ, first = 0, None
    for start in range(0, n, step):
        stop = min(n, start + step)
        left, right = (_read(c, start, stop) for c in (a, b))
        try:
            if not same_encoding:  # both CF times: compared as the times they mean
                left, right = readers[0](left), readers[1](right)  # type: ignore[misc]
            same = _equal(left, right)
        except (TypeError, ValueError, OverflowError) as e:
            raise InputError(
                f"{_named(a)} and {_named(b)}, which the product sums over, have coordinates "
                f"that cannot be compared ({a.url}: {a.array.dtype} {_described(encodings[0])}, "
                f"{b.url}: {b.array.dtype} {_described(encodings[1])}: {e}); write both alike, "
                "or pass --ignore-coordinates to multiply them by position"
            ) from e
        if not same.all():
            at = int(np.argmin(same))
            if first is None:
                first = (start + at, left[at], right[at])
            differ += int(same.size - np.count_nonzero(same))
    if first is None:
        return
    index, x, y = first
    units = f" {encodings[0]['units']}" if same_encoding and "units" in encodings[0] else ""
    times = same_encoding and resolution is not None  # stored CF times: NaT as xarray's
    raise InputError(
        f"{_named(a)} and {_named(b)}, which the product sums over, have coordinates that "
        f"differ at {differ} of {n} positions, first at index {index}: "
        f"{_shown(x, units, times)} ({a.url}) against {_shown(y, units, times)} ({b.url}); "
        "xarray would not align them. Select matching ranges first (e.g. ds.sel(...) for "
        "both), or pass --ignore-coordinates to multiply them by position"
    )


def _item_bytes(dtype: np.dtype[Any]) -> int:
    """What one element can hold: a variable-length label (its itemsize a pointer) up to
    MAX_ITEM_BYTES."""
    return MAX_ITEM_BYTES if dtype.kind in "OT" else dtype.itemsize


def _read(c: Coordinate, start: int, stop: int) -> np.ndarray[Any, Any]:
    try:
        return np.asarray(c.array[start:stop])
    except Exception as e:  # noqa: BLE001 - refused unread, or corrupt: the array's problem
        raise InputError(
            f"{_named(c)}'s coordinate array ({c.url}) cannot be read: {e}; repair it, or "
            "pass --ignore-coordinates to multiply the operands by position"
        ) from e


UNITS = {
    "days": "D", "hours": "h", "minutes": "m", "seconds": "s",
    "milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns",
}  # fmt: skip
"""CF time units numpy can count in."""
FINE = ("ms", "us", "ns")
"""Units below a second: times in them are decoded at their own resolution, the rest in
seconds (whose range, 2.9e11 years, holds any origin)."""
CALENDARS = (None, "standard", "gregorian", "proleptic_gregorian")
"""Calendars numpy's datetime64 keeps (others, such as noleap, are compared as stored)."""
INT64 = 2**63 - 1
NAT = -(2**63)
"""NaT's int64 (datetime64 and timedelta64): also how xarray stores NaT in CF times."""


def _resolution(encodings: list[dict[str, str]]) -> str | None:
    """The datetime64 unit both sides' CF times decode to (the finer one's); None unless both
    are CF times in units numpy counts."""
    units = [UNITS.get(e.get("units", "").partition(" since ")[0]) for e in encodings]
    if None in units:
        return None
    fine = [u for u in FINE if u in units]
    return fine[-1] if fine else "s"


def _decoder(encoding: dict[str, str], resolution: str) -> Callable[[Any], Any] | None:
    """CF times (``days since 2000-01-01``) as datetime64 at ``resolution``, CF durations
    (``seconds``: xarray's timedelta64) as timedelta64, so two encodings of the same times
    compare equal; NaT where xarray wrote one (``_missing``); None for another calendar or an
    origin numpy can't read. A value whose time leaves int64's range is a ValueError, never a
    wrapped time."""
    unit, since, text = encoding.get("units", "").partition(" since ")
    if unit not in UNITS or encoding.get("calendar") not in CALENDARS:
        return None
    origin = _origin(text, resolution) if since else 0
    if origin is None:
        return None
    one = np.timedelta64(1, UNITS[unit])  # type: ignore[call-overload]
    scale = int(one // np.timedelta64(1, resolution))  # type: ignore[call-overload]
    kind = "M" if since else "m"

    def decode(values: Any) -> Any:
        missing = _missing(values)
        known = values[~missing]
        if known.dtype.kind == "f" and np.isfinite(known).all() and (known % 1 == 0).all():
            known = known.astype(np.int64)  # whole numbers stored as floats
        if known.dtype.kind not in "iu":
            raise ValueError(f"{values.dtype} times in {unit} are not whole numbers")
        reach = max(abs(int(known.min())), abs(int(known.max()))) if known.size else 0
        if reach > (INT64 - 1 - abs(origin)) // scale:
            raise ValueError(f"a time {reach} {unit} from its origin is beyond datetime64's")
        times = np.full(values.shape, NAT, dtype=np.int64)
        times[~missing] = origin + known.astype(np.int64) * scale
        return times.view(f"{kind}8[{resolution}]")

    return decode


def _origin(text: str, resolution: str) -> int | None:
    """``days since 2000-01-01 00:00 UTC``'s origin in ``resolution``s since 1970; None where
    numpy can't read it (a time zone other than UTC, a word)."""
    text = text.strip().removesuffix("UTC").removesuffix("Z").strip().replace(" ", "T")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's warning about a time zone: not decoded
            origin = np.datetime64(text, resolution)  # type: ignore[call-overload]
    except (ValueError, Warning):
        return None
    return None if np.isnat(origin) else int(origin.astype(np.int64))


def _missing(values: Any) -> Any:
    """Where xarray wrote NaT into CF times: NaN, or int64's least (NaT's own bits)."""
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype == np.int64:
        return values == NAT
    return np.zeros(values.shape, dtype=bool)


def _equal(left: np.ndarray[Any, Any], right: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Elementwise equality, NaN equal to NaN and NaT to NaT (as xarray's index comparison)."""
    same = np.asarray(left == right)
    if left.dtype.kind in "fc" and right.dtype.kind in "fc":
        same |= np.isnan(left) & np.isnan(right)
    if left.dtype.kind == right.dtype.kind and left.dtype.kind in "mM":
        same |= np.isnat(left) & np.isnat(right)
    return same


def _encoding(array: Any) -> dict[str, str]:
    attrs = dict(array.attrs)
    return {k: str(attrs[k]) for k in ENCODING if k in attrs}


def _described(encoding: dict[str, str]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in encoding.items()) or "no units"


def _named(c: Coordinate) -> str:
    return f"{c.operand}'s dimension {c.dimension!r}"


def _shown(value: Any, units: str, times: bool) -> str:
    """A stored value in its units; NaT where it is one of CF ``times``."""
    if times and _missing(np.asarray(value)).all():
        return "NaT"
    return f"{_value(value)}{units}"


def _value(value: Any) -> str:
    if isinstance(value, np.datetime64):
        return str(np.datetime_as_string(value, unit="auto"))
    if isinstance(value, np.timedelta64):
        return str(value)  # "5 seconds", "NaT" (its item() is a timedelta, or None)
    return repr(value.item() if isinstance(value, np.generic) else value)

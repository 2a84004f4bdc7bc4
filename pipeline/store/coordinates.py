"""The coordinate arrays beside xarray's variables: op(A)·op(B) sums over one dimension, and
where both operands' copies of it have coordinates that differ (``time`` a year apart), the
product would pair unrelated rows; xarray itself would not align them. Refused, naming the
first difference, unless the caller says the positions are what they mean."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import InputError, PipelineError
from pipeline.store import inputs
from pipeline.store.fs import local_path

log = logging.getLogger("pipeline")

BLOCK = 1 << 20
"""Coordinate values compared per read: a long dimension is never held whole, twice."""
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
    local = local_path(url)
    if local is not None:
        return os.path.join(os.path.dirname(os.path.abspath(local)), name)
    protocol, rest = url.split("://", 1)
    parent, _, _ = rest.rstrip("/").rpartition("/")
    return f"{protocol}://{parent}/{name}" if parent else None


def _compare(a: Coordinate, b: Coordinate) -> None:
    encodings = [_encoding(c.array) for c in (a, b)]
    readers = [_decoder(e) for e in encodings]
    if encodings[0] != encodings[1] and None in readers:
        raise InputError(
            f"{_named(a)} and {_named(b)}, which the product sums over, have coordinates "
            f"stored in different encodings ({_described(encodings[0])} against "
            f"{_described(encodings[1])}); write both with the same encoding, or pass "
            f"--ignore-coordinates to multiply them by position"
        )
    same_encoding = encodings[0] == encodings[1]
    n = a.array.shape[0]
    differ, first = 0, None
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        left, right = (np.asarray(c.array[start:stop]) for c in (a, b))
        if not same_encoding:  # both CF times: compared as the times they mean
            left, right = readers[0](left), readers[1](right)  # type: ignore[misc]
        same = _equal(left, right)
        if not same.all():
            at = int(np.argmin(same))
            if first is None:
                first = (start + at, left[at], right[at])
            differ += int(same.size - np.count_nonzero(same))
    if first is None:
        return
    index, x, y = first
    units = f" {encodings[0]['units']}" if same_encoding and "units" in encodings[0] else ""
    raise InputError(
        f"{_named(a)} and {_named(b)}, which the product sums over, have coordinates that "
        f"differ at {differ} of {n} positions, first at index {index}: {_value(x)}{units} "
        f"({a.url}) against {_value(y)}{units} ({b.url}); xarray would not align them. Select "
        "matching ranges first (e.g. ds.sel(...) for both), or pass --ignore-coordinates to "
        "multiply them by position"
    )


UNITS = {
    "days": "D", "hours": "h", "minutes": "m", "seconds": "s",
    "milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns",
}  # fmt: skip
"""CF time units numpy can count in."""
CALENDARS = (None, "standard", "gregorian", "proleptic_gregorian")
"""Calendars numpy's datetime64 keeps (others, such as noleap, are compared as stored)."""


def _decoder(encoding: dict[str, str]) -> Callable[[Any], Any] | None:
    """CF times (``days since 2000-01-01``) as datetime64, so two encodings of the same times
    compare equal; None for anything else."""
    unit, _, since = encoding.get("units", "").partition(" since ")
    if unit not in UNITS or encoding.get("calendar") not in CALENDARS:
        return None
    try:
        origin = np.datetime64(since.strip().replace(" ", "T"), "ns")
    except ValueError:
        return None
    step = np.timedelta64(1, UNITS[unit])  # type: ignore[call-overload]

    def decode(values: Any) -> Any:
        if values.dtype.kind not in "iu":
            return values  # float times: compared as stored
        return origin + values.astype(np.int64) * step

    return decode


def _equal(left: np.ndarray[Any, Any], right: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Elementwise equality, NaN equal to NaN (as xarray's index comparison)."""
    same = np.asarray(left == right)
    if left.dtype.kind in "fc" and right.dtype.kind in "fc":
        same |= np.isnan(left) & np.isnan(right)
    return same


def _encoding(array: Any) -> dict[str, str]:
    attrs = dict(array.attrs)
    return {k: str(attrs[k]) for k in ENCODING if k in attrs}


def _described(encoding: dict[str, str]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in encoding.items()) or "no units"


def _named(c: Coordinate) -> str:
    return f"{c.operand}'s dimension {c.dimension!r}"


def _value(value: Any) -> str:
    if isinstance(value, np.datetime64):
        return str(np.datetime_as_string(value, unit="auto"))
    return repr(value.item() if isinstance(value, np.generic) else value)

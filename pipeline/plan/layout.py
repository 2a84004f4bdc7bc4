"""OUT's layout: dtype, chunks and shards, from what the caller asked and the inputs (pure).

Defaults: chunks (A's row chunk, B's column chunk), grown to at least 512 along each axis when
that would make more than 1,024 of them (grown_chunks); when an input is sharded, shards (A's row
shard, B's column shard) around those chunks. ``--chunks`` alone writes an unsharded array;
``--shards`` alone keeps the default chunks inside the given shards. A shard is one stored
object, so tiles are made of whole shards (one writer each); see ``ArraySpec.outer_chunks``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

from pipeline.errors import UsageError
from pipeline.plan.dtypes import output_dtypes
from pipeline.plan.spec import ArraySpec, OutputSpec


def output_spec(a: ArraySpec, b: ArraySpec, request: OutputSpec) -> tuple[ArraySpec, str]:
    """OUT's spec and the accumulator dtype; refuses a bad layout or an unsafe dtype."""
    out_dtype, compute_dtype = output_dtypes(
        a.dtype, b.dtype, a.shape[1], request.dtype, check_range=not request.standardized
    )
    default = (a.chunks[0], b.chunks[1])
    chunks, shards = request.chunks, request.shards
    if chunks is None and shards is None and (a.shards or b.shards) and request.zarr_format == 3:
        shards = (a.outer_chunks[0], b.outer_chunks[1])
    for flag, pair in (("--chunks", chunks), ("--shards", shards)):
        if pair is not None and min(pair) < 1:
            raise UsageError(f"{flag} {_text(pair)} must be at least 1x1")
    if shards is not None and request.zarr_format != 3:
        raise UsageError(
            f"--shards {_text(shards)} needs Zarr v3, but OUT goes into a Zarr v2 group and "
            "is written as v2 there (a v3 array would be invisible to the group and to "
            "xarray); drop --shards, or write OUT outside that group"
        )
    if chunks is None:
        chunks = default if shards else grown_chunks(default, (a.shape[0], b.shape[1]))
        whose = " (A's row chunk, B's column chunk: pass --chunks to choose)"
    else:
        whose = ""
    if shards is not None and (shards[0] % chunks[0] or shards[1] % chunks[1]):
        hint = (math.gcd(shards[0], chunks[0]), math.gcd(shards[1], chunks[1]))
        raise UsageError(
            f"--shards {_text(shards)} is not a whole number of chunks {_text(chunks)}{whose}; "
            f"each shard must hold whole chunks: pass e.g. --chunks {_text(hint)}, or shards "
            f"that are multiples of {_text(chunks)}"
        )
    (m, n) = (a.shape[0], b.shape[1])
    return ArraySpec((m, n), chunks, out_dtype, shards), compute_dtype


MANY_OUT_CHUNKS = 1024
"""An OUT of more default chunks than this gets bigger ones (grown_chunks)."""
MIN_OUT_CHUNK = 512
"""Rows and columns a grown OUT chunk reaches (1 MiB of float32)."""


def grown_chunks(chunks: tuple[int, int], shape: tuple[int, int]) -> tuple[int, int]:
    """OUT's default chunks: ``chunks`` as they are unless OUT would have more than
    MANY_OUT_CHUNKS of them; then each axis grows by whole multiples to at least MIN_OUT_CHUNK
    (or the whole axis). Every stored object costs a file or request of its own: 4096x4096 in
    64x64 chunks is 4,096 of them, their writes 2.8 of the 7 s job. ``--chunks`` is taken as
    given."""
    counts = [-(-extent // max(c, 1)) for c, extent in zip(chunks, shape, strict=True)]
    if counts[0] * counts[1] <= MANY_OUT_CHUNKS:
        return chunks
    grown = (
        c * min(-(-MIN_OUT_CHUNK // c), n) if c < MIN_OUT_CHUNK else c
        for c, n in zip(chunks, counts, strict=True)
    )
    return (next(grown), next(grown))


def parse_pair(value: str | Sequence[int] | None, flag: str) -> tuple[int, int] | None:
    """``"RxC"`` or two integers (the API's ``chunks=(r, c)``) to a pair; None stays None."""
    if value is None:
        return None
    try:
        if isinstance(value, str):
            parts: Sequence[object] = value.lower().replace(" ", "").split("x")
        else:
            parts = list(value)
        if len(parts) != 2:
            raise ValueError
        pair = (_int(parts[0]), _int(parts[1]))
    except (TypeError, ValueError):
        raise UsageError(
            f"{flag} {value!r} is not RxC with two positive integers, e.g. 1024x1024"
        ) from None
    return pair


def _int(x: object) -> int:
    """An integer from text or an int-like (numpy integers too); 2.5 and True are refused."""
    if isinstance(x, str):
        return int(x)
    if isinstance(x, bool):
        raise TypeError(x)
    return operator.index(x)  # type: ignore[arg-type]


def _text(pair: tuple[int, int]) -> str:
    return f"{pair[0]}x{pair[1]}"


DEFAULT_DIMENSIONS = ("i", "j")
"""OUT's dimension names when the inputs have none."""


def dimension_names(
    a_names: tuple[str | None, str | None],
    b_names: tuple[str | None, str | None],
    unnamed: tuple[str, str] = DEFAULT_DIMENSIONS,
) -> tuple[str, str]:
    """OUT's dimension names: A's first and B's second (``unnamed`` where unnamed); when they
    are the same name (A is x-by-y and B y-by-x), the second gets a suffix: xarray needs
    distinct names."""
    row = a_names[0] or unnamed[0]
    col = b_names[1] or unnamed[1]
    return (row, f"{col}_2" if col == row else col)


def fit_dimensions(
    names: tuple[str, str], shape: tuple[int, int], taken: dict[str, int]
) -> tuple[str, str]:
    """``names`` for OUT of ``shape``, each renamed (``lat_lon_2``, ``lat_lon_3``, ...) where
    another array of its group names a dimension so with another length: xarray would not open
    the group."""
    fitted: list[str] = []
    for name, length in zip(names, shape, strict=True):
        found, n = name, 1
        while taken.get(found, length) != length or found in fitted:
            n += 1
            found = f"{name}_{n}"
        fitted.append(found)
    return (fitted[0], fitted[1])

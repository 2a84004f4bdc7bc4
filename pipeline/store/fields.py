"""N-D fields read as matrices in place: a (time, lat, lon) array is a time x (lat·lon) matrix
when its first dimension forms the rows and the others, stacked in stored (C) order, the
columns. No copy is written: a block of the matrix is a box of the stored array, read through
zarr's own N-D selection (its chunks decoded as stored, each within its bounds), and reshaped.

A side's chunk is the outer stacked dimension's chunk times the inner ones' full lengths (lat's
chunk x nlon): the matrix's chunks are whole boxes of stored chunks, which the planner reads and
the memory model counts as such (a box covering several stored chunks along lon counts more
than a stored chunk's bytes: on the safe side)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray
from zarr.core.buffer.cpu import NDBuffer

from pipeline.plan.dimensions import stacked_name

Span = tuple[int, int]


class FieldMatrix:
    """A 2-D view of an N-D Zarr array: its first ``split`` dimensions are the rows, the rest
    the columns. Shape, chunks, shards and dtype as a matrix's; the stored array's metadata and
    attributes as they are (so fingerprints and records see the array itself)."""

    ndim = 2

    def __init__(self, stored: Any, split: int) -> None:
        if not 0 < split < stored.ndim:
            raise ValueError(f"split {split} of a {stored.ndim}-D array")
        self.stored = stored
        """The N-D zarr array."""
        self.split = split
        """How many leading stored dimensions are stacked as the rows."""
        shape = tuple(int(s) for s in stored.shape)
        self.sides = (shape[:split], shape[split:])
        """The stored lengths of the rows' dimensions and of the columns'."""
        self.inner = (math.prod(self.sides[0][1:]), math.prod(self.sides[1][1:]))
        """Elements of one step of each side's outer dimension (its inner dimensions' product)."""
        self.shape = (math.prod(self.sides[0]), math.prod(self.sides[1]))
        self.chunks = self._grouped(stored.chunks)
        shards = getattr(stored, "shards", None)
        self.shards = None if shards is None else self._grouped(shards)

    def _grouped(self, stored: tuple[int, ...]) -> tuple[int, int]:
        return (int(stored[0]) * self.inner[0], int(stored[self.split]) * self.inner[1])

    @property
    def dtype(self) -> Any:
        return self.stored.dtype

    @property
    def metadata(self) -> Any:
        return self.stored.metadata

    @property
    def attrs(self) -> Any:
        return self.stored.attrs

    @property
    def fill_value(self) -> Any:
        return self.stored.fill_value

    @property
    def dimension_names(self) -> tuple[str | None, str | None]:
        """The rows' and the columns' names (stacked ones joined: ``lat_lon``)."""
        names = _stored_names(self.stored)
        if names is None:
            return (None, None)
        return (stacked_name(names[: self.split]), stacked_name(names[self.split :]))

    def box(self, rows: Span, cols: Span) -> tuple[tuple[slice, ...], tuple[int, ...], Span, Span]:
        """The stored box holding ``[rows, cols]``: its selection, its shape, and where the
        block lies in the box's rows and columns (all of it when the block is aligned)."""
        selection: list[slice] = []
        shape: list[int] = []
        offsets = []
        for (lo, hi), inner, side in zip((rows, cols), self.inner, self.sides, strict=True):
            first, last = lo // inner, -(-hi // inner) if hi > lo else lo // inner
            selection += [slice(first, last)] + [slice(0, s) for s in side[1:]]
            shape += [last - first, *side[1:]]
            offsets.append((lo - first * inner, hi - first * inner))
        return tuple(selection), tuple(shape), offsets[0], offsets[1]

    def read(self, rows: Span, cols: Span, dtype: str, out: NDArray[Any] | None = None) -> Any:
        """``[rows, cols]`` as a C-contiguous ``dtype`` array (into ``out`` when given)."""
        selection, shape, (r0, r1), (c0, c1) = self.box(rows, cols)
        matrix = (math.prod(shape[: self.split]), math.prod(shape[self.split :]))
        aligned = (r0, r1, c0, c1) == (0, matrix[0], 0, matrix[1])
        if aligned and (out is None or out.flags.c_contiguous):
            # decoded straight into the block: the box is its C-order reshape (a view)
            into = out if out is not None else np.empty(matrix, dtype=dtype)
            buffer = NDBuffer.from_numpy_array(into.reshape(shape))
            self.stored.get_basic_selection(selection, out=buffer)
            return into
        box = np.asarray(self.stored.get_basic_selection(selection)).reshape(matrix)
        block = box[r0:r1, c0:c1]
        if out is None:
            return np.ascontiguousarray(block, dtype=dtype)
        out[...] = block
        return out

    def __getitem__(self, selection: tuple[slice, slice]) -> Any:
        rows, cols = (s.indices(n)[:2] for s, n in zip(selection, self.shape, strict=True))
        return self.read(rows, cols, str(np.dtype(self.dtype)))


def as_matrix(array: Any, split: int | None) -> Any:
    """``array`` as the product reads it: as stored (``split`` None), else a FieldMatrix."""
    return array if split is None else FieldMatrix(array, split)


def _stored_names(array: Any) -> tuple[str | None, ...] | None:
    """An array's stored dimension names (Zarr v3 ``dimension_names`` or xarray's v2
    ``_ARRAY_DIMENSIONS``), None when it has none of either, one per dimension."""
    names = getattr(array.metadata, "dimension_names", None)
    if names is None:
        names = dict(array.attrs).get("_ARRAY_DIMENSIONS")
    if not isinstance(names, (list, tuple)) or len(names) != array.ndim:
        return None
    return tuple(n if isinstance(n, str) and n else None for n in names)


def stored_names(array: Any) -> tuple[str | None, ...]:
    """An array's dimension names, one per dimension (None where unnamed)."""
    found = _stored_names(array)
    return found if found is not None else (None,) * int(array.ndim)

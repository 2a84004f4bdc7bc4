"""Frozen specs shared by the planner, the executor and the workers (no I/O here)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr


@dataclass(frozen=True)
class ArraySpec:
    """What the planner needs to know about a 2-D array."""

    shape: tuple[int, int]
    """Rows and columns, in elements."""
    chunks: tuple[int, int]
    """Chunk rows and columns, in elements."""
    dtype: str
    """numpy dtype string, e.g. ``"float32"``."""
    shards: tuple[int, int] | None = None
    """Shard rows and columns (Zarr v3 sharding), in elements; None when unsharded."""

    @property
    def outer_chunks(self) -> tuple[int, int]:
        """What is stored as one object, and so must have one writer: the shard when sharded,
        else the chunk."""
        return self.shards or self.chunks

    def transposed(self) -> ArraySpec:
        """The spec of this array's transpose (shape, chunks and shards reversed): what the
        planner sees of an operand read transposed."""
        shards = (self.shards[1], self.shards[0]) if self.shards else None
        shape, chunks = self.shape, self.chunks
        return ArraySpec((shape[1], shape[0]), (chunks[1], chunks[0]), self.dtype, shards)


@dataclass(frozen=True)
class OutputSpec:
    """What the caller asked of OUT; None follows the inputs (see pipeline.plan.layout)."""

    dtype: str | None = None
    """numpy dtype name; None: ``numpy.result_type`` of the inputs."""
    chunks: tuple[int, int] | None = None
    """Chunk rows and columns, in elements; None: (A's row chunk, B's column chunk)."""
    shards: tuple[int, int] | None = None
    """Shard rows and columns, in elements; None: the inputs' shards when they are sharded."""
    zarr_format: int = 3
    """3, or 2 inside a Zarr v2 group (xarray would not see a v3 array there): no shards."""
    accumulate: bool = False
    """OUT holds C for ``C ← α·A·B + β·C``: each task also reads and keeps C's original tile."""
    standardized: bool = False
    """The product is of X standardized (pipeline.plan.standardize): floats, whatever X's
    dtype, so integer inputs' worst case is not checked against OUT's range."""


@dataclass(frozen=True)
class KPanels(Sequence[tuple[int, int]]):
    """K cut into ``total`` panels, counted rather than listed (a 10^12-wide K is a few ints):
    panel i is ``[i * width, (i + 1) * width)``, the last one ``[(total - 1) * width, k)``.
    This range holds panels ``start`` to ``stop``; slicing gives another KPanels."""

    k: int
    """K, in elements."""
    width: int
    """Every panel's width but the last's, in elements (at least 1)."""
    total: int
    """Panels in all of K (the last one may be narrower or wider than ``width``)."""
    start: int = 0
    """Index of this range's first panel."""
    stop: int = -1
    """One past the index of its last panel; -1: ``total``."""

    def __post_init__(self) -> None:
        if self.stop < 0:
            object.__setattr__(self, "stop", max(self.total, self.start))

    def __len__(self) -> int:
        return self.stop - self.start

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, index: slice) -> KPanels: ...
    def __getitem__(self, index: int | slice) -> tuple[int, int] | KPanels:
        span = range(self.start, self.stop)[index]
        if isinstance(span, range):
            if span.step != 1:
                raise ValueError(f"K panels sliced with step {span.step}; only step 1")
            return KPanels(self.k, self.width, self.total, span.start, span.stop)
        return self._panel(span)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return map(self._panel, range(self.start, self.stop))

    def _panel(self, i: int) -> tuple[int, int]:
        return (i * self.width, self.k if i == self.total - 1 else (i + 1) * self.width)

    @property
    def widest(self) -> int:
        """The widest panel of this range, in elements (0 when it has none)."""
        if not self:
            return 0
        last = self[-1][1] - self[-1][0]
        return max(last, self.width) if len(self) > 1 else last

    @property
    def narrowest(self) -> int:
        """The narrowest panel of this range, in elements (0 when it has none)."""
        if not self:
            return 0
        last = self[-1][1] - self[-1][0]
        return min(last, self.width) if len(self) > 1 else last


@dataclass(frozen=True)
class Tile:
    """One output tile: a block of whole output chunks (ragged only at the array's edge)."""

    index: tuple[int, int]
    """Tile row and column number."""
    rows: tuple[int, int]
    """First and one-past-last output row."""
    cols: tuple[int, int]
    """First and one-past-last output column."""

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])


@dataclass(frozen=True)
class StoreSpec:
    """Where the arrays live; pickled to the workers, which open the stores themselves."""

    a_url: str
    b_url: str
    out_url: str
    storage_options: dict[str, Any] = field(default_factory=dict, metadata=SENSITIVE_FIELD)
    """fsspec options for every URL (``endpoint_url``, ``anon``, ...); repr hides secrets."""
    transposed: tuple[bool, bool] = (False, False)
    """Whether A and B are read transposed: the product is op(A) @ op(B), read in place."""
    symmetric: bool = False
    """A Gram product (op(B) is op(A) transposed): tiles on and above the diagonal only, each
    also written mirrored."""
    splits: tuple[int | None, int | None] = (None, None)
    """Per input, an N-D field read as a matrix: how many leading stored dimensions are its
    rows (pipeline.plan.dimensions); None: a 2-D array, read as stored."""

    __repr__ = redacted_repr

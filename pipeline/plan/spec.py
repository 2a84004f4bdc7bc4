"""Frozen specs shared by the planner, the executor and the workers (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.sensitive import SENSITIVE_FIELD, redacted_repr


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

    __repr__ = redacted_repr

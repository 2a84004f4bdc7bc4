"""Frozen specs shared by the planner, the executor and the workers (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ArraySpec:
    """What the planner needs to know about a 2-D array."""

    shape: tuple[int, int]
    """Rows and columns, in elements."""
    chunks: tuple[int, int]
    """Chunk rows and columns, in elements."""
    dtype: str
    """numpy dtype string, e.g. ``"float32"``."""


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
    storage_options: dict[str, Any] = field(default_factory=dict)
    """fsspec options for every URL (``endpoint_url``, ``anon``, ...)."""

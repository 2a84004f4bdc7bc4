"""An input read transposed, for the verifier: op(X) = Xᵀ presented with its own shape, chunks
and dtype, read from X's stored blocks (the tile tasks transpose in pipeline.run.reading); and
a standardized X (a covariance's, correlation's or kinship's), standardized block by block as
it is read, never whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.plan.standardize import Standardize
from pipeline.store import inputs
from pipeline.store.fields import as_matrix


@dataclass(frozen=True)
class Transposed:
    """Xᵀ of an opened input X: block ``[rows, cols]`` is X's ``[cols, rows]`` transposed."""

    stored: Any

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.stored.shape[1]), int(self.stored.shape[0]))

    @property
    def chunks(self) -> tuple[int, int]:
        return (int(self.stored.chunks[1]), int(self.stored.chunks[0]))

    @property
    def dtype(self) -> Any:
        return self.stored.dtype


@dataclass(frozen=True)
class Standardized:
    """(X − shift)·scale of an opened input X, in float64: block ``[rows, cols]`` is X's."""

    stored: Any
    standardize: Standardize

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.stored.shape[0]), int(self.stored.shape[1]))

    @property
    def chunks(self) -> tuple[int, int]:
        return (int(self.stored.chunks[0]), int(self.stored.chunks[1]))

    @property
    def dtype(self) -> Any:
        return np.dtype(np.float64)


def open_operand(
    url: str,
    options: dict[str, Any],
    name: str,
    transposed: bool,
    standardize: Standardize | None = None,
    split: int | None = None,
) -> Any:
    """An input opened read-only in a task, as the product uses it (``split``: an N-D field
    read as a matrix, pipeline.store.fields)."""
    array = as_matrix(inputs.open_on_worker(url, options, name), split)
    if standardize is not None:
        array = Standardized(array, standardize)
    return Transposed(array) if transposed else array


def read_operand(
    array: Any, rows: tuple[int, int], cols: tuple[int, int], dtype: str
) -> NDArray[Any]:
    """``inputs.read_block`` of an operand as used (a transposed view of the stored block when
    read transposed: no copy), as verify reads it (a bad chunk's fix: verify again)."""
    if isinstance(array, Transposed):
        return read_operand(array.stored, cols, rows, dtype).T
    if isinstance(array, Standardized):
        block = read_operand(array.stored, rows, cols, "float64")
        array.standardize.apply(block, rows, cols)
        return block.astype(dtype, copy=False)
    return inputs.read_block(array, rows, cols, dtype, retry=", then verify again")

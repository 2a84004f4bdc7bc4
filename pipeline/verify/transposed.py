"""An input read transposed, for the verifier: op(X) = Xᵀ presented with its own shape, chunks
and dtype, read from X's stored blocks (the tile tasks transpose in pipeline.run.reading)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numpy.typing import NDArray

from pipeline.store import inputs


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


def open_operand(url: str, options: dict[str, Any], name: str, transposed: bool) -> Any:
    """An input opened read-only in a task, as the product uses it."""
    array = inputs.open_on_worker(url, options, name)
    return Transposed(array) if transposed else array


def read_operand(
    array: Any, rows: tuple[int, int], cols: tuple[int, int], dtype: str
) -> NDArray[Any]:
    """``inputs.read_block`` of an operand as used (a transposed view of the stored block when
    read transposed: no copy), as verify reads it (a bad chunk's fix: verify again)."""
    again = ", then verify again"
    if isinstance(array, Transposed):
        return inputs.read_block(array.stored, cols, rows, dtype, retry=again).T
    return inputs.read_block(array, rows, cols, dtype, retry=again)

"""Reading blocks for the verifier with non-finite values (NaN, ±inf) read as 0, and comparing
C's non-finite elements with the ones A and B imply (see pipeline/verify/check.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.verify.transposed import read_operand

OVERFLOW_MARGIN = 2.0
"""|C_ij| <= ‖A_i‖₂·‖B_j‖₂; a bound above 1/OVERFLOW_MARGIN of C's largest value may overflow."""


def read_finite(
    array: Any, rows: tuple[int, int], cols: tuple[int, int], wide: str
) -> tuple[NDArray[Any], NDArray[np.bool_] | None]:
    """A block in ``wide`` with its non-finite values set to 0, and where they were (None when
    it has none)."""
    block = read_operand(array, rows, cols, wide)  # A or B as used (maybe transposed)
    if np.dtype(array.dtype).kind not in "fc":
        return block, None
    nonfinite = ~np.isfinite(block)
    if not nonfinite.any():
        return block, None
    block[nonfinite] = 0
    return block, nonfinite


def any_per_row(block: NDArray[Any], nonfinite: NDArray[np.bool_] | None) -> NDArray[np.bool_]:
    if nonfinite is None:
        return np.zeros(block.shape[0], dtype=bool)
    return np.asarray(nonfinite.any(axis=1))


class NonfinitePattern:
    """Compares, block by block of a row block of C, its non-finite elements with the ones a
    non-finite row of A or column of B implies."""

    def __init__(
        self,
        row0: int,
        bad_rows: NDArray[np.bool_],
        bad_columns: NDArray[np.bool_],
        a_norms: NDArray[np.float64],
        b_norms: NDArray[np.float64],
        largest: float,
    ) -> None:
        self.row0, self.bad_rows, self.bad_columns = row0, bad_rows, bad_columns
        self.a_norms, self.b_norms, self.largest = a_norms, b_norms, largest
        self.mismatched = np.zeros(len(bad_rows), dtype=bool)
        self.unexpected = self.overflow = self.missing = 0
        self.first: tuple[int, int] | None = None

    def check(self, block: NDArray[Any], nonfinite: NDArray[np.bool_] | None, c0: int) -> None:
        cols = slice(c0, c0 + block.shape[1])
        if nonfinite is None and not (self.bad_rows.any() or self.bad_columns[cols].any()):
            return  # the common case: nothing non-finite, nothing implied
        implied = self.bad_rows[:, None] | self.bad_columns[None, cols]
        found = np.zeros(block.shape, dtype=bool) if nonfinite is None else nonfinite
        unexpected, missing = found & ~implied, implied & ~found
        wrong = unexpected | missing
        if not wrong.any():
            return
        self.mismatched |= wrong.any(axis=1)
        i, j = np.nonzero(unexpected)
        self.unexpected += len(i)
        bound = self.a_norms[i] * self.b_norms[c0 + j]  # >= |C_ij| (Cauchy-Schwarz)
        self.overflow += int((bound * OVERFLOW_MARGIN >= self.largest).sum())
        self.missing += int(missing.sum())
        first = np.argwhere(wrong)[0]
        here = (self.row0 + int(first[0]), c0 + int(first[1]))
        self.first = here if self.first is None else min(self.first, here)


def stream_rows(
    array: Any,
    rows: tuple[int, int],
    col_chunk: int,
    right: Any,
    wide: str,
    pattern: NonfinitePattern | None = None,
) -> tuple[Any, NDArray[np.float64], NDArray[np.int64]]:
    """(X·right, squared row norms of X, non-finite values per row) for X = array[rows, :] with
    its non-finite values read as 0, one column chunk at a time."""
    cols = array.shape[1]
    product = np.zeros((rows[1] - rows[0], right.shape[1]), dtype=wide)
    squares = np.zeros(rows[1] - rows[0])
    counts = np.zeros(rows[1] - rows[0], dtype=np.int64)
    for c0 in range(0, cols, col_chunk):
        block, nonfinite = read_finite(array, rows, (c0, min(c0 + col_chunk, cols)), wide)
        if pattern is not None:
            pattern.check(block, nonfinite, c0)
        product += block @ right[c0 : c0 + block.shape[1]]
        squares += (np.abs(block) ** 2).sum(axis=1)
        if nonfinite is not None:
            counts += nonfinite.sum(axis=1)
    return product, squares, counts


def wide_dtype(dtype: Any) -> str:
    return "complex128" if np.dtype(dtype).kind == "c" else "float64"

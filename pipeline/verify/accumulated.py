"""What verify reads as C after ``C ← α·A·B + β·C_old`` (or ``--alpha``): (C − β·C_old)/α,
block by block, in float64 (complex128), so the check of C == A·B applies unchanged; and the
row norms of the stored values, whose rounding the tolerance must allow."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from pipeline.store import inputs as io


class Checked(Protocol):
    """What of verify's task spec (run/verify_tasks.CheckSpec) C's reading needs."""

    @property
    def urls(self) -> tuple[str, str, str]: ...
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def scaled(self) -> tuple[str | None, float, float] | None: ...


def checked_c(job: Checked) -> Any:
    """C as verify reads it: the stored array, or its accumulation undone."""
    c = io.open_on_worker(job.urls[2], job.options, "C")
    if job.scaled is None:
        return c
    old_url, alpha, beta = job.scaled
    old = None if old_url is None else io.open_on_worker(old_url, job.options, "C_old")
    return Undone(c, old, alpha, beta)


class Undone:
    """(C − β·C_old)/α as an array verify can slice, remembering per row the squared norms of
    C and β·C_old as read (their rounding is what the stored values carry)."""

    def __init__(self, c: Any, old: Any, alpha: float, beta: float) -> None:
        self.c, self.old, self.alpha, self.beta = c, old, alpha, beta
        self.shape, self.chunks, self.metadata = c.shape, c.chunks, c.metadata
        self.dtype = np.dtype("complex128" if np.dtype(c.dtype).kind == "c" else "float64")
        self._squares: dict[int, float] = {}

    def __getitem__(self, key: tuple[slice, slice]) -> NDArray[Any]:
        new = np.asarray(self.c[key], dtype=self.dtype)
        value = new
        size = np.abs(new)
        if self.old is not None and self.beta != 0:
            kept = self.beta * np.asarray(self.old[key], dtype=self.dtype)
            value = new - kept
            size = size + np.abs(kept)
        start = key[0].start or 0
        for i, row in enumerate(np.where(np.isfinite(size), size, 0)):
            self._squares[start + i] = self._squares.get(start + i, 0.0) + float(row @ row)
        return value / self.alpha

    def stored_norms(self, rows: tuple[int, int]) -> NDArray[np.float64]:
        """Per row: (‖C_i‖ + |β|·‖C_old,i‖)/|α| as read so far (an upper bound of each
        through the triangle inequality on |C| + |β·C_old|)."""
        squares = [self._squares.get(i, 0.0) for i in range(*rows)]
        return np.asarray(np.sqrt(np.asarray(squares)) / abs(self.alpha), dtype=np.float64)

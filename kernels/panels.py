"""Checks of an accumulator's band and panels, shared by every backend: pure, no numba."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.constants import MAX_DIM


def band_rows(rows: tuple[int, int] | None, total: int) -> tuple[int, int]:
    """(r0, r1) of an accumulator band: ``rows`` checked against ``total`` rows, or them all."""
    r0, r1 = rows or (0, total)
    if not 0 <= r0 <= r1 <= total:
        raise ValueError(f"rows {r0}:{r1} outside the accumulator's {total} rows")
    return r0, r1


def check_panels(
    shape: tuple[int, int], dtype: np.dtype[Any], a: NDArray[Any], b: NDArray[Any]
) -> None:
    """ValueError/TypeError unless a (m, w) @ b (w, n) of ``dtype`` gives ``shape``."""
    m, n = shape
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"panels must be 2-D, got a.ndim={a.ndim}, b.ndim={b.ndim}")
    if a.shape[0] != m or b.shape[1] != n or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"panel shapes a{a.shape} @ b{b.shape} do not give the accumulator's {shape}; "
            f"need a ({m}, w) and b (w, {n})"
        )
    if a.shape[1] > MAX_DIM:
        raise ValueError(f"panel width {a.shape[1]} > 2**31 - 1; split K into narrower panels")
    if a.dtype != dtype or b.dtype != dtype:
        raise TypeError(
            f"panels must be {dtype} like the accumulator, got a {a.dtype}, b {b.dtype}; "
            f"cast with astype(numpy.{dtype.name})"
        )

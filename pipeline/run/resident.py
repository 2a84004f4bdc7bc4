"""Worker side of a decomposition whose X fits the workers' memory: X read once, as row bands
of the stored array held by the workers (dask keeps each band where it was read), and every
later pass a product of those bands with a tall-skinny array of OUT, written as a pass over
storage would write it (pipeline.decompose)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.plan.standardize import Moments, block_moments, slab_moments
from pipeline.store import inputs
from pipeline.store.decomposition import open_array

SLAB_ELEMENTS = 2**20
"""An integer band is multiplied this many elements at a time, each slab cast to the
sketch's float (no float copy of the whole band)."""


def load(url: str, options: dict[str, Any], rows: tuple[int, int]) -> NDArray[Any]:
    """X's rows ``rows`` (every column) as stored, decoded."""
    x = inputs.open_on_worker(url, options, "X")
    cols = (0, int(x.shape[1]))
    return inputs.read_block(x, rows, cols, str(x.dtype), "X", url, retry=", then rerun")


def moments(band: NDArray[Any], axis: int) -> Moments:
    """A band's moments (``axis`` 1: per column over the band's rows; 0: per row)."""
    found = slab_moments(band, axis) if band.dtype.kind == "f" else None
    return found if found is not None else block_moments(band, axis)


def rows_times(
    band: NDArray[Any], rows: tuple[int, int], s_url: str, options: dict[str, Any], target: str
) -> None:
    """``target[rows] = band @ S``: the product's rows this band holds."""
    s = np.asarray(open_array(s_url, options)[:])
    out = open_array(target, options, "r+")
    out[rows[0] : rows[1]] = _times(band, s, False).astype(out.dtype)


def columns_times(
    band: NDArray[Any], rows: tuple[int, int], s_url: str, options: dict[str, Any]
) -> NDArray[Any]:
    """``band.T @ S[rows]``: this band's share of a product over X's rows (summed after)."""
    s = np.asarray(open_array(s_url, options)[rows[0] : rows[1]])
    return _times(band, s, True)


def add(a: NDArray[Any], b: NDArray[Any]) -> NDArray[Any]:
    total: NDArray[Any] = np.add(a, b)
    return total


def write(values: NDArray[Any], target: str, options: dict[str, Any]) -> None:
    out = open_array(target, options, "r+")
    out[...] = values.astype(out.dtype)


def _times(band: NDArray[Any], s: NDArray[Any], transposed: bool) -> NDArray[Any]:
    """band @ s (``transposed``: bandᵀ @ s) in s's float; an integer band a slab at a time."""
    if band.dtype == s.dtype:
        product: NDArray[Any] = np.matmul(band.T, s) if transposed else np.matmul(band, s)
        return product
    step = max(1, SLAB_ELEMENTS // max(band.shape[1], 1))
    if transposed:
        total = np.zeros((band.shape[1], s.shape[1]), dtype=s.dtype)
        for a in range(0, band.shape[0], step):
            total += band[a : a + step].astype(s.dtype).T @ s[a : a + step]
        return total
    out = np.empty((band.shape[0], s.shape[1]), dtype=s.dtype)
    for a in range(0, band.shape[0], step):
        out[a : a + step] = band[a : a + step].astype(s.dtype) @ s
    return out

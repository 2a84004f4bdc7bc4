"""Worker side of ``C ← α·A·B + β·C`` and of ``--alpha``: C's original tile, moved aside
before the task's first write and read from there on every run of the tile (so a retry or a
resumed job adds the product once), and the combination of a finished band, exact for an
integer C."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from pipeline.accumulate.originals import ORIGINAL, is_saved, object_keys, save_tile, sidecar_url
from pipeline.errors import InputError
from pipeline.options.job_options import JobOptions
from pipeline.plan.spec import StoreSpec, Tile
from pipeline.store.handles import cached_array
from pipeline.store.output import Output


class TileTask(Protocol):
    """What of a tile task (pipeline.run.spec.TaskSpec) the accumulation reads."""

    @property
    def options(self) -> JobOptions: ...

    @property
    def out_dtype(self) -> str: ...

    @property
    def output(self) -> Output: ...

    @property
    def store(self) -> StoreSpec: ...

    @property
    def lock_token(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...


class Originals:
    """C_old of one tile, read from ``original/`` a band at a time (in the band writer's
    thread, beside the product, rather than all of it before the product starts)."""

    def __init__(self, array: Any, tile: Tile) -> None:
        self.array, self.tile = array, tile

    def rows(self, start: int, stop: int) -> NDArray[Any]:
        """Rows ``start:stop`` of the tile (counted from its first row)."""
        first = self.tile.rows[0]
        return np.asarray(self.array[first + start : first + stop, slice(*self.tile.cols)])


def original(spec: TileTask, tile: Tile) -> Originals | None:
    """C_old of the tile (None unless accumulating), read from the accumulation's
    ``original/`` after the tile's objects are moved there (once: a marker says they all
    are)."""
    if not spec.options.accumulate:
        return None
    if not is_saved(spec.output, tile.index):
        spec.output.check_fence(spec.lock_token)  # a stopped job's task moves nothing
        c = spec.output.writable(spec.fingerprint)
        save_tile(spec.output, tile.index, object_keys(c, tile.rows, tile.cols))
    url = f"{sidecar_url(spec.output)}/{ORIGINAL}"
    return Originals(cached_array(url, spec.store.storage_options, spec.fingerprint), tile)


def combine(spec: TileTask, product: NDArray[Any], old: NDArray[Any] | None) -> NDArray[Any]:
    """α·product (+ β·old), in OUT's dtype: floats in the accumulator's dtype; integers
    exactly (``integer_sum``), a sum beyond C's range refused, never wrapped."""
    out = np.dtype(spec.out_dtype)
    alpha, beta = spec.options.alpha, spec.options.beta
    if old is None and alpha == 1:
        return np.ascontiguousarray(product, dtype=out)
    if out.kind not in "biu":  # new arrays throughout: ``product`` may be a reused buffer
        dt = product.dtype
        value = product if alpha == 1 else product * np.asarray(alpha, dtype=dt)
        if old is not None:
            kept = old.astype(dt, copy=False)
            value = value + (kept if beta == 1 else kept * np.asarray(beta, dtype=dt))
        return np.ascontiguousarray(value, dtype=out)
    terms = [(int(alpha), product)] + ([] if old is None else [(int(beta), old)])
    value, found = integer_sum(terms, out)
    if found is not None:
        raise InputError(
            f"integer overflow: α·A·B + β·C reaches {found[0]}..{found[1]}, beyond C's {out} "
            f"range; the job stops and C is put back as it was: accumulate into a wider C"
        )
    return value


SMALL = 1 << 30
"""Factors and values at most this large in magnitude: two products and their sum stay
below 2**62, so int64 holds them exactly."""


def integer_sum(
    terms: list[tuple[int, NDArray[Any]]], out: np.dtype[Any]
) -> tuple[NDArray[Any], tuple[int, int] | None]:
    """Σ factor·array exactly, in ``out``: int64 where every factor and value is small, else
    Python's integers (a 64-bit C near its ends). Returns the values and None, or the lowest
    and highest sums found when some leave ``out``'s range (nothing is rounded: no float
    stands between C's values and the verdict)."""
    lo, hi = (0, 1) if out.kind == "b" else (int(np.iinfo(out).min), int(np.iinfo(out).max))
    shape = terms[0][1].shape
    small = np.ones(shape, bool)
    if any(abs(f) > SMALL for f, _ in terms):
        small[...] = False
    for _, x in terms:
        small &= (x >= -SMALL) & (x <= SMALL)
    value = np.empty(shape, out)
    fast = np.zeros(int(small.sum()), np.int64)
    exact = np.zeros(small.size - fast.size, object)  # Python's integers: no bound, no wrap
    for f, x in terms:
        fast += f * x[small].astype(np.int64)
        exact += x[~small].astype(object) * f
    ends = [int(v) for part in (fast, exact) if part.size for v in (part.min(), part.max())]
    if ends and (min(ends) < lo or max(ends) > hi):
        return value, (min(ends), max(ends))
    value[small] = fast
    if exact.size:
        value[~small] = np.array(list(exact), dtype=out)
    return value, None

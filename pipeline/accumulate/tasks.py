"""Worker side of ``C ← α·A·B + β·C`` and of ``--alpha``: C's original tile, moved aside
before the task's first write and read from there on every run of the tile (so a retry or a
resumed job adds the product once), and the combination of a finished band."""

from __future__ import annotations

import json
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from pipeline.accumulate.state import ORIGINAL, SAVED, move_originals, object_keys, sidecar
from pipeline.errors import InputError
from pipeline.options.job_options import JobOptions
from pipeline.plan.spec import StoreSpec, Tile
from pipeline.store.fs import read_small, write_bytes
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
    side, options = sidecar(spec.output), spec.store.storage_options
    marker = f"{SAVED}/tile-{tile.index[0]}-{tile.index[1]}.json"
    if read_small(side.url, marker, options) is None:
        spec.output.check_fence(spec.lock_token)  # a stopped job's task moves nothing
        c = spec.output.writable(spec.fingerprint)
        move_originals(spec.output, object_keys(c, tile.rows, tile.cols))
        write_bytes(side.url, marker, json.dumps({"index": tile.index}).encode(), options)
    return Originals(cached_array(f"{side.url}/{ORIGINAL}", options, spec.fingerprint), tile)


def combine(spec: TileTask, product: NDArray[Any], old: NDArray[Any] | None) -> NDArray[Any]:
    """α·product (+ β·old), in OUT's dtype: floats in the accumulator's dtype; integers in
    int64 (or checked in float64 for 64-bit C) so a sum beyond C's range is refused, not
    wrapped."""
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
    alpha, beta = int(alpha), int(beta)
    approx = alpha * product.astype(np.float64)
    if old is not None:
        approx += beta * old.astype(np.float64)
    info = np.iinfo(out) if out.kind != "b" else np.iinfo(np.uint8)
    if approx.size and (approx.min() < info.min or approx.max() > info.max):
        raise InputError(
            f"integer overflow: α·A·B + β·C reaches {approx.min():.4g}..{approx.max():.4g}, "
            f"beyond C's {out} range; the job stops, C's original "
            f"values stay in {sidecar(spec.output).url}/{ORIGINAL}: accumulate into a wider C"
        )
    value = alpha * product.astype(np.int64)
    if old is not None:
        value += beta * old.astype(np.int64)
    return np.ascontiguousarray(value, dtype=out)

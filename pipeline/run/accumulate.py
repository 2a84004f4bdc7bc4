"""Worker side of ``C ← α·A·B + β·C`` and of ``--alpha``: C's original tile, saved before the
task's first write and read back from that copy on every later run of the tile (so a retry
or a resumed job adds the product once), and the combination of a finished band."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.errors import InputError
from pipeline.plan import Tile
from pipeline.run.spec import TaskSpec
from pipeline.store.accumulate import ORIGINAL, SAVED, sidecar
from pipeline.store.fs import url_to_fs, write_bytes
from pipeline.store.handles import cached_array


def original(spec: TaskSpec, tile: Tile) -> NDArray[Any] | None:
    """C_old of the tile (None unless accumulating): from the saved copy when a previous run of
    this tile made one, else read from C and saved (whole, then marked) before C is written."""
    if not spec.accumulate:
        return None
    side = sidecar(spec.output)
    copy = cached_array(f"{side.url}/{ORIGINAL}", spec.store.storage_options, spec.fingerprint,
                        writable=True)  # fmt: skip
    rows, cols = slice(*tile.rows), slice(*tile.cols)
    marker = f"{SAVED}/tile-{tile.index[0]}-{tile.index[1]}.json"
    fs, path = url_to_fs(side.url, spec.store.storage_options)
    if fs.exists(f"{path.rstrip('/')}/{marker}"):
        return np.asarray(copy[rows, cols])
    old = np.asarray(spec.output.writable(spec.fingerprint)[rows, cols])
    copy[rows, cols] = old
    write_bytes(side.url, marker, json.dumps({"index": tile.index}).encode(),
                spec.store.storage_options)  # fmt: skip
    return old


def combine(spec: TaskSpec, product: NDArray[Any], old: NDArray[Any] | None) -> NDArray[Any]:
    """α·product (+ β·old), in OUT's dtype: floats in the accumulator's dtype; integers in
    int64 (or checked in float64 for 64-bit C) so a sum beyond C's range is refused, not
    wrapped."""
    out = np.dtype(spec.out_dtype)
    if old is None and spec.alpha == 1:
        return np.ascontiguousarray(product, dtype=out)
    if out.kind not in "biu":
        value = product * np.asarray(spec.alpha, dtype=product.dtype)
        if old is not None:
            value = value + old.astype(product.dtype) * np.asarray(spec.beta, dtype=product.dtype)
        return np.ascontiguousarray(value, dtype=out)
    alpha, beta = int(spec.alpha), int(spec.beta)
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

"""One streaming pass over X for a standardized Gram product: the moments of each variable
(pipeline.plan.standardize), measured on the workers block by block and merged in a fixed
order, so two runs over the same X give the same bytes."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import numpy as np
from distributed import Client

from pipeline.plan.standardize import (
    Moments,
    Standardize,
    block_moments,
    measured,
    merge,
    slab_moments,
)
from pipeline.store import inputs
from pipeline.store.fields import as_matrix

log = logging.getLogger("pipeline")

BLOCK_ELEMENTS = 2**22
"""About this many elements per task (32 MiB as float64): whole chunks each."""


def blocks(
    shape: tuple[int, int], chunks: tuple[int, int], axis: int
) -> list[list[tuple[tuple[int, int], tuple[int, int]]]]:
    """X cut into blocks of whole chunks, grouped by the variables they hold (``axis`` 1:
    column bands, each a list of its row blocks in order; 0: row bands of column blocks)."""
    (m, n), (cm, cn) = shape, chunks
    across, along = (n, cn) if axis == 1 else (m, cm)  # the variables' axis
    summed, step = (m, cm) if axis == 1 else (n, cn)
    width = along * max(1, BLOCK_ELEMENTS // max(along * summed, 1))  # whole chunks
    height = step * max(1, BLOCK_ELEMENTS // max(step * min(width, across), 1))
    bands = []
    for v0 in range(0, across, width):
        v = (v0, min(v0 + width, across))
        parts = [(s0, min(s0 + height, summed)) for s0 in range(0, max(summed, 1), height)]
        bands.append([(p, v) if axis == 1 else (v, p) for p in parts])
    return bands


def block_task(
    url: str,
    options: dict[str, Any],
    name: str,
    at: Any,
    axis: int,
    code: float | None = None,
    split: int | None = None,
    slabs: bool = False,
) -> Moments:
    """Worker side: one block's moments (``code``: a value that means missing; ``split``: an
    N-D field's, pipeline.store.fields; ``slabs``: read as stored and summed in slabs,
    ``slab_moments``, where no value is missing)."""
    x = as_matrix(inputs.open_on_worker(url, options, name), split)
    rows, cols = at
    if slabs and code is None:
        native = x.dtype if np.dtype(x.dtype).kind == "f" else "float64"
        block = inputs.read_block(x, rows, cols, str(native), name, url, retry=", then rerun")
        found = slab_moments(block, axis)
        if found is not None:
            return found
        return block_moments(block, axis, code)
    block = inputs.read_block(x, rows, cols, "float64", name, url, retry=", then rerun")
    return block_moments(block, axis, code)


def measure(
    client: Client,
    url: str,
    options: dict[str, Any],
    std: Standardize,
    name: str = "X",
    split: int | None = None,
) -> Standardize:
    """``std`` with X's shifts and scales, from one pass over X on the cluster (``split``: an
    N-D field read as a matrix, pipeline.store.fields)."""
    log.info("measuring the %s of %s (one pass over it)", std.measures, name)
    return measured(std, gather(client, url, options, std.axis, std.code, name, split), name)


def gather(
    client: Client,
    url: str,
    options: dict[str, Any],
    axis: int,
    code: float | None = None,
    name: str = "X",
    split: int | None = None,
    slabs: bool = False,
) -> Moments:
    """The moments of each variable of X (``axis`` 1: its columns; 0: its rows), from one
    pass over it on the cluster (``slabs``: block_task's)."""
    x = as_matrix(inputs.open_input(url, options, name), split)
    shape = (int(x.shape[0]), int(x.shape[1]))
    chunks = (int(x.chunks[0]), int(x.chunks[1]))
    run = uuid.uuid4().hex[:8]
    merged = []
    for b, band in enumerate(blocks(shape, chunks, axis)):
        parts = [
            client.submit(
                block_task,
                url,
                options,
                name,
                at,
                axis,
                code,
                split,
                key=f"moments-{run}-{b}-{i}",
            )  # fmt: skip
            for i, at in enumerate(band)
        ]
        while len(parts) > 1:  # a tree in a fixed order: the same sums on any cluster
            pairs = zip(parts[::2], parts[1::2], strict=False)
            merged_pairs = [client.submit(merge, p, q, pure=False) for p, q in pairs]
            parts = merged_pairs + ([parts[-1]] if len(parts) % 2 else [])
        merged.append(parts[0])
    found = client.gather(merged)
    return found[0] if len(found) == 1 else concatenated(found)


def concatenated(bands: list[Moments]) -> Moments:
    """Bands of different variables over the same values: side by side."""

    def joined(name: str) -> Any:
        return np.concatenate([getattr(b, name) for b in bands])

    missing = None if all(b.missing is None for b in bands) else joined("absent")
    return Moments(
        bands[0].count, joined("mean"), joined("m2"), joined("low"), joined("high"),
        joined("nonfinite"), missing,
    )  # fmt: skip

"""Worker side: one input panel, decoded once per worker into a reused buffer.

A panel is decoded straight into a buffer of the worker's host pool (kernels.memory.buffers), which
comes back to the pool when the last task holding it lets go, so panels reuse memory instead
of faulting fresh pages in. The worker's panel cache shares a decoded panel among
the tasks that read it and forgets it after its planned readers. On the GPU path the panel
lands in the engine's pinned staging buffer: decoded there directly when nothing is cached,
else copied from the cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr
from numpy.typing import NDArray

from kernels.memory.allocators import lazy_host_allocator
from kernels.memory.buffers import BufferPool, owned_array, process_pool
from pipeline.cputime import LEDGER
from pipeline.run import events
from pipeline.run.panel_cache import CACHE
from pipeline.run.timing import PhaseTimes
from pipeline.store import inputs
from pipeline.store.fields import as_matrix


def open_task(
    spec: Any, tile: Any, panels: tuple[tuple[int, int], ...]
) -> tuple[Any, Any, events.PanelReporter]:
    """A tile task's A and B (handles cached per worker and job), the worker's panel cache
    switched to the job, and the task's progress reporter."""
    store = spec.store
    a, b = (
        as_matrix(inputs.worker_array(url, store.storage_options, spec.fingerprint), split)
        for url, split in zip((store.a_url, store.b_url), store.splits, strict=True)
    )
    CACHE.use(spec.run_id, spec.cache_bytes)
    k0 = panels[0][0] if panels else 0  # with the tile, names a split-K group
    report = events.PanelReporter(
        spec.run_id if spec.options.progress else "", tile.index, k0, len(panels)
    )
    return a, b, report


def host_pool(budget_bytes: int) -> BufferPool | None:
    """This worker process's pool of panel buffers (None: pooling off)."""
    return process_pool("host", lazy_host_allocator, budget_bytes) if budget_bytes > 0 else None


def limit_read_concurrency(chunks: int) -> None:
    """Decode at most ``chunks`` chunks at once per read, for this process (zarr's setting is
    global, like the BLAS thread count; the job's TaskSpec says; 0 leaves it). From local disk,
    decoding is CPU-bound: zarr's 10 at once only raise the peak of fresh codec buffers, and
    with them the page faults and system time on a machine with few cores."""
    if chunks > 0 and zarr.config.get("async.concurrency") != chunks:
        zarr.config.set({"async.concurrency": chunks})


def read_panel(
    spec: Any,
    array: Any,
    which: str,
    rows: tuple[int, int],
    cols: tuple[int, int],
    clock: PhaseTimes,
    out: NDArray[Any] | None = None,
) -> tuple[NDArray[Any], int]:
    """(panel ``[rows, cols]`` of op(``array``) in the task's read dtype, stored bytes decoded
    here; 0 when another task of this worker decoded it). ``which``: "A" or "B"; ``spec``: the
    task's TaskSpec. An operand read transposed is decoded as stored (``[cols, rows]``) and
    handed out as its transposed view, which BLAS reads in place; into ``out`` (the staged
    path's pinned buffer) it is copied transposed."""
    limit_read_concurrency(spec.read_concurrency)
    index = 0 if which == "A" else 1
    url = (spec.store.a_url, spec.store.b_url)[index]
    flip = spec.store.transposed[index]
    at = (cols, rows) if flip else (rows, cols)  # where the panel is stored
    shape = (at[0][1] - at[0][0], at[1][1] - at[1][0])
    stored = shape[0] * shape[1] * np.dtype(array.dtype).itemsize

    def decode(into: NDArray[Any] | None = None) -> NDArray[Any]:
        # CPU: the chunks' decoding is charged where it runs; this thread's rest is copying
        with clock.measure("decode"), LEDGER.measure("copy"):
            if into is None:
                into = owned_array(host_pool(spec.buffer_bytes), shape, spec.read_dtype)
            block = inputs.read_block(array, *at, spec.read_dtype, which, url, into)
            if spec.standardize is not None:
                spec.standardize.apply(block, *at)
            return block

    def used(panel: NDArray[Any]) -> NDArray[Any]:
        return panel.T if flip else panel

    uses = spec.panel_uses[index]
    if out is not None and (spec.cache_bytes <= 0 or uses <= 1):  # nobody else will read it
        if not flip:
            return decode(out), stored
        panel = decode()
    else:
        # A Gram product reads X as both operands: a panel decoded for one serves the other.
        key = (spec.run_id, url, *at, spec.read_dtype, "X" if spec.store.symmetric else which)
        panel, mine = CACHE.get(key, decode, uses)
        stored = stored if mine else 0
        if out is None:
            return used(panel), stored
    with clock.measure("copy"):
        np.copyto(out, used(panel))
    return out, stored

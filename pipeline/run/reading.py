"""Worker side: one input panel, decoded once per worker into a reused buffer.

A panel is decoded straight into a buffer of the worker's host pool (kernels.buffers), which
comes back to the pool when the last task holding it lets go, so panels reuse memory instead
of faulting fresh pages in (issue 13). The worker's panel cache shares a decoded panel among
the tasks that read it and forgets it after its planned readers. On the GPU path the panel
lands in the engine's pinned staging buffer: decoded there directly when nothing is cached,
else copied from the cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.allocators import lazy_host_allocator
from kernels.buffers import BufferPool, owned_array, process_pool
from pipeline.run.panels import CACHE
from pipeline.run.timing import PhaseTimes
from pipeline.store import inputs


def host_pool(budget_bytes: int) -> BufferPool | None:
    """This worker process's pool of panel buffers (None: pooling off)."""
    return process_pool("host", lazy_host_allocator, budget_bytes) if budget_bytes > 0 else None


def read_panel(
    spec: Any,
    array: Any,
    which: str,
    rows: tuple[int, int],
    cols: tuple[int, int],
    clock: PhaseTimes,
    out: NDArray[Any] | None = None,
) -> tuple[NDArray[Any], int]:
    """(panel of ``array`` in the compute dtype, stored bytes decoded here; 0 when another
    task of this worker decoded it). ``which``: "A" or "B"; ``spec``: the task's TaskSpec."""
    url = spec.store.a_url if which == "A" else spec.store.b_url
    shape = (rows[1] - rows[0], cols[1] - cols[0])
    stored = shape[0] * shape[1] * np.dtype(array.dtype).itemsize

    def decode(into: NDArray[Any] | None = None) -> NDArray[Any]:
        with clock.measure("decode"):
            if into is None:
                into = owned_array(host_pool(spec.buffer_bytes), shape, spec.compute_dtype)
            return inputs.read_block(array, rows, cols, spec.compute_dtype, which, url, into)

    uses = spec.panel_uses[0 if which == "A" else 1]
    if out is not None and (spec.cache_bytes <= 0 or uses <= 1):  # nobody else will read it
        return decode(out), stored
    key = (spec.run_id, url, rows, cols, spec.compute_dtype)
    panel, mine = CACHE.get(key, decode, uses)
    if out is not None:
        with clock.measure("copy"):
            np.copyto(out, panel)
    return (panel if out is None else out), stored if mine else 0

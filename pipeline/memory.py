"""The memory model: projected bytes of one task, host and device (pure)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.plan import MatmulPlan

WORKER_OVERHEAD_BYTES = 256 * 2**20
"""Interpreter, dask and zarr state of one worker process, kept out of the task budget."""
ZARR_CONCURRENCY = 10
"""zarr's default async.concurrency: chunks decoded or encoded at once by one read or write."""


def calculate_task_bytes(plan: MatmulPlan) -> tuple[int, int]:
    """Projected peak host and device bytes of one tile task.

    Host: the accumulator, plus the larger of two phases. Streaming K: two panels of A and B
    (the one in use and the one being prefetched), each in the stored and the compute dtype
    when those differ, and zarr's buffers for up to ZARR_CONCURRENCY chunks per panel read,
    stored and decoded. The last panel (nothing left to prefetch): one pair of panels while
    finished bands are cast and written, an encoded and a compressed copy per chunk in flight.
    With split K, the reduction holds three tiles and the write task the whole tile's buffers.
    Device: the accumulator and one panel of each input.
    """
    from pipeline.plan import row_bands

    tm, tn = plan.tile_shape
    width = max((k1 - k0 for k0, k1 in plan.k_panels), default=0)
    a_item, b_item = np.dtype(plan.a.dtype).itemsize, np.dtype(plan.b.dtype).itemsize
    c_item, o_item = np.dtype(plan.compute_dtype).itemsize, np.dtype(plan.out.dtype).itemsize
    a_panel = tm * width * (a_item + (c_item if plan.a.dtype != plan.compute_dtype else 0))
    b_panel = width * tn * (b_item + (c_item if plan.b.dtype != plan.compute_dtype else 0))
    reads = 2 * (  # a stored (compressed) and a decoded copy of each chunk in flight
        min(tm * width, ZARR_CONCURRENCY * math.prod(plan.a.chunks)) * a_item
        + min(width * tn, ZARR_CONCURRENCY * math.prod(plan.b.chunks)) * b_item
    )
    acc = tm * tn * c_item
    streaming = 2 * (a_panel + b_panel) + reads
    cast = plan.out.dtype != plan.compute_dtype

    def written(rows: int) -> int:  # zarr's buffers writing ``rows`` of the tile, and the cast
        chunks = 2 * min(rows * tn, ZARR_CONCURRENCY * math.prod(plan.out.chunks)) * o_item
        return chunks + (rows * tn * o_item if cast else 0)

    if plan.split_k > 1:
        host = max(acc + streaming, 3 * acc + written(tm))
    else:
        r0, r1 = row_bands(tm, plan.block_shape[0])[0]
        host = acc + max(streaming, a_panel + b_panel + written(r1 - r0))
    device = acc + (tm * width + width * tn) * c_item
    return host, device

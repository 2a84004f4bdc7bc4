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

    Host: the accumulator, its cast to the output dtype (if it differs), and two panels of A
    and B (the one in use and the one being prefetched), each in the stored and the compute
    dtype when those differ; plus zarr's chunk buffers: up to ZARR_CONCURRENCY decoded chunks
    per panel read, and an encoded and a compressed copy per chunk written. Device: the
    accumulator and one panel of each input.
    """
    tm, tn = plan.tile_shape
    width = max((k1 - k0 for k0, k1 in plan.k_panels), default=0)
    a_item, b_item = np.dtype(plan.a.dtype).itemsize, np.dtype(plan.b.dtype).itemsize
    c_item, o_item = np.dtype(plan.compute_dtype).itemsize, np.dtype(plan.out.dtype).itemsize
    a_panel = tm * width * (a_item + (c_item if plan.a.dtype != plan.compute_dtype else 0))
    b_panel = width * tn * (b_item + (c_item if plan.b.dtype != plan.compute_dtype else 0))
    reads = (
        min(tm * width, ZARR_CONCURRENCY * math.prod(plan.a.chunks)) * a_item
        + min(width * tn, ZARR_CONCURRENCY * math.prod(plan.b.chunks)) * b_item
    )
    writes = 2 * min(tm * tn, ZARR_CONCURRENCY * math.prod(plan.out.chunks)) * o_item
    acc = tm * tn * c_item
    reduce = 3 * acc + writes if plan.split_k > 1 else 0
    cast = tm * tn * o_item if plan.out.dtype != plan.compute_dtype else 0
    host = max(acc + cast + 2 * (a_panel + b_panel) + reads + writes, reduce)
    device = acc + (tm * width + width * tn) * c_item
    return host, device

"""The memory model: projected bytes of a task and of a worker, from plain numbers (pure)."""

from __future__ import annotations

import math

import numpy as np

WORKER_OVERHEAD_BYTES = 256 * 2**20
"""Interpreter, dask and zarr state of one worker process, kept out of the task budget."""
ZARR_CONCURRENCY = 10
"""zarr's default async.concurrency: chunks decoded or encoded at once by one read or write."""


def calculate_task_bytes(
    *,
    tile_shape: tuple[int, int],
    panel_width: int,
    dtypes: tuple[str, str, str, str],
    chunks: tuple[tuple[int, int], tuple[int, int], tuple[int, int]],
    split_k: int,
    first_band_rows: int,
) -> tuple[int, int]:
    """Projected peak host and device bytes of one tile task.

    ``dtypes``: A's, B's, the compute and the output dtype; ``chunks``: A's, B's and OUT's
    outer chunks (its shards when sharded: zarr encodes a shard whole before storing it).
    Host: the accumulator, plus the larger of two phases. Streaming K: two panels of A and B
    (the one in use and the one being prefetched), each in the stored and the compute dtype
    when those differ, and zarr's buffers for up to ZARR_CONCURRENCY chunks per panel read,
    stored and decoded. The last panel (nothing left to prefetch): one pair of panels while
    finished bands (``first_band_rows`` is the largest) are cast and written, an encoded and a
    compressed copy per chunk in flight. With split K, the reduction holds three tiles and the
    write task the whole tile's buffers. Device: the accumulator and one panel of each input.
    """
    tm, tn = tile_shape
    width = panel_width
    a_dtype, b_dtype, compute_dtype, out_dtype = dtypes
    a_item, b_item = np.dtype(a_dtype).itemsize, np.dtype(b_dtype).itemsize
    c_item, o_item = np.dtype(compute_dtype).itemsize, np.dtype(out_dtype).itemsize
    a_panel = tm * width * (a_item + (c_item if a_dtype != compute_dtype else 0))
    b_panel = width * tn * (b_item + (c_item if b_dtype != compute_dtype else 0))
    reads = 2 * (  # a stored (compressed) and a decoded copy of each chunk in flight
        min(tm * width, ZARR_CONCURRENCY * math.prod(chunks[0])) * a_item
        + min(width * tn, ZARR_CONCURRENCY * math.prod(chunks[1])) * b_item
    )
    acc = tm * tn * c_item
    streaming = 2 * (a_panel + b_panel) + reads
    cast = out_dtype != compute_dtype

    def written(rows: int) -> int:  # zarr's buffers writing ``rows`` of the tile, and the cast
        in_flight = 2 * min(rows * tn, ZARR_CONCURRENCY * math.prod(chunks[2])) * o_item
        return in_flight + (rows * tn * o_item if cast else 0)

    if split_k > 1:
        host = max(acc + streaming, 3 * acc + written(tm))
    else:
        host = acc + max(streaming, a_panel + b_panel + written(first_band_rows))
    device = acc + (tm * width + width * tn) * c_item
    return host, device


def calculate_worker_bytes(
    *, task_bytes: int, busy_threads: int, held_partials: int, partial_bytes: int
) -> int:
    """A worker's busy threads x a task, plus the split-K partials waiting for their reduction."""
    return busy_threads * task_bytes + held_partials * partial_bytes


def calculate_cache_bytes(
    *, memory_limit_bytes: int, worker_bytes: int, cache_fraction: float, inputs_bytes: int
) -> int:
    """A share of the spare memory (at most all of both inputs) keeps decoded panels for reuse."""
    spare = memory_limit_bytes - WORKER_OVERHEAD_BYTES - worker_bytes
    return max(min(int(spare * cache_fraction), inputs_bytes), 0)

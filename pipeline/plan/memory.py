"""The memory model: projected bytes of a task and of a worker, from plain numbers (pure)."""

from __future__ import annotations

import math

import numpy as np

from kernels.exact import panel_dtype, product_dtype

WORKER_OVERHEAD_BYTES = 256 * 2**20
"""Interpreter, dask and zarr state of one worker process, kept out of the task budget."""
ZARR_CONCURRENCY = 10
"""zarr's default async.concurrency: chunks decoded or encoded at once by one read or write."""
ZARR_BYTES_PER_CHUNK = 2560
"""zarr's bookkeeping for each chunk of one read or write, made for all of them up front (its
projection and task): 2.15 KB traced, 2.2 KB resident (zarr 3.1.6, 10^4-10^6 1x1 chunks)."""


def calculate_task_bytes(
    *,
    tile_shape: tuple[int, int],
    panel_width: int,
    dtypes: tuple[str, str, str, str],
    chunks: tuple[tuple[int, int], tuple[int, int], tuple[int, int]],
    split_k: int,
    first_band_rows: int,
    shape: tuple[int, int, int] | None = None,
    prior: bool = False,
) -> tuple[int, int]:
    """Projected peak host and device bytes of one tile task.

    ``dtypes``: A's, B's, the compute and the output dtype; ``chunks``: A's, B's and OUT's
    outer chunks (its shards when sharded: zarr encodes a shard whole before storing it);
    ``shape``: M, K and N (None: unbounded axes, a little more conservative).
    Host: the accumulator, plus the larger of two phases. Streaming K: two panels of A and B
    (the one in use and the one being prefetched), each in the stored and the compute dtype
    when those differ, and zarr's memory for each panel read (zarr_bytes: every chunk it
    touches costs bookkeeping, up to ZARR_CONCURRENCY of them a stored and a decoded copy, each
    whole, even one larger than the array). The last panel (nothing left to prefetch): one pair
    of panels while finished bands (``first_band_rows`` is the largest) are cast and written,
    zarr's memory for each band write. With split K, the reduction holds three tiles and the
    write task the whole tile's buffers. Device: the accumulator and one panel of each input.
    ``prior`` (--accumulate): C's original tile is read (zarr's buffers) and kept all along.
    """
    tm, tn = tile_shape
    width = panel_width
    a_dtype, b_dtype, compute_dtype, out_dtype = dtypes
    a_item, b_item = np.dtype(a_dtype).itemsize, np.dtype(b_dtype).itemsize
    c_item, o_item = np.dtype(compute_dtype).itemsize, np.dtype(out_dtype).itemsize
    # Panels are read in the compute dtype, integers in the float that holds them (and moved
    # to float64 where float32 blocks would be too short): kernels.exact.
    panel, work = (f(a_dtype, b_dtype, compute_dtype) for f in (panel_dtype, product_dtype))
    p_item = np.dtype(panel).itemsize + (np.dtype(work).itemsize if work != panel else 0)
    a_panel = tm * width * (a_item + (p_item if a_dtype != panel else 0))
    b_panel = width * tn * (b_item + (p_item if b_dtype != panel else 0))
    m, k, n = shape or (None, None, None)
    reads = zarr_bytes((tm, width), chunks[0], (m, k), a_item) + zarr_bytes(
        (width, tn), chunks[1], (k, n), b_item
    )
    acc = tm * tn * c_item
    streaming = 2 * (a_panel + b_panel) + reads
    cast = out_dtype != compute_dtype

    def written(rows: int) -> int:  # zarr's buffers writing ``rows`` of the tile, and the cast
        in_flight = zarr_bytes((rows, tn), chunks[2], (m, n), o_item)
        return in_flight + (rows * tn * o_item if cast else 0)

    if split_k > 1:
        host = max(acc + streaming, 3 * acc + written(tm))
    else:
        host = acc + max(streaming, a_panel + b_panel + written(first_band_rows))
    if prior:  # the original tile, and the band combining it with the product
        original = tm * tn * o_item
        host += original + first_band_rows * tn * c_item
        host = max(host, acc + original + zarr_bytes((tm, tn), chunks[2], (m, n), o_item))
    device = acc + (tm * width + width * tn) * c_item
    return host, device


def zarr_bytes(
    block: tuple[int, int],
    chunk: tuple[int, int],
    extent: tuple[int | None, int | None],
    itemsize: int,
) -> int:
    """zarr's memory reading (or writing) ``block``: a stored and a decoded (or an encoded and
    a compressed) copy of up to ZARR_CONCURRENCY of the chunks it touches, each whole, and its
    bookkeeping for every one of them."""
    touched = math.prod(
        chunks_touched(span, size, axis)
        for span, size, axis in zip(block, chunk, extent, strict=True)
    )
    in_flight = min(touched, ZARR_CONCURRENCY) * math.prod(chunk) * itemsize
    return 2 * in_flight + touched * ZARR_BYTES_PER_CHUNK


def chunks_touched(span: int, chunk: int, extent: int | None) -> int:
    """The most chunks a run of ``span`` elements overlaps when runs start at multiples of
    ``span`` along an axis of ``extent`` elements (None: unbounded): a run starts at most
    ``chunk - gcd(span, chunk)`` into a chunk."""
    if span <= 0 or chunk <= 0:
        return 0
    most = -(-(span + chunk - math.gcd(span, chunk)) // chunk)
    if extent is None:
        return most
    whole = -(-extent // chunk)
    return whole if span >= extent else min(most, whole)


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

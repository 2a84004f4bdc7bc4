"""A candidate plan on a GPU (pure): the accumulator on the device, pinned staging on the
host, and the modelled time of each resource (pipeline.plan.device_model)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kernels.constants import device_decode_rate
from pipeline.plan.device_model import (
    DECODE_BYTES_PER_SECOND,
    STAGED_PANELS,
    DeviceModel,
    GpuWork,
    gpu_task_bytes,
    makespan,
    resource_seconds,
    staging_pool_bytes,
)
from pipeline.plan.matmul import (
    MatmulPlan,
    ceil_div,
    cpu_work,
    row_bands,
)
from pipeline.plan.memory import WORKER_OVERHEAD_BYTES


def fits(plan: MatmulPlan, memory_limit_bytes: int) -> bool:
    if plan.worker_bytes + WORKER_OVERHEAD_BYTES > memory_limit_bytes:
        return False
    # the tasks a worker runs at once share its GPU
    return plan.device is None or plan.busy_threads * plan.device_bytes <= plan.device.memory_bytes


def with_device(
    plan: MatmulPlan, device: DeviceModel, flops_fraction: float, decode_threads: int
) -> MatmulPlan:
    """The plan's memory and time on a GPU: accumulator on the device, staging on the host."""
    (m, k), n = plan.a.shape, plan.b.shape[1]
    tm, tn = plan.tile_shape
    width = plan.panel_width
    dtypes = (plan.a.dtype, plan.b.dtype, plan.compute_dtype, plan.out.dtype)
    band = first_band_rows(tm, plan.block_shape[0])
    host, dev = gpu_task_bytes(
        tile_shape=(tm, tn), panel_width=width, dtypes=dtypes, band_rows=band
    )
    c, o = np.dtype(plan.compute_dtype).itemsize, np.dtype(plan.out.dtype).itemsize
    if plan.split_k > 1:  # partials come back to the host to be summed
        host += 3 * tm * tn * c
    host += decode_buffer_bytes(plan, decode_threads)
    busy = plan.busy_threads
    timed = device  # the device's peak decode rate stays in the plan; the panels' is timed
    if device.decodes_chunks:
        timed = replace(device, decode_bytes_per_second=panel_decode_rate(plan, device))
    host_worker = busy * host + plan.worker_bytes - plan.cache_bytes - busy * plan.task_bytes
    rows, cols = plan.grid
    share = ceil_div(plan.n_tasks, plan.workers) / max(plan.n_tasks, 1)  # one worker's part
    computed = plan.n_tiles / max(rows * cols, 1)  # a Gram product's tiles: about half
    counted = cpu_work(plan)  # chunks and decoded bytes, as on the CPU
    work = GpuWork(
        read_bytes=share * plan.read_bytes,
        copy_bytes=share * computed * ((m * cols + n * rows) * k * c + m * n * c),
        flops=share * plan.flops,
        write_bytes=share * m * n * o,
        read_chunks=share * counted.read_chunks,
        decoded_bytes=share * counted.read_bytes,
        write_chunks=share * counted.out_chunks,
    )
    seconds = resource_seconds(
        work, timed, flops_fraction, plan.compute_dtype, decode_threads, plan.costs
    )
    # Each task fills its pipeline (first panels decoded and copied: the device waits) and
    # drains it (the last band written after the kernel), so fewer, bigger tiles fill less.
    decode_rate = DECODE_BYTES_PER_SECOND * max(decode_threads, 1)
    first = (tm + tn) * width * c
    first_decode = first / (timed.decode_bytes_per_second if device.decodes_chunks else decode_rate)
    fill = first_decode + first / device.h2d_bytes_per_second + plan.costs.task_seconds
    fill = share * plan.n_tasks * fill + band * tn * o / decode_rate
    return replace(
        plan,
        task_bytes=host,
        worker_bytes=host_worker + plan.cache_bytes,
        device_bytes=dev,
        device=device,
        resource_seconds=tuple(seconds.items()),
        modelled_seconds=makespan(seconds, fill),
        decode_threads=decode_threads,
        flops_fraction=flops_fraction,
    )


def panel_decode_rate(plan: MatmulPlan, device: DeviceModel) -> float:
    """Decoded bytes/s of --gpu-decode over a tile's panels: each operand's panel is one batch
    of whole chunks (one zstd frame each), decoded at ``device_decode_rate`` of its frame
    count, the two batches weighted by their bytes."""
    tm, tn = plan.tile_shape
    width = plan.panel_width
    (a_rows, a_cols), (b_rows, b_cols) = plan.a.chunks, plan.b.chunks
    peak = device.decode_bytes_per_second
    a_bytes, b_bytes = tm * width, width * tn  # elements; the same dtype's bytes cancel
    a_rate = device_decode_rate(peak, ceil_div(tm, a_rows) * ceil_div(width, a_cols))
    b_rate = device_decode_rate(peak, ceil_div(width, b_rows) * ceil_div(tn, b_cols))
    seconds = a_bytes / a_rate + b_bytes / b_rate
    return (a_bytes + b_bytes) / seconds if seconds else peak


def decode_buffer_bytes(plan: MatmulPlan, decode_threads: int) -> int:
    """zarr's buffers of the panels being filled at once (a decode thread each, as many as the
    staged panels): a stored and a decoded copy of one chunk each, whole (a chunk larger
    than its array is decoded whole too), and for an operand read transposed the panel as
    stored, decoded before it is placed transposed into the staging buffer."""
    fills = min(decode_threads, 2 * (STAGED_PANELS + 1))
    chunk = max(
        math.prod(plan.a.chunks) * np.dtype(plan.a.dtype).itemsize,
        math.prod(plan.b.chunks) * np.dtype(plan.b.dtype).itemsize,
    )
    (tm, tn), width = plan.tile_shape, plan.panel_width
    panels = (tm * width, width * tn)
    c = np.dtype(plan.compute_dtype).itemsize
    flipped = max((p * c for p, t in zip(panels, plan.transposed, strict=True) if t), default=0)
    return fills * (2 * chunk + flipped)


def staging_bytes(plan: MatmulPlan) -> int:
    """The budget of a worker's pinned staging pool for ``plan`` (staging_pool_bytes)."""
    return staging_pool_bytes(
        tile_shape=plan.tile_shape,
        panel_width=plan.panel_width,
        compute_dtype=plan.compute_dtype,
        band_rows=first_band_rows(plan.tile_shape[0], (plan.block_shape or (1, 1))[0]),
        tasks=plan.busy_threads,
        panel_dtype=plan.panel_dtype,
    )


def first_band_rows(rows: int, block_rows: int) -> int:
    """Rows of a tile's first (largest) write band."""
    r0, r1 = row_bands(rows, block_rows)[0]
    return r1 - r0

"""Modelled seconds of a CPU plan per resource, from counts of chunks, bytes and flops (pure).

Every stored chunk pays a fixed cost and a rate per byte for each thing done to it (fetched,
decoded; OUT's encoded, written), at the rates of the CostModel passed in (pipeline.plan.costs).
On the CPU all of it shares the worker threads: a task's product runs on the worker's shared
gemm threads while two more read its next panels and one writes its finished bands, so a job
takes about its thread-seconds over the threads, but no less than its waves of tasks, each a
chain that overlaps only in part (see makespan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.plan.costs import CostModel

INTEGER_SLOWDOWN = 60.0
"""How much slower numpy's integer matmul (it has no BLAS) is than float32 BLAS on one core,
about (benchmarks/results/integers.md)."""
INPUT = ("read", "decode")
OUTPUT = ("encode", "write")


@dataclass(frozen=True)
class Work:
    """A job's work, counted from its plan: chunks, bytes and flops."""

    flops: float
    compute_itemsize: int
    read_chunks: float
    """Input chunks fetched and decoded (a chunk read by several tiles counts each time)."""
    read_bytes: float
    """Their decoded bytes (whole chunks: a chunk is decoded whole for any part of it)."""
    out_chunks: int
    """OUT's chunks, each encoded once."""
    out_objects: int
    """OUT's stored objects (its shards when sharded, else its chunks), each written once."""
    out_bytes: int
    compressed: bool
    """OUT's chunks are compressed (integer OUT), not stored raw (float OUT)."""
    tasks: int
    accumulated_bytes: float = 0.0
    """Accumulator bytes passed over by BLAS: every tile once per K panel."""
    allocated_bytes: float = 0.0
    """Accumulator bytes allocated and copied out: every task's tile once."""
    integer_product: bool = False
    """The product is numpy's integer matmul (64-bit integers, beyond what a float multiplies
    exactly), about INTEGER_SLOWDOWN times slower than BLAS."""


def resource_seconds(work: Work, costs: CostModel) -> dict[str, float]:
    """Thread-seconds of each resource over the whole job, at ``costs``."""
    rate = costs.flops_per_second * 4 / max(work.compute_itemsize, 4)
    if work.integer_product:
        rate /= INTEGER_SLOWDOWN
    encode = costs.encode_compressed if work.compressed else costs.encode
    return {
        "read": costs.read.seconds(work.read_chunks, work.read_bytes),
        "decode": costs.decode.seconds(work.read_chunks, work.read_bytes),
        "product": work.flops / rate
        + work.accumulated_bytes * costs.accumulate_per_byte
        + work.allocated_bytes * costs.allocate_per_byte,
        "encode": encode.seconds(work.out_chunks, work.out_bytes),
        "write": costs.write.seconds(work.out_objects, work.out_bytes),
        "tasks": work.tasks * costs.task_seconds,
    }


def grouped(seconds: dict[str, float]) -> dict[str, float]:
    """The resources as a run's phases measure them: product, decode (fetching and decoding
    the inputs) and write (encoding and storing OUT)."""
    return {
        "product": seconds.get("product", 0.0),
        "decode": sum(seconds.get(k, 0.0) for k in INPUT),
        "write": sum(seconds.get(k, 0.0) for k in OUTPUT),
    }


def makespan(
    seconds: dict[str, float], *, threads: int, rounds: int, tasks: int, panels: int, bands: int
) -> float:
    """Seconds from the first task to the last, for ``tasks`` tasks in ``rounds`` waves over
    ``threads`` threads. One task is a chain: its first panels (nothing to multiply yet), then
    its product beside the reads of the rest, then its last band's write, and its fixed cost
    (scheduling, opening, journaling: latency of each wave, not work that piles up on the
    threads). The job takes the longer of its waves of chains and its work spread over the
    threads."""
    per = {k: v / max(tasks, 1) for k, v in seconds.items()}
    task_input, task_output = sum(per[k] for k in INPUT), sum(per[k] for k in OUTPUT)
    fill, drain = task_input / max(panels, 1), task_output / max(bands, 1)
    # The worker's threads share every task's gemm calls (kernels.cpu): fewer tasks than
    # threads still keep them all multiplying.
    product = per["product"] * min(max(tasks, 1), max(threads, 1)) / max(threads, 1)
    chain = fill + max(product, task_input - fill) + drain + per["tasks"]
    work = sum(v for k, v in seconds.items() if k != "tasks")
    return max(work / max(threads, 1) + fill + drain + rounds * per["tasks"], rounds * chain)


def chunks_per_pass(extent: int, span: int, chunk: int) -> float:
    """Chunks read along an axis of ``extent`` elements cut into runs of ``span`` (runs start
    at multiples of ``span``): a run touches (span + chunk - gcd) / chunk of them on average,
    every chunk at least once."""
    if extent <= 0 or span <= 0 or chunk <= 0:
        return 0.0
    runs = -(-extent // span)
    whole = -(-extent // chunk)
    each = (min(span, extent) + chunk - math.gcd(span, chunk)) / chunk
    return float(min(max(runs * each, whole), runs * whole))

"""A product's plan before its tile shape is chosen (pure): what every candidate shares, and
the candidate for one tile shape, its projected memory and modelled time included."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.plan.costs import CostModel
from pipeline.plan.device_model import DeviceModel
from pipeline.plan.gpu_candidate import first_band_rows, with_device
from pipeline.plan.matmul import MatmulPlan, ceil_div
from pipeline.plan.memory import (
    calculate_cache_bytes,
    calculate_task_bytes,
    calculate_worker_bytes,
)
from pipeline.plan.spec import ArraySpec, KPanels


@dataclass(frozen=True)
class BasePlan:
    """What every candidate plan of one product shares; ``candidate`` adds a tile shape."""

    a: ArraySpec
    b: ArraySpec
    out: ArraySpec
    compute_dtype: str
    k_panels: KPanels
    split_k: int
    workers: int
    threads_per_worker: int
    memory_limit_bytes: int
    """Budget of one worker process, in bytes."""
    block_shape: tuple[int, int]
    """Rows and columns of the output blocks each gemm call computes."""
    costs: CostModel
    """The host's cost model every candidate's seconds are modelled with."""
    transposed: tuple[bool, bool] = (False, False)
    symmetric: bool = False
    prior: bool = False
    """Each task also reads and keeps C's original tile (``C ← α·A·B + β·C``)."""
    cache_fraction: float = 0.5
    """Share of a worker's spare memory that caches decoded panels (0: no cache)."""
    device: DeviceModel | None = None
    """The GPU each worker drives (None: a CPU plan)."""
    flops_fraction: float = 1.0
    """The share of the device's modelled rate its backend reaches."""
    decode_threads: int = 1
    """A GPU plan's host threads per worker decoding panels."""

    def candidate(self, tile_shape: tuple[int, int]) -> MatmulPlan:
        """The plan for one tile shape; on a GPU its memory and time on the device."""
        plan = self._host_plan(tile_shape)
        if self.device is None:
            return plan
        return with_device(plan, self.device, self.flops_fraction, self.decode_threads)

    def _host_plan(self, tile_shape: tuple[int, int]) -> MatmulPlan:
        """The plan for one tile shape with the accumulator on the host."""
        a, b, out, compute, split = self.a, self.b, self.out, self.compute_dtype, self.split_k
        tm, tn = tile_shape
        task, device = calculate_task_bytes(
            tile_shape=(tm, tn),
            panel_width=self.k_panels.widest,
            dtypes=(a.dtype, b.dtype, compute, out.dtype),
            chunks=(a.chunks, b.chunks, out.outer_chunks),  # a shard is encoded whole
            split_k=split,
            first_band_rows=first_band_rows(tm, self.block_shape[0]),
            shape=(a.shape[0], a.shape[1], b.shape[1]),
            prior=self.prior,
        )
        tiles = ceil_div(out.shape[0], tm) * ceil_div(out.shape[1], tn)
        # Split-K partials wait in worker memory until their reduction runs.
        held = ceil_div(tiles * split, self.workers) if split > 1 else 0
        worker = calculate_worker_bytes(
            task_bytes=task,
            busy_threads=min(self.threads_per_worker, tiles * split),
            held_partials=held,
            partial_bytes=tm * tn * np.dtype(compute).itemsize,
        )
        inputs = (math.prod(a.shape) + math.prod(b.shape)) * np.dtype(compute).itemsize
        cache = calculate_cache_bytes(
            memory_limit_bytes=self.memory_limit_bytes,
            worker_bytes=worker,
            cache_fraction=self.cache_fraction,
            inputs_bytes=inputs,
        )
        return MatmulPlan(
            a=a,
            b=b,
            out=out,
            compute_dtype=compute,
            tile_shape=(tm, tn),
            k_panels=self.k_panels,
            split_k=split,
            workers=self.workers,
            threads_per_worker=self.threads_per_worker,
            memory_limit_bytes=self.memory_limit_bytes,
            block_shape=self.block_shape,
            task_bytes=task,
            worker_bytes=worker + cache,
            device_bytes=device,
            costs=self.costs,
            cache_bytes=cache,
            transposed=self.transposed,
            symmetric=self.symmetric,
        )

"""Plan: the pure layer. Shapes, chunks, dtypes, workers and a memory budget in; a frozen
``MatmulPlan`` out. Imports none of dask, distributed, zarr or numba (tested)."""

from pipeline.plan.matmul import (
    DECODE_BYTES_PER_THREAD,
    FLOPS_PER_THREAD,
    MatmulPlan,
    result_dtype,
)
from pipeline.plan.memory import WORKER_OVERHEAD_BYTES
from pipeline.plan.search import (
    MIN_TASKS,
    gemm_block,
    plan_k_panels,
    plan_matmul,
    row_bands,
)
from pipeline.plan.spec import ArraySpec, StoreSpec, Tile
from pipeline.plan.units import format_bytes, parse_size

__all__ = [
    "DECODE_BYTES_PER_THREAD",
    "FLOPS_PER_THREAD",
    "MIN_TASKS",
    "WORKER_OVERHEAD_BYTES",
    "ArraySpec",
    "MatmulPlan",
    "StoreSpec",
    "Tile",
    "format_bytes",
    "gemm_block",
    "parse_size",
    "plan_k_panels",
    "plan_matmul",
    "result_dtype",
    "row_bands",
]

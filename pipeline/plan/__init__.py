"""Plan: the pure layer. Shapes, chunks, dtypes, workers and a memory budget in; a frozen
``MatmulPlan`` out. Imports none of dask, distributed, zarr or numba (tested)."""

from pipeline.plan.dtypes import OUT_DTYPES, output_dtypes, result_dtype
from pipeline.plan.layout import output_spec, parse_pair
from pipeline.plan.matmul import (
    MatmulPlan,
    row_bands,
)
from pipeline.plan.memory import WORKER_OVERHEAD_BYTES
from pipeline.plan.search import (
    MIN_TASKS,
    gemm_block,
    plan_k_panels,
    plan_matmul,
)
from pipeline.plan.spec import ArraySpec, OutputSpec, StoreSpec, Tile
from pipeline.plan.units import format_bytes, parse_size

__all__ = [
    "MIN_TASKS",
    "OUT_DTYPES",
    "WORKER_OVERHEAD_BYTES",
    "ArraySpec",
    "MatmulPlan",
    "OutputSpec",
    "StoreSpec",
    "Tile",
    "format_bytes",
    "gemm_block",
    "output_dtypes",
    "output_spec",
    "parse_pair",
    "parse_size",
    "plan_k_panels",
    "plan_matmul",
    "result_dtype",
    "row_bands",
]

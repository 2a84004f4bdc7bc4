"""Cubed's check: a task's measured peak memory stays within the planner's projection."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from kernels.cpu import single_threaded_blas
from pipeline.run import worker
from tests.helpers import cpu_tile_task, random_matrix, write_array


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype", "shape", "chunks"),
    [
        ("float32", "float32", (1024, 1536, 768), (256, 512)),  # several K panels
        ("float32", "float64", (700, 900, 500), (128, 300)),  # cast panels to float64
        ("float64", "float64", (300, 4000, 300), (300, 700)),  # split K
    ],
)
def test_task_peak_within_projection(
    tmp_path: Path, a_dtype: str, b_dtype: str, shape: tuple[int, int, int], chunks: tuple
) -> None:
    m, k, n = shape
    rng = np.random.default_rng(0)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (m, k), a_dtype), chunks)
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (k, n), b_dtype), chunks[::-1])
    plan, spec = cpu_tile_task(a_url, b_url, tmp_path / "c.zarr", threads=2, cache_fraction=0)
    tile = max(plan.tiles(), key=lambda t: t.shape[0] * t.shape[1])
    group = plan.k_groups()[0]
    # Process state set up once on a worker's first task (threadpoolctl's view of the BLAS
    # libraries, ~190 KB that stay) is the worker's overhead, not the task's: set it up first.
    single_threaded_blas()
    tracemalloc.start()
    try:
        if plan.split_k == 1:
            worker.tile_product_write(spec, tile, group)
        else:
            worker.tile_product(spec, tile, group)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= plan.task_bytes, f"peak {peak} > projected {plan.task_bytes}"
    assert peak >= plan.task_bytes // 4, f"projection {plan.task_bytes} is far above {peak}"

"""Test helpers: write inputs, make matrices, compare a product with float64 numpy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import zarr

REPO = Path(__file__).resolve().parents[1]

TOLERANCE = {
    "float16": 1e-2,
    "float32": 2e-4,
    "float64": 1e-11,
    "complex64": 2e-4,
    "complex128": 1e-11,
}
"""Relative error allowed against float64 numpy, scaled by |A|·|B|."""


def run_cli(
    *args: str,
    module: str = "pipeline",
    env: dict[str, str | None] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from this checkout; ``env`` changes the environment (None
    unsets a variable)."""
    environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
        check=False,
    )


def write_array(
    path: Path, data: np.ndarray[Any, Any], chunks: tuple[int, int], zarr_format: int = 3
) -> str:
    zarr.create_array(str(path), data=data, chunks=chunks, zarr_format=zarr_format)  # type: ignore[arg-type]
    return str(path)


def random_matrix(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> Any:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dt)
    if dt.kind == "c":
        return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dt)
    return rng.integers(-5, 5, shape).astype(dt)


def assert_product(out: Any, a: Any, b: Any, dtype: str | None = None) -> None:
    """out == a @ b against float64 (or complex128) numpy, tolerance by dtype and |A|·|B|;
    out's dtype is ``dtype`` when given, else numpy.result_type(a, b)."""
    got = np.asarray(out)
    wide = "complex128" if np.iscomplexobj(a) or np.iscomplexobj(b) else "float64"
    want = a.astype(wide) @ b.astype(wide)
    assert got.shape == want.shape
    assert got.dtype == np.dtype(dtype or np.result_type(a.dtype, b.dtype))
    assert not np.isnan(got).any(), "unwritten (NaN) elements in the output"
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        return
    scale = np.abs(a).astype("float64") @ np.abs(b).astype("float64") + 1e-30
    rel = np.abs(got.astype(wide) - want) / scale
    assert rel.max(initial=0.0) <= TOLERANCE[str(got.dtype)], rel.max()


def cpu_tile_task(
    a_url: str, b_url: str, out: Path, threads: int = 1, **plan_options: Any
) -> tuple[Any, Any]:
    """(plan, TaskSpec) to run tile tasks directly, OUT created: the CPU backend on one worker
    with ``threads`` threads and 2 GiB, as ``multiply`` would plan and specify it."""
    from pipeline.job import fingerprint
    from pipeline.plan import StoreSpec, plan_matmul
    from pipeline.run.spec import TaskSpec
    from pipeline.store.inputs import array_spec, open_input
    from pipeline.store.output import Output

    a, b = array_spec(open_input(a_url), "A"), array_spec(open_input(b_url), "B")
    plan = plan_matmul(
        a, b, workers=1, threads_per_worker=threads, memory_limit_bytes=2**31, **plan_options
    )
    Output(str(out)).create(plan.out.shape, plan.out.chunks, plan.out.dtype, {})
    spec = TaskSpec(
        StoreSpec(a_url, b_url, str(out)),
        "cpu",
        plan.compute_dtype,
        plan.out.dtype,
        fingerprint(plan),
        block_shape=plan.block_shape,
    )
    return plan, spec

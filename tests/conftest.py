"""Shared fixtures. The CUDA simulator is switched on before anything imports numba."""

from __future__ import annotations

import os
import sys

# Too late once numba is imported: the CUDA kernel tests would then skip silently.
assert "numba" not in sys.modules, "numba was imported before tests/conftest.py"
# CPU-only CI runs the CUDA kernels in the simulator; `make test-gpu` (TILEGEMM_TEST_GPU=1) runs
# the `gpu` tests on a real device instead.
if os.environ.get("TILEGEMM_TEST_GPU") != "1":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__DAEMON", "False")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import zarr  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

TOLERANCE = {
    "float16": 1e-2,
    "float32": 2e-4,
    "float64": 1e-11,
    "complex64": 2e-4,
    "complex128": 1e-11,
}
"""Relative error allowed against float64 numpy, scaled by |A|·|B|."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine (simulator only)")
    for item in items:
        if "gpu" in item.keywords and not _real_gpu():
            item.add_marker(skip)


def _real_gpu() -> bool:
    from cluster import count_gpus

    return os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" and count_gpus() > 0


@pytest.fixture(scope="session")
def client() -> Iterator[Client]:
    """One LocalCluster for the session: 2 worker processes x 1 thread, loopback only."""
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=":0",
            memory_limit="4GiB",
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


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


def assert_product(out: Any, a: Any, b: Any) -> None:
    """out == a @ b against float64 (or complex128) numpy, tolerance by dtype and |A|·|B|."""
    got = np.asarray(out)
    wide = "complex128" if np.iscomplexobj(a) or np.iscomplexobj(b) else "float64"
    want = a.astype(wide) @ b.astype(wide)
    assert got.shape == want.shape
    assert got.dtype == np.result_type(a.dtype, b.dtype)
    assert not np.isnan(got).any(), "unwritten (NaN) elements in the output"
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        return
    scale = np.abs(a).astype("float64") @ np.abs(b).astype("float64") + 1e-30
    rel = np.abs(got.astype(wide) - want) / scale
    assert rel.max(initial=0.0) <= TOLERANCE[str(got.dtype)], rel.max()

"""Block-product backends. Nothing here knows about Dask or Zarr; numba is imported lazily."""

from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

BACKENDS = ("auto", "cuda", "cpu")
CUDA_DTYPES = ("float32", "float64")


class Accumulator(Protocol):
    def add(self, a: NDArray[Any], b: NDArray[Any]) -> None: ...
    def result(self) -> NDArray[Any]: ...


def make_accumulator(backend: str, shape: tuple[int, int], dtype: str) -> Accumulator:
    """A zeroed ``shape`` accumulator on the given backend ("cpu" or "cuda")."""
    if backend == "cuda":
        from kernels.cuda_host import CudaAccumulator

        return CudaAccumulator(shape, np.dtype(dtype))
    from kernels.cpu import CpuAccumulator

    return CpuAccumulator(shape, dtype)


def probe_devices() -> dict[str, bool]:
    """What this process can run: a real GPU, and CUDA at all (the simulator counts there)."""
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    try:
        from kernels.cuda_host import cuda_available

        cuda = cuda_available()
    except Exception:  # noqa: BLE001 - any import or driver failure means "no CUDA"
        cuda = False
    return {"gpu": cuda and not simulator, "cuda": cuda, "simulator": simulator}

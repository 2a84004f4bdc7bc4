"""Block-product backends. Nothing here knows about Dask or Zarr; numba is imported lazily."""

from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

BACKENDS = ("auto", "cuda", "cpu", "cublas")
CUDA_DTYPES = ("float32", "float64")


class Accumulator(Protocol):
    """``acc += a @ b`` over K panels. ``rows=(r0, r1)`` works on that band of the accumulator
    only (``a`` then holds just those rows), so a finished band can be written out while the
    next one is computed; the bytes are the same as for whole-accumulator calls."""

    def add(
        self, a: NDArray[Any], b: NDArray[Any], rows: tuple[int, int] | None = None
    ) -> None: ...
    def result(self, rows: tuple[int, int] | None = None) -> NDArray[Any]: ...


def make_accumulator(
    backend: str, shape: tuple[int, int], dtype: str, block: tuple[int, int] | None = None
) -> Accumulator:
    """A zeroed ``shape`` accumulator on the given backend ("cpu", "cuda" or "cublas").

    ``block``: the CPU backend's fixed gemm block (see kernels.cpu); the GPU kernels sum each
    element in K order whatever the launch shape, so they don't need it.
    """
    if backend == "cuda":
        from kernels.cuda_host import CudaAccumulator

        return CudaAccumulator(shape, np.dtype(dtype))
    if backend == "cublas":
        from kernels.cublas import CublasAccumulator

        return CublasAccumulator(shape, np.dtype(dtype))
    from kernels.cpu import CpuAccumulator

    return CpuAccumulator(shape, dtype, block)


def probe_devices(need_cuda: bool = False, need_cublas: bool = False) -> dict[str, bool]:
    """What this process can run: a real GPU, and CUDA at all (the simulator counts there).

    NVML answers "is there a GPU" cheaply; numba (~1 s to import) is loaded only when a GPU is
    there or the cuda backend was asked for explicitly. The "cublas" key (CuPy and a GPU) is
    there only when asked for, so the other backends never import CuPy.
    """
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    cuda = False
    if need_cuda or (_nvml_gpus() > 0 and not simulator):
        try:
            from kernels.cuda_host import cuda_available

            cuda = cuda_available()
        except Exception:  # noqa: BLE001 - any import or driver failure means "no CUDA"
            cuda = False
    found = {"gpu": cuda and not simulator, "cuda": cuda, "simulator": simulator}
    if need_cublas:
        from kernels.cublas import cublas_available

        found["cublas"] = cublas_available()
    return found


def _nvml_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - no driver or library: no GPU
        return 0

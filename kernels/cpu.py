"""CPU backend: BLAS gemm with beta=1 straight into a preallocated accumulator.

``acc += a @ b`` costs ~20 % more than one matmul (a temporary and an extra pass per panel), so
float32/float64 call cblas ?gemm with beta=1 on numpy's own OpenBLAS through ctypes, which
releases the GIL (scipy.linalg.blas.sgemm holds it: two Dask threads ran at the speed of one).
Where that library isn't found, numpy's matmul plus an add is the fallback.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.launch import band_rows

ROW_MAJOR, NO_TRANS = 101, 111
_SYMBOLS = {
    "float32": ("scipy_cblas_sgemm64_", ctypes.c_float),
    "float64": ("scipy_cblas_dgemm64_", ctypes.c_double),
}


@functools.cache
def _openblas() -> Any:
    """numpy's bundled 64-bit-int OpenBLAS (numpy >= 2 wheels), or None."""
    folder = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(folder, "libscipy_openblas64_*")):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@functools.cache
def cblas_gemm(dtype: str) -> Any:
    """A ctypes cblas ?gemm for dtype, or None when unavailable."""
    lib = _openblas()
    if lib is None or dtype not in _SYMBOLS:
        return None
    name, scalar = _SYMBOLS[dtype]
    fn = getattr(lib, name, None)
    if fn is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        i64,
        i64,
        i64,
        scalar,
        ptr,
        i64,
        ptr,
        i64,
        scalar,
        ptr,
        i64,
    ]
    fn.restype = None
    return fn


@functools.cache
def single_threaded_blas() -> None:
    """One BLAS thread per call, for good, in this process (a worker's tasks are its threads).

    OpenBLAS's rounding also depends on its thread count, so this is needed for bytes that do
    not depend on the cluster; a nanny sets the same through OPENBLAS_NUM_THREADS, but an
    in-process worker (LocalCluster(processes=False)) shares the caller's BLAS.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


class CpuAccumulator:
    """``acc += a @ b`` over K panels, in one C-ordered host buffer.

    Each gemm call computes one ``block`` of the accumulator: OpenBLAS's rounding depends on the
    call's M and N, so fixed blocks (aligned to the output, whatever the tile) make the bytes
    independent of the tiling and so of the cluster.
    """

    def __init__(
        self,
        shape: tuple[int, int],
        dtype: np.dtype[Any] | str,
        block: tuple[int, int] | None = None,
    ) -> None:
        self.acc = np.zeros(shape, dtype=dtype)
        self.block = (
            (max(block[0], 1), max(block[1], 1)) if block else (max(shape[0], 1), max(shape[1], 1))
        )
        self._gemm = cblas_gemm(self.acc.dtype.name)
        single_threaded_blas()

    def add(self, a: NDArray[Any], b: NDArray[Any], rows: tuple[int, int] | None = None) -> None:
        """acc[rows] += a @ b; a band must start on a block row, so each gemm call (and so
        each rounding) is the same as in a whole-accumulator call."""
        r0, r1 = band_rows(rows, self.acc.shape[0])
        if r0 % self.block[0]:
            raise ValueError(f"rows {r0}:{r1} must start on a block row of {self.block[0]}")
        acc = self.acc[r0:r1]
        if a.shape[1] == 0 or acc.size == 0:
            return
        a = np.ascontiguousarray(a, dtype=acc.dtype)
        b = np.ascontiguousarray(b, dtype=acc.dtype)
        (m, k), n = a.shape, b.shape[1]
        if (m, n) != acc.shape or b.shape[0] != k:
            raise ValueError(f"panels {a.shape} @ {b.shape} don't fit accumulator rows {acc.shape}")
        (bm, bn), item = self.block, acc.itemsize
        for i in range(0, m, bm):
            for j in range(0, n, bn):
                h, w = min(bm, m - i), min(bn, n - j)
                if self._gemm is None:  # integers, complex, bool, or no OpenBLAS found
                    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf: verify checks
                        acc[i : i + h, j : j + w] += a[i : i + h] @ b[:, j : j + w]
                    continue
                self._gemm(
                    ROW_MAJOR,
                    NO_TRANS,
                    NO_TRANS,
                    h,
                    w,
                    k,
                    1.0,
                    a.ctypes.data + i * k * item,
                    k,
                    b.ctypes.data + j * item,
                    n,
                    1.0,
                    acc.ctypes.data + (i * n + j) * item,
                    n,
                )

    def result(self, rows: tuple[int, int] | None = None) -> NDArray[Any]:
        r0, r1 = band_rows(rows, self.acc.shape[0])
        return self.acc[r0:r1]

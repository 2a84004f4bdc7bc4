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

ROW_MAJOR, NO_TRANS = 101, 111
_SYMBOLS = {"float32": ("scipy_cblas_sgemm64_", ctypes.c_float),
            "float64": ("scipy_cblas_dgemm64_", ctypes.c_double)}  # fmt: skip


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
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i64, i64, i64, scalar, ptr, i64,
                   ptr, i64, scalar, ptr, i64]  # fmt: skip
    fn.restype = None
    return fn


class CpuAccumulator:
    """``acc += a @ b`` over K panels, in one C-ordered host buffer."""

    def __init__(self, shape: tuple[int, int], dtype: np.dtype[Any] | str) -> None:
        self.acc = np.zeros(shape, dtype=dtype)
        self._gemm = cblas_gemm(self.acc.dtype.name)

    def add(self, a: NDArray[Any], b: NDArray[Any]) -> None:
        if a.shape[1] == 0 or self.acc.size == 0:
            return
        a = np.ascontiguousarray(a, dtype=self.acc.dtype)
        b = np.ascontiguousarray(b, dtype=self.acc.dtype)
        if self._gemm is None:
            self.acc += a @ b  # integers, complex, bool, or no OpenBLAS found
            return
        (m, k), n = a.shape, b.shape[1]
        self._gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, a.ctypes.data, k,
                   b.ctypes.data, n, 1.0, self.acc.ctypes.data, n)  # fmt: skip

    def result(self) -> NDArray[Any]:
        return self.acc

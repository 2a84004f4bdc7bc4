"""cuBLAS backend through CuPy: acc += a @ b as one gemm with beta=1 on the device.

Each panel is copied to the device once; the accumulator stays there for the whole K loop and
cuBLAS adds into it (``cupy.cublas.gemm(..., beta=1)``), so no temporary product and no extra
pass over the output per panel. CuPy is imported lazily: this module imports anywhere and says
what is missing when asked for an accumulator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels import exact
from kernels.constants import CUBLAS_INSTALL, GPU_DTYPES, MAX_DIM
from kernels.cuda import integer
from kernels.panels import band_rows, check_panels

INSTALL_HINT = f"the cublas backend needs CuPy with cuBLAS ({CUBLAS_INSTALL}) and a CUDA GPU"
DTYPES = tuple(np.dtype(d) for d in GPU_DTYPES)
PRECISIONS = ("fp32", "tf32")
"""cuBLAS's float32 gemm on FP32 units, or on tensor cores in TF32 (the handle's math mode);
it has no 3xTF32."""


class CublasUnavailableError(RuntimeError):
    """CuPy is not installed, has no cuBLAS, or sees no CUDA GPU. ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{INSTALL_HINT}; {reason}")
        self.reason = reason


def load_cupy() -> Any:
    """The cupy module (with cupy.cublas loaded) on a machine with a GPU, else the error."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken CUDA library at import
        raise CublasUnavailableError(f"importing CuPy failed ({type(e).__name__}: {e})") from e
    try:
        from cupy import cublas  # noqa: F401 - binds cupy.cublas, whose gemm add() calls
    except Exception as e:  # noqa: BLE001 - CuPy raises ImportError when it finds no libcublas
        raise CublasUnavailableError(
            f"CuPy imports but finds no cuBLAS ({type(e).__name__}: {e}); plain cupy-cuda13x "
            "ships none: add the [ctk] extra, or pip install nvidia-cublas"
        ) from e
    if _device_count(cupy) < 1:
        raise CublasUnavailableError("CuPy is installed but sees no CUDA GPU")
    return cupy


def _device_count(cupy: Any) -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no driver: CuPy raises its CUDARuntimeError
        return 0


def cublas_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    try:
        load_cupy()
    except CublasUnavailableError:
        return False
    return True


def check_dtype(dtype: np.dtype[Any] | type | str) -> np.dtype[Any]:
    """The dtype as numpy.dtype if it is float32 or float64, else TypeError."""
    dt = np.dtype(dtype)
    if dt not in DTYPES:
        raise TypeError(
            f"the cublas backend computes float32 and float64, got {dt}; cast the inputs with "
            "astype(numpy.float32) or astype(numpy.float64), or use the cpu backend"
        )
    return dt


TF32_TENSOR_OP_MATH = 3
"""cublasMath_t's CUBLAS_TF32_TENSOR_OP_MATH (cublas_api.h), where CuPy does not name it."""


@contextlib.contextmanager
def tf32_math(cupy: Any) -> Iterator[None]:
    """The current cuBLAS handle in CUBLAS_TF32_TENSOR_OP_MATH for one call, its mode restored
    after (the handle is shared by every user of CuPy in this thread). ``CUPY_TF32`` does not
    reach ``cupy.cublas.gemm``: the handle's math mode does."""
    from cupy_backends.cuda.libs import cublas as lib

    handle = cupy.cuda.device.get_cublas_handle()
    before = lib.getMathMode(handle)
    lib.setMathMode(handle, getattr(lib, "CUBLAS_TF32_TENSOR_OP_MATH", TF32_TENSOR_OP_MATH))
    try:
        yield
    finally:
        lib.setMathMode(handle, before)


class CublasAccumulator:
    """A zeroed device matrix that K panels are multiplied into with cuBLAS: acc += a @ b."""

    def __init__(
        self, shape: tuple[int, int], dtype: np.dtype[Any] | type | str, precision: str = "fp32"
    ) -> None:
        self.exact = exact.is_integer(dtype)
        """An integer (or bool) accumulator: exact float blocks (kernels.exact)."""
        self.dtype = np.dtype(dtype) if self.exact else check_dtype(dtype)
        tf32_ok = self.dtype == np.float32 or self.exact
        if precision not in PRECISIONS or (precision == "tf32" and not tf32_ok):
            raise ValueError(
                f"the cublas backend computes {self.dtype} at precision fp32"
                + (" or tf32" if tf32_ok else "")
                + f", not {precision!r}; use --backend cuda for 3xtf32, or --precision fp32"
            )
        self.precision = precision
        m, n = (int(s) for s in shape)
        if not (0 <= m <= MAX_DIM and 0 <= n <= MAX_DIM):
            raise ValueError(f"accumulator shape must be in [0, 2**31 - 1], got {shape}")
        self.shape = (m, n)
        self._cupy = load_cupy()
        # C order: cupy.cublas.gemm then computes C^T = B^T A^T in place, without a copy of C.
        self._c = self._cupy.zeros(self.shape, dtype=self.dtype)
        self._parts: dict[str, Any] = {}

    def add(self, a: NDArray[Any], b: NDArray[Any], rows: tuple[int, int] | None = None) -> None:
        """acc[rows] += a @ b, with a (r1 - r0, w) and b (w, n) host arrays of the accumulator's
        dtype."""
        c = self._band(rows)
        if self.exact:
            self._add_exact(c, a, b)
            return
        check_panels(c.shape, self.dtype, a, b)
        m, n = c.shape
        if m == 0 or n == 0 or a.shape[1] == 0:
            return  # nothing to add; cuBLAS rejects leading dimensions of 0
        cp = self._cupy
        # One host-to-device copy per panel; the accumulator never leaves the device.
        d_a = cp.asarray(np.ascontiguousarray(a))
        d_b = cp.asarray(np.ascontiguousarray(b))
        if self.precision == "fp32":  # the handle's default math: today's strict FP32
            cp.cublas.gemm("N", "N", d_a, d_b, out=c, alpha=1.0, beta=1.0)
            return
        with tf32_math(cp):
            cp.cublas.gemm("N", "N", d_a, d_b, out=c, alpha=1.0, beta=1.0)

    def _add_exact(self, c: Any, a: NDArray[Any], b: NDArray[Any]) -> None:
        """c += a @ b for an integer ``c``: one float gemm (beta=0) per exact K block into a
        float temp, added into ``c`` as integers (kernels.cuda.integer's scheme)."""
        a, b, blocks = integer.host_panels(a, b, self.dtype)
        check_panels(c.shape, a.dtype, a, b)
        (m, k), n = a.shape, c.shape[1]
        if m == 0 or n == 0 or k == 0:
            return
        cp = self._cupy
        if not blocks.dtype:  # past float64's exact products: numpy's integer product
            c += cp.asarray(a @ b)
            return
        if blocks.dtype not in self._parts or self._parts[blocks.dtype].shape[1] != n:
            self._parts[blocks.dtype] = cp.zeros((self.shape[0], n), dtype=blocks.dtype)
        part = self._parts[blocks.dtype][:m]
        tensor = integer.tensor_exact(blocks, self.precision)
        for k0 in range(0, k, blocks.step):
            d_a = cp.asarray(np.ascontiguousarray(a[:, k0 : k0 + blocks.step]))
            d_b = cp.asarray(np.ascontiguousarray(b[k0 : k0 + blocks.step]))
            with tf32_math(cp) if tensor else contextlib.nullcontext():
                cp.cublas.gemm("N", "N", d_a, d_b, out=part, alpha=1.0, beta=0.0)
            if self.dtype == np.bool_:
                c |= part != 0
            else:  # integer-valued: a 64-bit integer, then c's type, as numpy wraps
                c += part.astype(np.int64).astype(self.dtype)

    def result(self, rows: tuple[int, int] | None = None) -> NDArray[Any]:
        """The accumulated matrix (or its band of rows) as a C-contiguous host array."""
        return np.ascontiguousarray(self._cupy.asnumpy(self._band(rows)))

    def _band(self, rows: tuple[int, int] | None) -> Any:
        r0, r1 = band_rows(rows, self.shape[0])
        return self._c[r0:r1]  # whole rows of a C-ordered array: a contiguous view

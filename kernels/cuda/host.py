"""Host side of the CUDA backend: the variant registry and a device-resident accumulator.

numba is imported lazily so that importing this module works where numba-cuda does not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from numpy.typing import NDArray

from kernels import exact
from kernels.constants import MAX_DIM
from kernels.cuda import integer, tiled
from kernels.cuda.blocked import kernel as blocked
from kernels.cuda.blocked.spec import F32_SPEC, F64_SPEC, BlockedSpec
from kernels.cuda.jit import jit_kernel, launch_lock, simulated
from kernels.cuda.launch import LaunchConfig, tiled_launch
from kernels.cuda.tensor import kernel as tf32
from kernels.panels import band_rows, check_panels


@dataclass(frozen=True)
class KernelVariant:
    """One CUDA kernel the backend can run: `make_kernel()` returns the plain Python kernel."""

    name: str
    dtype: np.dtype
    """Element type of A, B and C."""
    make_kernel: Callable[[], Callable[..., None]]
    """Builds `kernel(a, b, c)` doing c += a @ b (not yet jitted: inspect compiles it to PTX)."""
    launch: Callable[[int, int], LaunchConfig]
    """Grid and block for an m x n output."""
    default: bool
    """True for the one variant the cuda backend uses for this dtype."""
    launch_bounds: tuple[int, int] | None = None
    """(max threads per block, min blocks per SM) for cuda.jit / compile_ptx; caps registers."""
    precision: str = "fp32"
    """What its products are computed in: "fp32"/"fp64" (the dtype's own), "tf32", "3xtf32"."""
    hmma_per_k_tile: int | None = None
    """Tensor-core variants: mma.sync per warp per K tile, as designed (the static gate's
    count); None for the FFMA/DFMA kernels."""

    @property
    def simulable(self) -> bool:
        """False for inline PTX (the tensor-core variants), which numba's simulator cannot run."""
        return self.hmma_per_k_tile is None


def _tiled_variant(dtype: type, default: bool) -> KernelVariant:
    dt = np.dtype(dtype)
    return KernelVariant(
        name=f"tiled_{dt.name}",
        dtype=dt,
        # Read TILE at call time so tests can lower it for the simulator.
        make_kernel=lambda: tiled.make_tiled_kernel(dt),
        launch=lambda m, n: tiled_launch(m, n, tiled.TILE),
        default=default,
        precision=native_precision(dt),
    )


def _blocked_variant(spec: BlockedSpec, default: bool) -> KernelVariant:
    return KernelVariant(
        name=f"blocked_{spec.dtype}",
        dtype=np.dtype(spec.dtype),
        make_kernel=lambda: blocked.make_blocked_kernel(spec),
        launch=lambda m, n: blocked.launch_for(spec, m, n),
        default=default,
        launch_bounds=spec.launch_bounds,
        precision=native_precision(np.dtype(spec.dtype)),
    )


def _mma_variant(spec: tf32.MmaSpec) -> KernelVariant:
    return KernelVariant(
        name=f"mma_{spec.precision}",
        dtype=np.dtype(np.float32),
        make_kernel=lambda: tf32.make_mma_kernel(spec),
        launch=lambda m, n: tf32.launch_for(spec, m, n),
        default=False,
        launch_bounds=spec.launch_bounds,
        precision=spec.precision,
        hmma_per_k_tile=spec.mma_per_k_tile,
    )


def native_precision(dtype: np.dtype) -> str:
    """The precision a dtype's FMA kernels compute in: "fp32" or "fp64"."""
    return "fp64" if dtype == np.float64 else "fp32"


VARIANTS: dict[str, KernelVariant] = {
    v.name: v
    for v in (
        _tiled_variant(np.float32, default=False),
        _tiled_variant(np.float64, default=False),
        _blocked_variant(F32_SPEC, default=True),
        _blocked_variant(F64_SPEC, default=True),
        *(_mma_variant(spec) for spec in tf32.SPECS.values()),
    )
}


def default_variant(dtype: np.dtype | type) -> KernelVariant:
    """The variant flagged default for this dtype (TypeError for non-float dtypes)."""
    dt = tiled.check_float_dtype(dtype)
    (variant,) = (v for v in VARIANTS.values() if v.dtype == dt and v.default)
    return variant


def cuda_available() -> bool:
    """True when numba.cuda can run kernels: a visible GPU, or the simulator."""
    try:
        from numba import cuda
    except Exception:  # numba missing or its CUDA bindings broken: report, don't raise
        return False
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


def exit_skipping_teardown(code: int) -> NoReturn:
    """Flush and end the process without the interpreter's teardown. With numba-cuda 0.30 and
    CuPy 14 loaded (an H200, NumPy 2.5), a process was seen to finish its work and then hang at
    exit; a parent waiting on it (the doctor, a timed session step) would wait to its timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def select_variant(name: str | None, dtype: np.dtype, precision: str = "fp32") -> KernelVariant:
    """The named variant (checked against ``dtype``), or the one for ``dtype`` at ``precision``:
    the default at fp32 (fp64 for float64 is the same), else the tensor-core variant."""
    if name is None and precision in ("fp32", native_precision(np.dtype(dtype))):
        return default_variant(dtype)
    if name is None:
        found = [v for v in VARIANTS.values() if v.precision == precision and v.dtype == dtype]
        if not found:
            raise TypeError(
                f"precision {precision!r} needs float32 data, got {np.dtype(dtype)}; "
                "use --precision fp32, or --dtype float32"
            )
        return found[0]
    if name not in VARIANTS:
        raise ValueError(f"unknown CUDA kernel variant {name!r}; choose from {sorted(VARIANTS)}")
    variant = VARIANTS[name]
    if variant.dtype != dtype:
        raise TypeError(
            f"variant {name!r} computes {variant.dtype}, accumulator is {dtype}; "
            "pick a variant of the same dtype or variant=None"
        )
    return variant


def launch_float(dtype: str, precision: str, a: Any, b: Any, c: Any, stream: Any = 0) -> None:
    """``c += a @ b`` with the default kernel of a float ``dtype`` at ``precision`` (what the
    exact integer blocks run, kernels.cuda.integer)."""
    launch_product(select_variant(None, np.dtype(dtype), precision), a, b, c, stream)


def launch_product(variant: KernelVariant, a: Any, b: Any, c: Any, stream: Any = 0) -> None:
    """``c += a @ b`` on device arrays, queued on ``stream``; nothing for an empty product (a
    launch with an empty grid is an error)."""
    if simulated() and not variant.simulable:
        raise RuntimeError(
            f"kernel {variant.name} ({variant.precision}) runs inline PTX, which numba's CUDA "
            "simulator cannot run; use precision fp32 there, or run on a GPU"
        )
    if c.shape[0] == 0 or c.shape[1] == 0 or a.shape[1] == 0:
        return
    kernel = jit_kernel(variant.make_kernel(), variant.launch_bounds)
    cfg = variant.launch(*c.shape)
    with launch_lock():
        kernel[cfg.grid, cfg.block, stream](a, b, c)


class CudaAccumulator:
    """A zeroed device matrix that K panels are multiplied into: acc += a @ b on the GPU.

    An integer (or bool) accumulator takes integer panels, or floats that hold integers (the
    worker reads them so, kernels.exact), and sums them exactly (kernels.cuda.integer).
    """

    def __init__(
        self,
        shape: tuple[int, int],
        dtype: np.dtype,
        variant: str | None = None,
        precision: str = "fp32",
    ) -> None:
        from numba import cuda

        self.exact = exact.is_integer(dtype)
        """An integer (or bool) accumulator: exact float blocks (kernels.cuda.integer)."""
        self.dtype = np.dtype(dtype) if self.exact else tiled.check_float_dtype(dtype)
        m, n = (int(s) for s in shape)
        if not (0 <= m <= MAX_DIM and 0 <= n <= MAX_DIM):
            raise ValueError(f"accumulator shape must be in [0, 2**31 - 1], got {shape}")
        self.shape = (m, n)
        self.precision = precision
        if not self.exact:
            self.variant = select_variant(variant, self.dtype, precision)
        elif variant is not None:
            raise ValueError(f"an {self.dtype} accumulator picks its float kernels: variant=None")
        self._scratch = integer.Scratch()
        self._c = cuda.to_device(np.zeros(self.shape, dtype=self.dtype))

    def add(self, a: NDArray[Any], b: NDArray[Any], rows: tuple[int, int] | None = None) -> None:
        """acc[rows] += a @ b, with a (r1 - r0, w) and b (w, n) host arrays of the accumulator's
        dtype (integer accumulators: see the class); each element is summed in K order whatever
        the band, so bands give the same bytes."""
        c = self._band(rows)
        if self.exact:
            a, b, blocks = integer.host_panels(a, b, self.dtype)
            check_panels(c.shape, a.dtype, a, b)
        else:
            check_panels(c.shape, self.dtype, a, b)
        if c.shape[0] == 0 or c.shape[1] == 0 or a.shape[1] == 0:
            return  # nothing to add
        from numba import cuda

        if self.exact and not blocks.dtype:  # past float64's exact products
            integer.add_host_product(c, a @ b)
            return
        # One host-to-device copy per panel; the accumulator never leaves the device.
        d_a = cuda.to_device(np.ascontiguousarray(a))
        d_b = cuda.to_device(np.ascontiguousarray(b))
        if self.exact:
            integer.exact_gemm(c, d_a, d_b, blocks, self._scratch, launch_float, 0, self.precision)
        else:
            launch_product(self.variant, d_a, d_b, c)

    def result(self, rows: tuple[int, int] | None = None) -> NDArray[Any]:
        """The accumulated matrix (or its band of rows) as a C-contiguous host array."""
        return np.ascontiguousarray(self._band(rows).copy_to_host())

    def _band(self, rows: tuple[int, int] | None) -> Any:
        r0, r1 = band_rows(rows, self.shape[0])
        return self._c[r0:r1]  # whole rows of a C-ordered array: a contiguous view

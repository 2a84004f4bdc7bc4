"""Measured rates of a device (any implementation of kernels.device.interface)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from kernels.device.gpu import numba_device
from kernels.device.interface import Device, Stream


@dataclass(frozen=True)
class Calibration:
    flops_per_second: float
    h2d_bytes_per_second: float
    d2h_bytes_per_second: float


def calibrate(
    device: Device,
    n: int = 4096,
    copy_bytes: int = 256 << 20,
    repeats: int = 3,
    dtype: DTypeLike = np.float32,
) -> Calibration:
    """Measured gemm flop/s of ``dtype`` (an n x n x n product) and copy bytes/s each way,
    best of ``repeats`` after one warm-up (which compiles the kernel on a real GPU)."""
    stream = device.stream()
    host = device.allocator(copy_bytes).reshape(1, copy_bytes)
    dev = device.empty((1, copy_bytes), np.uint8)
    a, b, acc = (device.zeros((n, n), dtype, stream) for _ in range(3))
    gemm = _best(lambda: device.gemm(acc, a, b, stream), stream, repeats)
    h2d = _best(lambda: device.copy_to_device(host, dev, stream), stream, repeats)
    d2h = _best(lambda: device.copy_to_host(dev, host, stream), stream, repeats)
    return Calibration(2 * n**3 / gemm, copy_bytes / h2d, copy_bytes / d2h)


def _best(queue: Callable[[], None], stream: Stream, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        queue()
        stream.synchronize()
        times.append(time.perf_counter() - start)
    return min(times[1:])


@functools.cache
def worker_device_figures() -> dict[str, Any] | None:
    """Runs on a worker: its GPU's name, free memory and measured rates (our kernel, pinned
    copies), cached per process; None without a real GPU (the simulator's rates mean nothing)."""
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return None
    try:
        from numba import cuda

        if not cuda.is_available():
            return None
        free, _ = cuda.current_context().get_memory_info()
        name = cuda.get_current_device().name
    except Exception:  # noqa: BLE001 - no driver or device: nothing to measure
        return None
    device = numba_device()
    f32 = calibrate(device, n=2048, copy_bytes=64 << 20, repeats=2)
    f64 = calibrate(device, n=2048, copy_bytes=64 << 20, repeats=2, dtype=np.float64)
    return {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "memory_bytes": int(free),
        "float32_flops": f32.flops_per_second,
        "float64_flops": f64.flops_per_second,
        "h2d_bytes_per_second": f32.h2d_bytes_per_second,
    }

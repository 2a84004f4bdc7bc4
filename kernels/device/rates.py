"""Measured rates of a device (any implementation of kernels.device.interface)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from kernels.constants import GPU_DTYPES
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


def device_key(name: str, cc: tuple[int, int], total_bytes: int) -> dict[str, Any]:
    """What a GPU's figures depend on (kernels.device.figures): a change in any is stale."""
    from importlib import metadata

    from kernels.cuda.toolkit import driver_version, nvvm_version
    from kernels.device.figures import kernel_source_hash

    return {
        "gpu": name,
        "cc": f"{cc[0]}.{cc[1]}",
        "memory_bytes": int(total_bytes),
        "driver_cuda": ".".join(map(str, driver_version() or (0, 0))),
        "nvvm": ".".join(map(str, nvvm_version() or (0, 0))),
        "numba_cuda": metadata.version("numba-cuda"),
        "kernels": kernel_source_hash(),
    }


def figures_for(
    key: dict[str, Any], dtype: str, measure: Callable[[str], Calibration]
) -> tuple[dict[str, Any], str]:
    """(figures, where from) for ``dtype``: the saved record of ``key`` when it has this dtype's
    rate ("doctor DATE"), else ``measure(dtype)`` once, saved for the next process."""
    from kernels.device.figures import lookup, save

    record = lookup(key)
    if record and f"{dtype}_flops" in record["figures"]:
        return record["figures"], f"saved {record['date']}"
    cal = measure(dtype)
    figures = {
        f"{dtype}_flops": cal.flops_per_second,
        "h2d_bytes_per_second": cal.h2d_bytes_per_second,
    }
    with contextlib.suppress(OSError):  # a read-only home: measured again next time
        save(key, figures)
    merged = {**(record or {}).get("figures", {}), **figures}
    return merged, "calibrated"


@functools.cache
def worker_device_figures(dtype: str = "float32") -> dict[str, Any] | None:
    """Runs on a worker, off its event loop (pipeline.facts.devices): its GPU's name, free memory
    and rates for ``dtype`` -- saved figures of this GPU, driver and kernels when there are,
    else measured once (our kernel, pinned copies) and saved; cached per process and dtype.
    None without a real GPU (the simulator's rates mean nothing)."""
    import os

    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or dtype not in GPU_DTYPES:
        return None  # the simulator's rates mean nothing; our kernels are float kernels
    try:
        from numba import cuda

        if not cuda.is_available():
            return None
        free, total = cuda.current_context().get_memory_info()
        gpu = cuda.get_current_device()
        name = gpu.name.decode() if isinstance(gpu.name, bytes) else str(gpu.name)
        cc = gpu.compute_capability
    except Exception:  # noqa: BLE001 - no driver or device: nothing to measure
        return None

    def measure(dt: str) -> Calibration:
        return calibrate(numba_device(), n=2048, copy_bytes=64 << 20, repeats=2, dtype=dt)

    figures, source = figures_for(device_key(name, cc, total), dtype, measure)
    return {"name": name, "memory_bytes": int(free), "source": source, **figures}

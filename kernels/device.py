"""The small device interface the staged engine drives, and its Numba CUDA implementation.

It is CUDA's own model, cut to what a K loop needs: streams run their operations in order,
events recorded on one stream order work on another, copies and kernels are asynchronous to
the host. ``kernels.emulated`` implements the same interface with modelled time instead of
math; ``calibrate`` measures the rates of any implementation. Device arrays support
``dev[r0:r1]`` (a band of whole rows, still contiguous). numba is imported lazily.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import DTypeLike, NDArray

from kernels.buffers import Allocator, pinned_allocator
from kernels.device_decode import CompressedPanel, decode_on_device
from kernels.launch import band_rows, check_panels

DeviceArray = Any
"""A device buffer of the implementation (numba DeviceNDArray, emulated placeholder)."""


class Stream(Protocol):
    def synchronize(self) -> None:
        """Block the host until everything queued on the stream so far has finished."""


class Event(Protocol):
    def record(self, stream: Any) -> None:
        """Mark the point of ``stream`` reached by the work queued on it so far."""

    def wait(self, stream: Any) -> None:
        """Work queued on ``stream`` from now on starts only after the recorded point."""

    def synchronize(self) -> None:
        """Block the host until the recorded point is reached."""


class Device(Protocol):
    """What the staged engine needs from a GPU (real, simulated or emulated)."""

    name: str
    allocator: Allocator
    """Host memory that copies from and to are asynchronous with (pinned on a GPU)."""

    def stream(self) -> Stream: ...
    def event(self) -> Event: ...
    def empty(self, shape: tuple[int, int], dtype: DTypeLike) -> DeviceArray: ...
    def zeros(self, shape: tuple[int, int], dtype: DTypeLike) -> DeviceArray: ...
    def copy_to_device(self, host: NDArray[Any], dev: DeviceArray, stream: Stream) -> None:
        """Queue host -> device; ``host`` must stay untouched until the copy has finished."""

    def copy_to_host(self, dev: DeviceArray, host: NDArray[Any], stream: Stream) -> None:
        """Queue device -> host; ``host`` is valid once the stream (or an event) says so."""

    def gemm(
        self,
        acc: DeviceArray,
        a: DeviceArray,
        b: DeviceArray,
        stream: Stream,
        rows: tuple[int, int] | None = None,
    ) -> None:
        """Queue ``acc += a @ b``; with ``rows=(r0, r1)`` only ``acc[r0:r1]``, ``a`` holding
        just those rows."""

    def decode_into(
        self, staged: NDArray[np.uint8], panel: CompressedPanel, dev: DeviceArray, stream: Stream
    ) -> object:
        """Queue: copy ``panel``'s compressed chunks (the start of ``staged``) to the device,
        decode them there and place them into ``dev`` (kernels.device_decode). Returns what
        the queued work reads: hold it until the stream has passed this point."""


class NumbaDevice:
    """The current CUDA device through numba-cuda (or the simulator), with the cuda backend's
    default kernel variant, so results are bitwise those of ``CudaAccumulator``.

    Safe to share among threads: each engine uses its own streams; the simulator, which keeps
    its kernel state in a module global, gets the accumulator's lock around launches.
    """

    name = "cuda"

    def __init__(self, variant: str | None = None) -> None:
        self.variant_name = variant
        self.record_kernels = False
        """Time every kernel with a pair of CUDA events (make bench-gpu)."""
        self.kernel_events: list[tuple[Any, Any]] = []
        self.allocator: Allocator = pinned_allocator

    def stream(self) -> Stream:
        from numba import cuda

        stream: Stream = cuda.stream()
        return stream

    def event(self) -> Event:
        from numba import cuda

        from kernels.cuda_host import simulated

        # Timing off makes synchronizing cheaper; the simulator's event takes no arguments.
        make: Any = cuda.event
        event: Event = make() if simulated() else make(timing=False)
        return event

    def empty(self, shape: tuple[int, int], dtype: DTypeLike) -> DeviceArray:
        from numba import cuda

        return cuda.device_array(shape, dtype=np.dtype(dtype))

    def zeros(self, shape: tuple[int, int], dtype: DTypeLike) -> DeviceArray:
        from numba import cuda

        return cuda.to_device(np.zeros(shape, dtype=np.dtype(dtype)))

    def copy_to_device(self, host: NDArray[Any], dev: DeviceArray, stream: Stream) -> None:
        if host.size:
            dev.copy_to_device(host, stream=stream)

    def copy_to_host(self, dev: DeviceArray, host: NDArray[Any], stream: Stream) -> None:
        if host.size:
            dev.copy_to_host(host, stream=stream)

    def gemm(
        self,
        acc: DeviceArray,
        a: DeviceArray,
        b: DeviceArray,
        stream: Stream,
        rows: tuple[int, int] | None = None,
    ) -> None:
        from kernels.cuda_host import launch_product, select_variant

        r0, r1 = band_rows(rows, acc.shape[0])
        c = acc[r0:r1]
        variant = select_variant(self.variant_name, np.dtype(acc.dtype))
        check_panels(c.shape, variant.dtype, a, b)
        if not self.record_kernels:
            launch_product(variant, a, b, c, stream)
            return
        from numba import cuda

        from kernels.cuda_host import simulated

        timed: dict[str, bool] = {} if simulated() else {"timing": True}  # the simulator's
        start, end = cuda.event(**timed), cuda.event(**timed)  # event takes no arguments
        start.record(stream)
        launch_product(variant, a, b, c, stream)
        end.record(stream)
        self.kernel_events.append((start, end))

    def decode_into(
        self, staged: NDArray[np.uint8], panel: CompressedPanel, dev: DeviceArray, stream: Stream
    ) -> object:
        return decode_on_device(staged, panel, dev, stream)

    def kernel_seconds(self) -> float:
        """Device time of the kernels launched while ``record_kernels`` was on (CUDA events;
        call after the work has finished)."""
        return sum(max(s.elapsed_time(e), 0.0) for s, e in self.kernel_events) / 1000


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
    a, b, acc = (device.zeros((n, n), dtype) for _ in range(3))
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
def numba_device() -> NumbaDevice:
    """This process's CUDA device, shared by its task threads."""
    return NumbaDevice()


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

"""The real device: the current CUDA GPU through numba-cuda (or its simulator), with the cuda
backend's kernel variant for each gemm's dtype and precision. numba is imported lazily."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

from kernels import exact
from kernels.device.decode import PanelDecoder
from kernels.device.interface import DeviceArray, Event, Stream
from kernels.memory.allocators import Allocator, pinned_allocator
from kernels.panels import band_rows, check_panels


class NumbaDevice:
    """The current CUDA device through numba-cuda (or the simulator), with the cuda backend's
    kernel variant for the dtype and precision, so results are bitwise those of
    ``CudaAccumulator``; an integer (or bool) accumulator's product is exact, as there.

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

        from kernels.cuda.host import simulated

        # Timing off makes synchronizing cheaper; the simulator's event takes no arguments.
        make: Any = cuda.event
        event: Event = make() if simulated() else make(timing=False)
        return event

    def empty(self, shape: tuple[int, int], dtype: DTypeLike) -> DeviceArray:
        from numba import cuda

        return cuda.device_array(shape, dtype=np.dtype(dtype))

    def zeros(self, shape: tuple[int, int], dtype: DTypeLike, stream: Stream) -> DeviceArray:
        from numba import cuda
        from numba.cuda.cudadrv import driver

        dev = cuda.device_array(shape, dtype=np.dtype(dtype))
        if dev.nbytes:  # zeroed by the device, queued on ``stream``: no host array, no copy
            driver.device_memset(dev, 0, dev.nbytes, stream)
        return dev

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
        precision: str = "fp32",
        peaks: tuple[int, int] | None = None,
    ) -> None:
        r0, r1 = band_rows(rows, acc.shape[0])
        launch = self._launcher(acc[r0:r1], a, b, stream, precision, peaks)
        if not self.record_kernels:
            launch()
            return
        from numba import cuda

        from kernels.cuda.host import simulated

        timed: dict[str, bool] = {} if simulated() else {"timing": True}  # the simulator's
        start, end = cuda.event(**timed), cuda.event(**timed)  # event takes no arguments
        start.record(stream)
        launch()
        end.record(stream)
        self.kernel_events.append((start, end))

    def _launcher(
        self, c: Any, a: Any, b: Any, stream: Stream, precision: str, peaks: tuple[int, int] | None
    ) -> Callable[[], None]:
        """What queues ``c += a @ b``: our kernel for the dtype and precision, or for an integer
        ``c`` the exact float blocks (kernels.cuda.integer) over the panels' ``peaks``."""
        from kernels.cuda import integer
        from kernels.cuda.host import launch_float, launch_product, select_variant

        if not exact.is_integer(c.dtype):
            variant = select_variant(self.variant_name, np.dtype(c.dtype), precision)
            check_panels(c.shape, variant.dtype, a, b)
            return functools.partial(launch_product, variant, a, b, c, stream)
        if peaks is None:
            raise ValueError(f"an {c.dtype} accumulator needs its panels' peaks (max |values|)")
        check_panels(c.shape, np.dtype(a.dtype), a, b)
        blocks = integer.exact_blocks(a.dtype, *peaks, a.shape[1])
        scratch = integer.stream_scratch(stream)
        return functools.partial(
            integer.exact_gemm, c, a, b, blocks, scratch, launch_float, stream, precision
        )

    def decoder(self, stream: Stream) -> PanelDecoder:
        return PanelDecoder(stream)

    def kernel_seconds(self) -> float:
        """Device time of the kernels launched while ``record_kernels`` was on (CUDA events;
        call after the work has finished)."""
        return sum(max(s.elapsed_time(e), 0.0) for s, e in self.kernel_events) / 1000


@functools.cache
def numba_device() -> NumbaDevice:
    """This process's CUDA device, shared by its task threads."""
    return NumbaDevice()


def start_kernel_timing() -> None:
    """Runs on a worker (``client.run``): time every kernel of this process's device from now
    on; the jobs run there, not in the client."""
    device = numba_device()
    device.kernel_events, device.record_kernels = [], True


def kernel_seconds_so_far() -> float:
    """Runs on a worker: device seconds of the kernels timed since ``start_kernel_timing``."""
    return numba_device().kernel_seconds()

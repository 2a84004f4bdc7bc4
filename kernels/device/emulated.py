"""An emulated GPU: the device interface (kernels.device.interface), modelled time, no math.

It answers "how well does the host feed a GPU?" on a machine without one. Like a GPU with
separate copy engines, it has three hardware units, each a thread: one compute engine and one
copy engine per direction. An operation queued on a stream starts when the stream's previous
operation and every event the stream waits on are done and its engine is free; it then
occupies the engine for its modelled time (kernel: 2*m*n*k / flop/s; copy: bytes / byte/s;
no launch latency) while the engine thread sleeps, so the GIL is free for the host threads
being measured. Every operation goes on ``timeline`` with its modelled start and end (the
sleep's overshoot never accumulates into the device's schedule).

No data moves: device buffers are placeholders carrying shape and dtype, and ``copy_to_host``
fills the host buffer with NaN (zeros for integers), so nothing it returns can pass for a
product (a reused host buffer would otherwise hand back plausible stale numbers).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

from kernels.constants import device_decode_rate
from kernels.device.decode import CompressedPanel
from kernels.device.interface import Stream
from kernels.memory.allocators import Allocator, lazy_host_allocator
from kernels.panels import band_rows, check_panels

ENGINES = ("compute", "h2d", "d2h")
DECODE_GBPS = 50.0
"""Peak decoded GB/s of device-side zstd decoding (--gpu-decode) unless given, reached only
with enough frames a panel (kernels.constants.device_decode_rate): an assumption, not a
measured nvCOMP figure (the planner's DEVICE_DECODE_BYTES_PER_SECOND)."""


class DeviceMemoryError(MemoryError):
    """An allocation beyond the emulated device's memory."""


@dataclass(frozen=True)
class TimelineEntry:
    engine: str
    """"compute", "h2d" or "d2h"."""
    name: str
    start: float
    """time.perf_counter() seconds."""
    end: float
    amount: int
    """Flops for a kernel, bytes for a copy."""


class _Op:
    __slots__ = ("amount", "deps", "done", "end", "engine", "name", "seconds", "submitted")

    def __init__(
        self, engine: str, name: str, seconds: float, amount: int, deps: list[_Op]
    ) -> None:
        self.engine, self.name, self.seconds, self.amount = engine, name, seconds, amount
        self.deps, self.done = deps, False
        self.submitted, self.end = time.perf_counter(), 0.0


class EmulatedStream:
    def __init__(self, device: EmulatedDevice) -> None:
        self._device = device
        self.frontier: list[_Op] = []
        """What the next operation queued here must wait for (the last one, waited events)."""

    def synchronize(self) -> None:
        self._device._wait(self.frontier)


class EmulatedEvent:
    def __init__(self, device: EmulatedDevice) -> None:
        self._device = device
        self._ops: list[_Op] = []

    def record(self, stream: EmulatedStream) -> None:
        with self._device._cond:
            self._ops = list(stream.frontier)

    def wait(self, stream: EmulatedStream) -> None:
        with self._device._cond:
            stream.frontier = stream.frontier + self._ops

    def synchronize(self) -> None:
        self._device._wait(self._ops)


class DeviceBuffer:
    """A placeholder for device memory: shape and dtype only. ``buf[r0:r1]`` is a band view."""

    def __init__(self, shape: tuple[int, ...], dtype: DTypeLike, base: Any = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.ndim = len(self.shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._base = base  # a band keeps its allocation alive

    def __getitem__(self, rows: slice) -> DeviceBuffer:
        r0, r1, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("device buffers slice whole contiguous bands of rows only")
        base = self if self._base is None else self._base
        return DeviceBuffer((max(r1 - r0, 0), *self.shape[1:]), self.dtype, base)


class EmulatedDevice:
    """A modelled GPU. ``tflops`` applies to float32; float64 kernels run at ``fp64_tflops``
    (default half of it, as on an H100). ``d2h_gbps`` defaults to ``h2d_gbps``; ``decode_gbps``
    is the rate of decoding compressed chunks on the device. Use it as a
    context manager, or call ``close()``, to stop its engine threads."""

    name = "emulated"

    def __init__(
        self,
        tflops: float,
        h2d_gbps: float,
        d2h_gbps: float | None = None,
        memory_bytes: int | None = None,
        *,
        fp64_tflops: float | None = None,
        decode_gbps: float = DECODE_GBPS,
    ) -> None:
        rates = (tflops, h2d_gbps, d2h_gbps or h2d_gbps, fp64_tflops or tflops, decode_gbps)
        if min(rates) <= 0:
            raise ValueError("flop, copy and decode rates must be positive")
        self.decode_bytes_per_second = decode_gbps * 1e9
        self.flops = {"float32": tflops * 1e12, "float64": (fp64_tflops or tflops / 2) * 1e12}
        self.bytes_per_second = {"h2d": h2d_gbps * 1e9, "d2h": (d2h_gbps or h2d_gbps) * 1e9}
        self.memory_bytes = memory_bytes
        self.allocator: Allocator = lazy_host_allocator  # no pinning to model: any host memory
        self.timeline: list[TimelineEntry] = []
        self.memory_in_use = self.peak_memory = 0
        self._cond = threading.Condition()
        self._queues: dict[str, list[_Op]] = {engine: [] for engine in ENGINES}
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, args=(e,), name=f"emulated-{e}", daemon=True)
            for e in ENGINES
        ]
        for thread in self._threads:
            thread.start()

    # --- the device interface -----------------------------------------------------------------

    def stream(self) -> EmulatedStream:
        return EmulatedStream(self)

    def event(self) -> EmulatedEvent:
        return EmulatedEvent(self)

    def empty(self, shape: tuple[int, int], dtype: DTypeLike) -> DeviceBuffer:
        buffer = DeviceBuffer(shape, dtype)
        with self._cond:
            limit = self.memory_bytes
            if limit is not None and self.memory_in_use + buffer.nbytes > limit:
                raise DeviceMemoryError(
                    f"emulated device: {buffer.nbytes} more bytes with {self.memory_in_use} of "
                    f"{self.memory_bytes} in use; use smaller tiles or panels, or more memory"
                )
            self.memory_in_use += buffer.nbytes
            self.peak_memory = max(self.peak_memory, self.memory_in_use)
        weakref.finalize(buffer, self._free, buffer.nbytes)
        return buffer

    def zeros(
        self, shape: tuple[int, int], dtype: DTypeLike, stream: Stream | None = None
    ) -> DeviceBuffer:
        return self.empty(shape, dtype)  # a memset's time is negligible next to the copies

    def copy_to_device(self, host: NDArray[Any], dev: DeviceBuffer, stream: Stream) -> None:
        _check_same(host, dev)
        self._submit(stream, "h2d", "copy_to_device", host.nbytes)

    def copy_to_host(self, dev: DeviceBuffer, host: NDArray[Any], stream: Stream) -> None:
        _check_same(host, dev)
        host.fill(np.nan if host.dtype.kind in "fc" else 0)
        self._submit(stream, "d2h", "copy_to_host", host.nbytes)

    def gemm(
        self,
        acc: DeviceBuffer,
        a: DeviceBuffer,
        b: DeviceBuffer,
        stream: Stream,
        rows: tuple[int, int] | None = None,
        precision: str = "fp32",
        peaks: tuple[int, int] | None = None,
    ) -> None:
        # Modelled at the fp32 rate: the emulated backend lists fp32 only (check_precision),
        # and float dtypes only (no exact integer products: ``peaks`` stays None).
        r0, r1 = band_rows(rows, acc.shape[0])
        check_panels((r1 - r0, acc.shape[1]), acc.dtype, a, b)  # type: ignore[arg-type]
        flops = 2 * (r1 - r0) * acc.shape[1] * a.shape[1]
        self._submit(stream, "compute", "gemm", flops, self.flops[acc.dtype.name])

    def decoder(self, stream: Stream) -> EmulatedDecoder:
        return EmulatedDecoder(self, stream)

    # --- measuring ----------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait until every queued operation has finished."""
        with self._cond:  # an operation leaves its queue when it is done
            self._cond.wait_for(lambda: not any(self._queues.values()))

    def busy_seconds(self, engine: str, window: tuple[float, float] | None = None) -> float:
        """Seconds ``engine`` was occupied, within ``window`` (perf_counter start, end) if given."""
        lo, hi = window or (float("-inf"), float("inf"))
        with self._cond:
            entries = [e for e in self.timeline if e.engine == engine]
        return sum(max(0.0, min(e.end, hi) - max(e.start, lo)) for e in entries)

    def busy_fraction(self, engine: str, window: tuple[float, float]) -> float:
        return self.busy_seconds(engine, window) / max(window[1] - window[0], 1e-12)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> EmulatedDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the engines --------------------------------------------------------------------------

    def _submit(
        self, stream: Stream, engine: str, name: str, amount: int, rate: float = 0.0
    ) -> None:
        if not isinstance(stream, EmulatedStream) or stream._device is not self:
            raise TypeError(f"{stream!r} is not a stream of this emulated device")
        seconds = amount / (rate or self.bytes_per_second[engine])
        with self._cond:
            if self._closed:
                raise RuntimeError("the emulated device is closed")
            op = _Op(engine, name, seconds, amount, stream.frontier)
            stream.frontier = [op]
            self._queues[engine].append(op)
            self._cond.notify_all()

    def _run(self, engine: str) -> None:
        """One hardware unit: the first queued operation whose dependencies are done, in turn."""
        free_at = 0.0
        while (op := self._next(engine)) is not None:
            # Modelled times: a late wake-up of this thread delays when the host sees the
            # operation done, never the device's own schedule.
            start = max(op.submitted, free_at, *(dep.end for dep in op.deps))
            free_at = start + op.seconds
            delay = free_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # releases the GIL: host threads run meanwhile
            with self._cond:
                self._queues[engine].remove(op)
                op.done, op.end, op.deps = True, free_at, []  # drop the chain of finished ops
                self.timeline.append(TimelineEntry(engine, op.name, start, free_at, op.amount))
                self._cond.notify_all()

    def _next(self, engine: str) -> _Op | None:
        """Wait for an operation of ``engine`` to become ready; None once closed."""
        with self._cond:
            while not self._closed:
                op = self._ready(engine)
                if op is not None:
                    return op
                self._cond.wait()
        return None

    def _ready(self, engine: str) -> _Op | None:
        return next((op for op in self._queues[engine] if all(d.done for d in op.deps)), None)

    def _wait(self, ops: Iterable[_Op]) -> None:
        pending = list(ops)
        with self._cond:
            self._cond.wait_for(lambda: all(op.done for op in pending))

    def _free(self, nbytes: int) -> None:
        with self._cond:
            self.memory_in_use -= nbytes


class EmulatedDecoder:
    """The compressed bytes over the copy engine, then decoding on the compute engine (as
    nvCOMP's kernels share the GPU with the gemms) at ``decode_gbps`` of decoded bytes, or
    less with few frames in the panel (kernels.constants.device_decode_rate)."""

    def __init__(self, device: EmulatedDevice, stream: Stream) -> None:
        self.device, self.stream = device, stream

    def decode_into(self, staged: NDArray[Any], panel: CompressedPanel, dev: DeviceBuffer) -> None:
        if panel.nbytes > staged.nbytes:
            raise ValueError(f"{panel.nbytes} compressed bytes staged in {staged.nbytes}")
        itemsize = np.dtype(panel.dtype).itemsize
        decoded = sum(p.shape[0] * p.shape[1] * itemsize for p in panel.pieces)
        device, stream = self.device, self.stream
        rate = device_decode_rate(device.decode_bytes_per_second, len(panel.pieces))
        device._submit(stream, "h2d", "copy_compressed", panel.nbytes)
        device._submit(stream, "compute", "decode", decoded, rate)


def _check_same(host: NDArray[Any], dev: DeviceBuffer) -> None:
    if tuple(host.shape) != dev.shape or host.dtype != dev.dtype:
        raise ValueError(
            f"copy between host {host.shape} {host.dtype} and device {dev.shape} {dev.dtype}"
        )

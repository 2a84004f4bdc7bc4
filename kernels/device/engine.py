"""The staged engine: one tile's K loop fed to a device without stalls.

Per panel k, in flight at once: decode threads fill pooled host buffers for panels
k+1..k+depth, the copy stream moves panel k+1 to the device, the compute stream multiplies
panel k into the accumulator, which stays on the device. Events order the streams as CUDA
does: a gemm waits for its panel's copies; a copy into a device slot waits for the gemm that
last read that slot; a host buffer goes back to the pool only once its copy has finished. The
last panel can go band by band, each finished band copied back while the next one computes.

No deadlock with many engines on one pool: a panel's A and B buffers are leased together, and
an engine waits for buffers only while it holds none (nothing staged, every finished copy's
buffer given back); otherwise it first multiplies what it has staged.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import DTypeLike, NDArray

from kernels import exact
from kernels.device.decode import CompressedPanel
from kernels.device.interface import Decoder, Device, Event, Stream
from kernels.memory.buffers import ArraySpec, BufferPool, Lease

Fill = Callable[[NDArray[Any]], int | None | CompressedPanel]
"""Writes a decoded panel into the given host array; returns the bytes it decoded (None: the
array's size; 0 when the data came from a cache) -- or stages the panel's compressed chunks in
the array's bytes and says so (CompressedPanel), for the device to decode."""
Finished = Callable[[tuple[int, int], NDArray[Any]], None]
"""Called with (band, host array) once a band of the result is final. The array is reused after
the call returns: write it (or copy it) before returning."""
DEVICE_SLOTS = 2  # panels on the device: one being copied in while the other is multiplied


class Panel(NamedTuple):
    width: int
    fill_a: Fill
    """Fills the (tile rows, width) A panel."""
    fill_b: Fill
    """Fills the (width, tile cols) B panel."""


@dataclass
class StagedStats:
    panels: int = 0
    seconds: float = 0.0
    decode_wait_seconds: float = 0.0
    """Time the engine's thread waited for decoded panels (the device may have been busy
    meanwhile: its timeline says whether it starved)."""
    pool_wait_seconds: float = 0.0
    """Time the engine's thread waited for free host buffers."""
    bytes_decoded: int = 0
    bytes_h2d: int = 0
    bytes_d2h: int = 0


@dataclass
class _Staged:
    lease: Lease
    fills: list[Future[tuple[int | None | CompressedPanel, int]]]
    """Each half's fill result and its max |value| (0 unless measured)."""


@dataclass
class _Slot:
    a: Any = None
    b: Any = None
    free: Event | None = None
    """Recorded on the compute stream after the last gemm that read this slot."""
    peaks: tuple[int, int] | None = None
    """Max |values| of the panels in it (an integer accumulator's exact product)."""


@dataclass
class _Streams:
    compute: Stream
    h2d: Stream
    d2h: Stream
    slots: list[_Slot] = field(default_factory=lambda: [_Slot() for _ in range(DEVICE_SLOTS)])


class StagedProduct:
    """``acc += A_k @ B_k`` over K panels on ``device``, the accumulator resident there.

    ``depth`` panels are decoded ahead of the one being multiplied, by ``decode_threads``
    threads. ``serialize=True`` is the baseline without overlap: decode, copy, multiply, wait,
    next panel. Engines in several threads may share one device (each has its own streams)
    and one pool.
    """

    def __init__(
        self,
        device: Device,
        shape: tuple[int, int],
        dtype: DTypeLike,
        pool: BufferPool,
        *,
        decode_threads: int = 2,
        depth: int = 2,
        serialize: bool = False,
        precision: str = "fp32",
        panel_dtype: DTypeLike | None = None,
    ) -> None:
        if decode_threads < 1 or depth < 1:
            raise ValueError(f"need decode_threads, depth >= 1, got {decode_threads}, {depth}")
        self.device, self.pool = device, pool
        self.shape, self.dtype = (int(shape[0]), int(shape[1])), np.dtype(dtype)
        self.decode_threads, self.depth, self.serialize = decode_threads, depth, serialize
        self.panel_dtype = np.dtype(panel_dtype or dtype)
        """The dtype panels are staged in: the accumulator's, or the float an integer one's
        panels are read in (kernels.exact)."""
        self.exact = exact.is_integer(self.dtype)
        """An integer accumulator: each panel's max |values| go with it (the device cuts its
        product into exact float blocks by them)."""
        self.precision = precision
        """Given to every gemm: the device picks its kernel for it (kernels.backends.PRECISIONS)."""
        self.streams = _Streams(device.stream(), device.stream(), device.stream())
        # Zeroed on the compute stream, so every gemm is ordered after it.
        self.acc = device.zeros(self.shape, self.dtype, self.streams.compute)
        self.panel_decoder: Decoder | None = None
        """Made on the first compressed panel (--gpu-decode) and kept: one codec, reused
        device buffers (kernels.device.decode)."""

    def run(
        self,
        panels: Iterable[Panel | tuple[int, Fill, Fill]],
        finished: Finished | None = None,
        bands: Iterable[tuple[int, int]] | None = None,
    ) -> StagedStats:
        """Multiply every panel into the accumulator. With ``finished``, the last panel goes
        band by band (``bands``, default the whole tile), each band handed over as soon as it
        is final; with K = 0 the bands are zeros."""
        start = time.perf_counter()
        source = (Panel(*p) for p in panels)
        with ThreadPoolExecutor(self.decode_threads, thread_name_prefix="panel-decode") as pool:
            run = _Run(self, source, pool)
            try:
                run.loop(finished, list(bands or [(0, self.shape[0])]))
            finally:
                run.abandon()
        run.stats.seconds = time.perf_counter() - start
        return run.stats

    def result(self) -> NDArray[Any]:
        """The whole accumulator copied to a new host array (waits for the work queued)."""
        host = np.empty(self.shape, self.dtype)
        _order(self.device, self.streams.compute, self.streams.d2h)
        self.device.copy_to_host(self.acc, host, self.streams.d2h)
        self.streams.d2h.synchronize()
        return host


class _Run:
    """One pass over the panels: the staging queue, the leases in flight, the counters."""

    def __init__(self, engine: StagedProduct, source: Iterator[Panel], pool: ThreadPoolExecutor):
        self.engine, self.device, self.streams = engine, engine.device, engine.streams
        self.source, self.decoders, self.stats = source, pool, StagedStats()
        self.next: Panel | None = next(source, None)
        self.staged: deque[_Staged] = deque()
        self.current: _Staged | None = None  # out of the queue, copies not yet queued
        self.copying: list[tuple[Event, Lease, list[object]]] = []
        """Leases back to the pool, and device buffers dropped, once the event passed."""

    def loop(self, finished: Finished | None, bands: list[tuple[int, int]]) -> None:
        serialize, s = self.engine.serialize, self.streams
        while True:
            self.top_up(1 if serialize else self.engine.depth, may_wait=True)
            if not self.staged:
                break
            self.current = self.staged.popleft()
            self.release()  # the previous panel's copy: a host holds depth + 1 panels at most
            if not serialize:
                self.top_up(self.engine.depth, may_wait=False)  # decode ahead meanwhile
            slot = self.upload(self.current)
            if finished is None or self.staged or self.next is not None:
                self.device.gemm(
                    self.engine.acc, slot.a, slot.b, s.compute, None, self.engine.precision,
                    slot.peaks,
                )  # fmt: skip
                slot.free = _recorded(self.device, s.compute)
            else:
                self.release()  # hold no buffers while waiting for the band buffers
                self.bands(slot, finished, bands)
            if serialize:
                s.compute.synchronize()
        if finished is not None and self.stats.panels == 0:
            self.bands(None, finished, bands)
        self.release()
        s.compute.synchronize()

    def top_up(self, limit: int, may_wait: bool) -> None:
        """Lease buffers for the next panels and start decoding them, up to ``limit`` staged."""
        (m, n), dtype = self.engine.shape, self.engine.panel_dtype
        while self.next is not None and len(self.staged) < limit:
            specs = [((m, self.next.width), dtype), ((self.next.width, n), dtype)]
            lease = self.engine.pool.try_acquire_group(specs)
            if lease is None:
                if self.staged or not may_wait:
                    return  # never wait while holding buffers
                self.release()
                lease = self.wait_for(specs)
            fills = [
                self.decoders.submit(_filled, fill, out, self.engine.exact)
                for fill, out in zip(
                    (self.next.fill_a, self.next.fill_b), lease.arrays, strict=True
                )
            ]
            self.staged.append(_Staged(lease, fills))
            self.next = next(self.source, None)

    def upload(self, item: _Staged) -> _Slot:
        """Wait for the panel's decoding, queue its copies into the next device slot and make
        the compute stream wait for them."""
        start = time.perf_counter()
        got, peaks = zip(*(fill.result() for fill in item.fills), strict=True)
        self.stats.decode_wait_seconds += time.perf_counter() - start
        for out, filled in zip(item.lease.arrays, got, strict=True):
            if isinstance(filled, CompressedPanel):
                self.stats.bytes_decoded += filled.bytes_read
            else:
                self.stats.bytes_decoded += out.nbytes if filled is None else int(filled)
        a, b = item.lease.arrays
        slot = self.streams.slots[self.stats.panels % DEVICE_SLOTS]
        self.stats.panels += 1
        if slot.a is None or slot.a.shape != a.shape or slot.b.shape != b.shape:
            if slot.free is not None:
                slot.free.synchronize()  # a gemm may still read the buffers being replaced
            slot.a, slot.b = (
                self.device.empty(a.shape, a.dtype),
                self.device.empty(b.shape, b.dtype),
            )
        elif slot.free is not None:
            slot.free.wait(self.streams.h2d)
        slot.peaks = (peaks[0], peaks[1]) if self.engine.exact else None
        keep: list[object] = []  # what queued decodes read
        for host, dev, filled in ((a, slot.a, got[0]), (b, slot.b, got[1])):
            if isinstance(filled, CompressedPanel):  # decoded on the device
                staged = host.reshape(-1).view(np.uint8)
                keep.append(self.decoder().decode_into(staged, filled, dev))
                self.stats.bytes_h2d += filled.nbytes
            else:
                self.device.copy_to_device(host, dev, self.streams.h2d)
                self.stats.bytes_h2d += host.nbytes
        copied = _recorded(self.device, self.streams.h2d)
        copied.wait(self.streams.compute)
        self.copying.append((copied, item.lease, keep))
        self.current = None
        return slot

    def decoder(self) -> Decoder:
        """The engine's one decoder, made at its first compressed panel."""
        if self.engine.panel_decoder is None:
            self.engine.panel_decoder = self.device.decoder(self.streams.h2d)
        return self.engine.panel_decoder

    def bands(self, slot: _Slot | None, finished: Finished, bands: list[tuple[int, int]]) -> None:
        """The last panel band by band: band i+1 computes while band i is copied back and
        handed over; two host buffers take turns."""
        acc, s = self.engine.acc, self.streams
        spec = ((max((r1 - r0 for r0, r1 in bands), default=0), acc.shape[1]), acc.dtype)
        lease = self.wait_for([spec, spec])
        try:
            ready: list[tuple[tuple[int, int], NDArray[Any], Event]] = []
            for i, (r0, r1) in enumerate(bands):
                if slot is not None:
                    self.device.gemm(
                        acc, slot.a[r0:r1], slot.b, s.compute, (r0, r1), self.engine.precision,
                        slot.peaks,
                    )  # fmt: skip
                host = lease.arrays[i % 2][: r1 - r0]
                _order(self.device, s.compute, s.d2h)
                self.device.copy_to_host(acc[r0:r1], host, s.d2h)
                self.stats.bytes_d2h += host.nbytes
                ready.append(((r0, r1), host, _recorded(self.device, s.d2h)))
                if len(ready) == 2:  # the previous band, while this one computes
                    _hand_over(ready.pop(0), finished)
            if slot is not None:
                slot.free = _recorded(self.device, s.compute)
            for band in ready:
                _hand_over(band, finished)
        finally:
            s.d2h.synchronize()  # no copy may still write a buffer given back
            lease.release()

    def wait_for(self, specs: Sequence[ArraySpec]) -> Lease:
        """Lease buffers for ``specs``, waiting as long as it takes (hold none when calling)."""
        start = time.perf_counter()
        lease = self.engine.pool.acquire_group(specs)
        self.stats.pool_wait_seconds += time.perf_counter() - start
        return lease

    def release(self) -> None:
        for copied, lease, _ in self.copying:
            copied.synchronize()
            lease.release()
        self.copying.clear()

    def abandon(self) -> None:
        """Give every buffer back, also after an error: queued decodes are dropped, running
        ones finish first (they write into leased buffers), as do queued copies."""
        held = [*self.staged, *([self.current] if self.current else [])]
        for fill in (f for item in held for f in item.fills):
            fill.cancel()
        for fill in (f for item in held for f in item.fills):
            if not fill.cancelled():
                fill.exception()  # waits; an error here is not the one being raised
        self.streams.h2d.synchronize()
        for item in held:
            item.lease.release()
        self.release()


def _filled(fill: Fill, out: NDArray[Any], measure: bool) -> tuple[Any, int]:
    """Runs in a decode thread: fill ``out``; with ``measure``, also its max |value| (a panel
    decoded on the device: its stored integer dtype's largest)."""
    filled = fill(out)
    if not measure:
        return filled, 0
    if isinstance(filled, CompressedPanel):
        if not exact.is_integer(filled.dtype):
            raise ValueError(f"{filled.dtype} chunks decoded on the device into an integer product")
        return filled, exact.magnitude(filled.dtype)
    return filled, exact.largest(out)


def _recorded(device: Device, stream: Stream) -> Event:
    event = device.event()
    event.record(stream)
    return event


def _order(device: Device, first: Stream, then: Stream) -> None:
    """Work queued on ``then`` from now on waits for the work queued on ``first`` so far."""
    _recorded(device, first).wait(then)


def _hand_over(band: tuple[tuple[int, int], NDArray[Any], Event], finished: Finished) -> None:
    rows, host, done = band
    done.synchronize()
    finished(rows, host)

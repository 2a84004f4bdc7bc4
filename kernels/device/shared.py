"""This process's shared emulated devices: every task of a worker drives one device, as on a
GPU box with one worker per GPU; a benchmark reads their timelines after a job."""

from __future__ import annotations

import threading

from kernels.device.emulated import DECODE_GBPS, EmulatedDevice, TimelineEntry

_SHARED: dict[tuple[float, float, int | None, float], EmulatedDevice] = {}
_SHARED_LOCK = threading.Lock()


def shared_device(
    tflops: float,
    h2d_gbps: float,
    memory_bytes: int | None = None,
    decode_gbps: float = DECODE_GBPS,
) -> EmulatedDevice:
    """This process's emulated GPU for these figures: every task of a worker drives one device,
    as on a GPU box with one worker per GPU."""
    key = (float(tflops), float(h2d_gbps), memory_bytes, float(decode_gbps))
    with _SHARED_LOCK:
        device = _SHARED.get(key)
        if device is None:
            device = _SHARED[key] = EmulatedDevice(
                tflops, h2d_gbps, memory_bytes=memory_bytes, decode_gbps=decode_gbps
            )
        return device


def shared_timelines() -> list[list[TimelineEntry]]:
    """The timelines of this process's shared devices (what a benchmark reads after a job)."""
    with _SHARED_LOCK:
        return [list(device.timeline) for device in _SHARED.values()]


def gemm_seconds() -> float:
    """Modelled seconds of every gemm on this process's shared devices (a worker's kernel time)."""
    return sum(e.end - e.start for t in shared_timelines() for e in t if e.name == "gemm")


def reset_shared() -> None:
    """Close and forget this process's shared devices (a fresh timeline for the next job)."""
    with _SHARED_LOCK:
        for device in _SHARED.values():
            device.close()
        _SHARED.clear()

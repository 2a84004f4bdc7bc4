"""The emulated device: stream order, events across streams, engines, memory, calibration.

Rates are chosen so each operation takes 10-40 ms of modelled time: long against the
scheduling noise of a shared machine with few cores, short enough for a fast suite. Where the
host must act before a kernel ends, the kernel takes 128 ms (LONG).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import numpy as np
import pytest

from kernels.device.emulated import DeviceMemoryError, EmulatedDevice, TimelineEntry
from kernels.device.rates import calibrate

# 1 GFLOP/s and 0.1 GB/s: a 200^3 float32 gemm is 16 ms, a 1 MB copy 10 ms.
TFLOPS, GBPS = 1e-3, 0.1
N = 200
LONG = 400  # a 128 ms gemm
MB = np.zeros((1, 1_000_000), np.uint8)


@pytest.fixture
def device() -> Iterator[EmulatedDevice]:
    with EmulatedDevice(TFLOPS, GBPS) as dev:
        yield dev


def operands(dev: EmulatedDevice, n: int = N, dtype: str = "float32") -> tuple[object, ...]:
    return tuple(dev.zeros((n, n), dtype) for _ in range(3))


def entries(dev: EmulatedDevice, engine: str) -> list[TimelineEntry]:
    return sorted((e for e in dev.timeline if e.engine == engine), key=lambda e: e.start)


def test_copy_and_kernel_on_different_streams_overlap(device: EmulatedDevice) -> None:
    acc, a, b = operands(device, LONG)
    buf = device.empty(MB.shape, MB.dtype)
    s1, s2 = device.stream(), device.stream()
    device.gemm(acc, a, b, s1)
    device.copy_to_device(MB, buf, s2)
    device.synchronize()
    (kernel,), (copy,) = entries(device, "compute"), entries(device, "h2d")
    assert kernel.start < copy.end and copy.start < kernel.end
    assert kernel.amount == 2 * LONG**3 and copy.amount == MB.nbytes
    assert kernel.end - kernel.start == pytest.approx(2 * LONG**3 / (TFLOPS * 1e12), rel=0.3)


def test_an_engine_runs_one_operation_at_a_time(device: EmulatedDevice) -> None:
    acc, a, b = operands(device)
    bufs = [device.empty(MB.shape, MB.dtype) for _ in range(2)]
    for buf in bufs:
        stream = device.stream()
        device.gemm(acc, a, b, stream)
        device.copy_to_device(MB, buf, stream)
    device.synchronize()
    for engine in ("compute", "h2d"):
        first, second = entries(device, engine)
        assert second.start >= first.end


def test_one_stream_runs_in_order_across_engines(device: EmulatedDevice) -> None:
    acc, a, b = operands(device)
    buf = device.empty(MB.shape, MB.dtype)
    s = device.stream()
    device.gemm(acc, a, b, s)
    device.copy_to_device(MB, buf, s)
    s.synchronize()
    (kernel,), (copy,) = entries(device, "compute"), entries(device, "h2d")
    assert copy.start >= kernel.end


def test_event_orders_work_on_another_stream(device: EmulatedDevice) -> None:
    acc, a, b = operands(device)
    buf = device.empty(MB.shape, MB.dtype)
    s1, s2 = device.stream(), device.stream()
    device.gemm(acc, a, b, s1)
    done = device.event()
    done.record(s1)
    done.wait(s2)
    device.copy_to_device(MB, buf, s2)
    done.synchronize()
    returned = time.perf_counter()
    s2.synchronize()
    (kernel,), (copy,) = entries(device, "compute"), entries(device, "h2d")
    assert returned >= kernel.end  # the host really waited for the kernel (its modelled end)
    assert copy.start >= kernel.end


def test_waiting_operation_does_not_hold_up_its_engine(device: EmulatedDevice) -> None:
    """Like a GPU with several hardware queues: a copy waiting for an event doesn't block a
    later, ready copy on another stream."""
    acc, a, b = operands(device, LONG)
    bufs = [device.empty(MB.shape, MB.dtype) for _ in range(2)]
    s1, s2, s3 = device.stream(), device.stream(), device.stream()
    device.gemm(acc, a, b, s1)
    done = device.event()
    done.record(s1)
    done.wait(s2)
    device.copy_to_device(MB, bufs[0], s2)  # queued first, but waits for the kernel
    device.copy_to_device(MB, bufs[1], s3)
    device.synchronize()
    first, second = entries(device, "h2d")
    assert first.end <= entries(device, "compute")[0].end <= second.start


def test_event_on_an_idle_stream_is_already_complete(device: EmulatedDevice) -> None:
    """It does not wait for work on other streams: it returns before their kernel ends."""
    acc, a, b = operands(device, LONG)
    submitted = time.perf_counter()
    device.gemm(acc, a, b, device.stream())
    event = device.event()
    event.record(device.stream())
    event.synchronize()
    assert time.perf_counter() < submitted + 2 * LONG**3 / (TFLOPS * 1e12)


def test_busy_seconds_and_fraction_in_a_window(device: EmulatedDevice) -> None:
    acc, a, b = operands(device)
    s = device.stream()
    for _ in range(3):
        device.gemm(acc, a, b, s)
    s.synchronize()
    kernel_seconds = 2 * N**3 / (TFLOPS * 1e12)
    assert device.busy_seconds("compute") == pytest.approx(3 * kernel_seconds, rel=0.3)
    # From the first kernel's start: a host delay before it is not the device's.
    start = entries(device, "compute")[0].start
    window = (start, start + 6 * kernel_seconds)
    assert device.busy_fraction("compute", window) == pytest.approx(0.5, abs=0.1)
    assert device.busy_seconds("h2d") == 0


def test_float64_kernels_run_at_half_rate(device: EmulatedDevice) -> None:
    s = device.stream()
    for dtype in ("float32", "float64"):
        acc, a, b = operands(device, dtype=dtype)
        device.gemm(acc, a, b, s)
    s.synchronize()
    f32, f64 = entries(device, "compute")
    assert (f64.end - f64.start) / (f32.end - f32.start) == pytest.approx(2, rel=0.3)


def test_copy_back_poisons_only_the_rows_copied(device: EmulatedDevice) -> None:
    host = np.full((4, 5), 7.0, np.float32)
    s = device.stream()
    device.copy_to_host(device.zeros((4, 5), np.float32)[1:3], host[1:3], s)
    s.synchronize()
    assert np.isnan(host[1:3]).all() and (host[[0, 3]] == 7).all()  # no math: no numbers
    assert entries(device, "d2h")[0].amount == 2 * 5 * 4


def test_shape_checks(device: EmulatedDevice) -> None:
    s = device.stream()
    with pytest.raises(ValueError, match="copy between host"):
        device.copy_to_device(np.zeros((3, 4), np.float32), device.empty((4, 3), np.float32), s)
    acc, a = device.zeros((4, 4), np.float32), device.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="do not give the accumulator's"):
        device.gemm(acc, a, device.zeros((3, 4), np.float32), s)
    with pytest.raises(ValueError, match="outside the accumulator's 4 rows"):
        device.gemm(acc, a, device.zeros((2, 4), np.float32), s, rows=(2, 6))


def test_device_memory_is_modelled() -> None:
    with EmulatedDevice(TFLOPS, GBPS, memory_bytes=1000) as dev:
        first = dev.empty((10, 10), np.float32)
        band = first[2:5]  # a view: no new memory
        assert band.shape == (3, 10) and dev.memory_in_use == 400
        second = dev.empty((10, 10), np.float32)
        with pytest.raises(DeviceMemoryError, match="400 more bytes with 800 of 1000 in use"):
            dev.empty((10, 10), np.float32)
        del first, band, second
        gc.collect()
        assert dev.memory_in_use == 0 and dev.peak_memory == 800


def test_closed_device_refuses_work() -> None:
    dev = EmulatedDevice(TFLOPS, GBPS)
    dev.close()
    with pytest.raises(RuntimeError, match="closed"):
        dev.copy_to_device(MB, dev.empty(MB.shape, MB.dtype), dev.stream())


def near_rate(got: float, configured: float) -> bool:
    """A measured rate against the emulation's: it sleeps at least the modelled time, so a
    busy machine only makes the measurement slower; best of several runs, 35 % allowed."""
    return 0.65 * configured <= got <= 1.05 * configured


def test_calibrate_measures_the_configured_rates() -> None:
    # Operations of 40-80 ms: a few ms of late wake-ups on a loaded machine stay within 35 %.
    with EmulatedDevice(TFLOPS, GBPS, d2h_gbps=2 * GBPS) as dev:
        got = calibrate(dev, n=320, copy_bytes=8_000_000, repeats=3)
    assert near_rate(got.flops_per_second, TFLOPS * 1e12), got
    assert near_rate(got.h2d_bytes_per_second, GBPS * 1e9), got
    assert near_rate(got.d2h_bytes_per_second, 2 * GBPS * 1e9), got
    with EmulatedDevice(TFLOPS, GBPS) as dev:
        f64 = calibrate(dev, n=N, copy_bytes=100_000, repeats=3, dtype=np.float64)
    assert near_rate(f64.flops_per_second, TFLOPS * 1e12 / 2), f64

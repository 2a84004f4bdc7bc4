"""The staged engine: bitwise CudaAccumulator results in the simulator; on the emulated device,
stream ordering, buffer lifetimes, a bounded pool shared by engines, and the overlap gain."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from kernels.cuda import host as cuda_host
from kernels.device.emulated import EmulatedDevice
from kernels.device.engine import Panel, StagedProduct
from kernels.device.gpu import NumbaDevice
from kernels.device.rates import calibrate
from kernels.memory.allocators import numpy_allocator, pinned_allocator
from kernels.memory.buffers import PAGE, BufferPool, Lease

needs_cuda = pytest.mark.skipif(
    not cuda_host.cuda_available(), reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1"
)
tiny_grid = pytest.mark.filterwarnings("ignore:Grid size .* under-utilization")
M, N, WIDTHS = 20, 12, [5, 0, 7, 3]  # simulator-sized; one empty panel
BANDS = [(0, 8), (8, 16), (16, 20)]


def copier(data: NDArray[Any]) -> Callable[[NDArray[Any]], None]:
    def fill(out: NDArray[Any]) -> None:
        np.copyto(out, data)

    return fill


def random_panels(dtype: str, seed: int) -> list[tuple[NDArray[Any], NDArray[Any]]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((M, w)).astype(dtype), rng.standard_normal((w, N)).astype(dtype))
        for w in WIDTHS
    ]


def staged(data: list[tuple[NDArray[Any], NDArray[Any]]]) -> list[Panel]:
    return [Panel(a.shape[1], copier(a), copier(b)) for a, b in data]


def reference(dtype: str, data: list[tuple[NDArray[Any], NDArray[Any]]]) -> bytes:
    acc = cuda_host.CudaAccumulator((M, N), np.dtype(dtype))
    for a, b in data:
        acc.add(a, b)
    return acc.result().tobytes()


# --- bitwise against CudaAccumulator, in the simulator -----------------------------------------


@needs_cuda
@tiny_grid
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_whole_and_banded_results_are_those_of_cuda_accumulator(dtype: str) -> None:
    data = random_panels(dtype, seed=3)
    want = reference(dtype, data)
    # Room for about one panel: buffers must be waited for, reused and evicted.
    pool = BufferPool(pinned_allocator, 4 * PAGE)
    whole = StagedProduct(NumbaDevice(), (M, N), dtype, pool)
    stats = whole.run(staged(data))
    assert whole.result().tobytes() == want
    itemsize = np.dtype(dtype).itemsize
    assert stats.panels == 4 and stats.bytes_h2d == stats.bytes_decoded == sum(
        (M + N) * w * itemsize for w in WIDTHS
    )
    got: dict[tuple[int, int], NDArray[Any]] = {}
    banded = StagedProduct(NumbaDevice(), (M, N), dtype, pool, depth=1, decode_threads=1)
    stats = banded.run(staged(data), lambda band, host: got.update({band: host.copy()}), BANDS)
    assert list(got) == BANDS
    assert np.concatenate([got[band] for band in BANDS]).tobytes() == want
    assert stats.bytes_d2h == M * N * itemsize
    assert pool.stats().bytes_leased == 0 and pool.stats().peak_bytes_held <= 4 * PAGE


@needs_cuda
@tiny_grid
def test_engines_in_threads_share_one_device_and_pool() -> None:
    device, pool = NumbaDevice(), BufferPool(pinned_allocator, 6 * PAGE)
    inputs = [random_panels("float32", seed) for seed in (1, 2, 3)]
    results: dict[int, bytes] = {}

    def work(i: int) -> None:
        engine = StagedProduct(device, (M, N), "float32", pool)
        engine.run(staged(inputs[i]))
        results[i] = engine.result().tobytes()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == {i: reference("float32", inputs[i]) for i in range(3)}


@needs_cuda
@tiny_grid
def test_calibrate_drives_numba_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol calls (streams, copies, gemm) on the simulator, timed by a fake clock:
    each rate is the work over the best repeat, the warm-up (here the fastest) left out."""
    from kernels.device import rates as module

    durations = iter([0.5, 4.0, 2.0, 0.25, 1.0, 2.0, 0.125, 8.0, 4.0])  # gemm, h2d, d2h
    reads = iter(range(10**6))

    def clock() -> float:  # start, then start + the next duration
        return 0.0 if next(reads) % 2 == 0 else next(durations)

    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=clock))
    got = calibrate(NumbaDevice(), n=8, copy_bytes=256, repeats=2)
    assert (got.flops_per_second, got.h2d_bytes_per_second, got.d2h_bytes_per_second) == (
        2 * 8**3 / 2.0,
        256 / 1.0,
        256 / 4.0,
    )


# --- the engine's orchestration, on the emulated device ----------------------------------------

TILE, WIDTH = 256, 256
SPEC_BYTES = TILE * WIDTH * 4  # one float32 panel of A or of B


def sleepers(count: int, seconds: float) -> list[Panel]:
    def fill(out: NDArray[Any]) -> None:
        time.sleep(seconds)  # a decode: the GIL is free meanwhile

    return [Panel(WIDTH, fill, fill) for _ in range(count)]


class RecordingPool(BufferPool):
    """Notes when each lease, in the order leased, went back."""

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(numpy_allocator, budget_bytes)
        self.released: dict[int, float] = {}
        self.leased = 0

    def _acquire(self, specs: Any, timeout: float | None) -> Lease | None:
        lease = super()._acquire(specs, timeout)
        if lease is not None:
            index, give_back = self.leased, lease.release
            self.leased += 1

            def release() -> None:
                self.released[index] = time.perf_counter()
                give_back()

            lease.release = release  # type: ignore[method-assign]
        return lease


def test_events_order_copies_gemms_and_buffer_reuse() -> None:
    pool = RecordingPool(16 * SPEC_BYTES)
    with EmulatedDevice(tflops=0.01, h2d_gbps=0.5) as dev:
        engine = StagedProduct(dev, (TILE, TILE), "float32", pool)
        engine.run(sleepers(5, 0.001), lambda band, host: None, [(0, 128), (128, 256)])
        copies = sorted((e for e in dev.timeline if e.engine == "h2d"), key=lambda e: e.start)
        gemms = sorted((e for e in dev.timeline if e.engine == "compute"), key=lambda e: e.start)
        backs = [e for e in dev.timeline if e.engine == "d2h"]
    assert (len(copies), len(gemms), len(backs)) == (10, 6, 2)  # last panel: two bands
    for k in range(5):
        panel_copied = copies[2 * k + 1].end
        assert gemms[k].start >= panel_copied  # a gemm waits for its panel's copies
        assert pool.released[k] >= panel_copied  # its host buffers are reused only then
        if k >= 2:  # a device slot is overwritten only after the gemm that read it
            assert copies[2 * k].start >= gemms[k - 2].end
    # Host memory: the panel being copied and depth (2) staged ahead, then two band buffers.
    assert pool.stats().peak_bytes_held <= 3 * 2 * SPEC_BYTES + SPEC_BYTES
    backs.sort(key=lambda e: e.start)
    assert backs[0].start >= gemms[4].end and backs[1].start >= gemms[5].end  # bands final
    assert backs[0].start < gemms[5].end  # band 0 goes back while band 1 computes


def test_engines_sharing_a_tight_pool_finish() -> None:
    """Three engines, room for one panel each at most: no engine waits while holding buffers,
    so none deadlocks."""
    panel_group = 2 * SPEC_BYTES  # A and B of one panel, page multiples already
    pool = BufferPool(numpy_allocator, 2 * panel_group)
    stats: list[Any] = []
    with EmulatedDevice(tflops=0.05, h2d_gbps=2) as dev:

        def work() -> None:
            engine = StagedProduct(dev, (TILE, TILE), "float32", pool, depth=3)
            stats.append(engine.run(sleepers(4, 0.002), lambda band, host: None))  # + bands

        # Daemons: a deadlock fails the test instead of hanging the interpreter's exit.
        threads = [threading.Thread(target=work, daemon=True) for _ in range(3)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert len(stats) == 3 and all(s.panels == 4 for s in stats)
    assert pool.stats().peak_bytes_held <= 2 * panel_group and pool.stats().bytes_leased == 0


def test_a_failing_decode_gives_every_buffer_back() -> None:
    def broken(out: NDArray[Any]) -> None:
        raise OSError("chunk missing")

    panels = sleepers(2, 0.001) + [Panel(WIDTH, broken, broken)] + sleepers(3, 0.001)
    pool = BufferPool(numpy_allocator, 16 * SPEC_BYTES)
    with EmulatedDevice(tflops=0.05, h2d_gbps=2) as dev:
        engine = StagedProduct(dev, (TILE, TILE), "float32", pool)
        with pytest.raises(OSError, match="chunk missing"):
            engine.run(panels)
    assert pool.stats().bytes_leased == 0


def test_no_panels_hands_over_zero_bands() -> None:
    got: list[tuple[int, int]] = []
    with EmulatedDevice(tflops=0.05, h2d_gbps=2) as dev:
        engine = StagedProduct(dev, (4, 3), "float32", BufferPool(numpy_allocator, 4 * PAGE))
        stats = engine.run([], lambda band, host: got.append(band), [(0, 2), (2, 4)])
    assert got == [(0, 2), (2, 4)] and stats.panels == 0 and stats.bytes_d2h == 48


PANELS, GEMM_S, DECODE_S = 8, 0.04, 0.02
COPY_S = 2 * SPEC_BYTES / 0.1e9  # A and B of a panel at 0.1 GB/s: 5 ms


def run_panels(overlap: bool) -> tuple[float, float]:
    """(compute busy fraction of the run, seconds the compute engine idled between gemms):
    a gemm 40 ms, a panel's copies 5 ms, the decodes of A and of B 20 ms (side by side)."""
    pool = BufferPool(numpy_allocator, 16 * SPEC_BYTES)
    tflops = 2 * TILE * TILE * WIDTH / GEMM_S / 1e12
    with EmulatedDevice(tflops=tflops, h2d_gbps=0.1) as dev:
        options = {"depth": 2, "decode_threads": 2} if overlap else {"serialize": True}
        engine = StagedProduct(dev, (TILE, TILE), "float32", pool, **options)
        start = time.perf_counter()
        engine.run(sleepers(PANELS, DECODE_S))
        busy = dev.busy_fraction("compute", (start, time.perf_counter()))
        gemms = sorted((e for e in dev.timeline if e.engine == "compute"), key=lambda e: e.start)
    return busy, sum(max(0.0, after.start - before.end) for before, after in pairwise(gemms))


def test_overlap_keeps_the_emulated_device_busier() -> None:
    """In series the device waits for each panel's decode and copies: busy 40 / 65 = 0.62 at
    most, idle 7 x 25 ms at least (a busy host only adds to both). Overlapped, the next
    panels are decoded and copied during the gemm: gemm follows gemm, busy ~0.93 (the first
    decode is exposed), with 20 ms a panel to spare for a slow host; best of three runs."""
    serial_busy, serial_idle = run_panels(overlap=False)
    assert serial_busy < 0.65 and serial_idle >= (PANELS - 1) * (DECODE_S + COPY_S)
    for _ in range(3):
        busy, idle = run_panels(overlap=True)
        if busy > 0.8 and idle < 0.25 * serial_idle:
            break
    assert busy > 0.8 and idle < 0.25 * serial_idle, (busy, idle, serial_busy, serial_idle)


def test_engine_modules_import_neither_numba_nor_dask_nor_zarr() -> None:
    code = (
        "import sys, kernels.memory.buffers, kernels.device.gpu, kernels.device.rates, "
        "kernels.device.emulated, kernels.device.engine; "
        "print([m for m in ('numba', 'dask', 'zarr') if m in sys.modules])"
    )
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"

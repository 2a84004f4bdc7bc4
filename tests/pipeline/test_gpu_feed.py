"""The emulated device fed by the whole multiply path (benchmarks/gpu_feed.py): the overlap of
decode, copies and kernels shows on the device's timeline, so the measurement can fail."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr

from benchmarks import gpu_feed
from pipeline.plan.gpu_candidate import first_band_rows
from tests.helpers import random_matrix

N, CHUNK = 3072, 512


@pytest.fixture(scope="module")
def operands(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("feed")
    rng = np.random.default_rng(5)
    urls = []
    for name in ("a.zarr", "b.zarr"):  # zarr's default codec (zstd), as users store them
        zarr.create_array(
            root / name, data=random_matrix(rng, (N, N), "float32"), chunks=(CHUNK, CHUNK)
        )
        urls.append(str(root / name))
    return urls[0], urls[1]


def feed(operands: tuple[str, str], overlap: bool, tflops: float) -> dict[str, object]:
    settings = {
        "tilegemm.emulated.tflops": tflops,
        "tilegemm.emulated.h2d-gbps": 5.0,
        "tilegemm.gpu-overlap": overlap,
    }
    with dask.config.set(settings):
        return gpu_feed.run(*operands)


def idle_between_gemms(operands: tuple[str, str], overlap: bool, tflops: float) -> float:
    """Seconds the emulated compute engine sat idle between one gemm and the next."""
    from kernels.device.shared import shared_timelines

    feed(operands, overlap, tflops)
    (timeline,) = shared_timelines()
    gemms = sorted((e for e in timeline if e.name == "gemm"), key=lambda e: e.start)
    return sum(max(0.0, after.start - before.end) for before, after in pairwise(gemms))


def test_overlap_keeps_the_device_busier(operands: tuple[str, str]) -> None:
    """Overlapped, the next panel is decoded and copied while the device multiplies: gemm
    follows gemm with no gap. In series the device waits for each panel's decode and copy.
    Kernels of 0.15 s a panel leave a slow or busy host time to decode the next panel pair;
    the window (fill, drain, write: not overlapped) is not compared."""
    tflops = 2 * N**3 / 0.9 / 1e12  # six panels, 0.9 s of kernels
    feed(operands, True, tflops)  # a cold first job pays for fresh staging memory: not compared
    overlapped = idle_between_gemms(operands, True, tflops)
    serial = idle_between_gemms(operands, False, tflops)
    copy_seconds = 2 * CHUNK * N * 4 / 5e9  # a panel pair over the emulated 5 GB/s
    assert serial >= (N // CHUNK - 1) * copy_seconds, serial  # each panel's copy in between
    assert overlapped < 0.5 * serial, (overlapped, serial)


def test_the_last_line_says_busy_window_and_bound(
    operands: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_feed.main([*operands, "--device-tflops", "0.1", "--h2d-gbps", "10"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    words = last.split()
    assert last.startswith("emulated device: busy ") and " of the execution window " in last
    busy, window = float(words[3]), float(words[8])
    kernel_seconds = 2 * N**3 / 0.1e12
    # Busy is the kernels' modelled time over the window, however long the host took (both
    # figures printed to 0.01); more kernel than decode or copy seconds: bound by the kernel.
    assert 0 < busy <= 1.0 and window > kernel_seconds
    assert busy * window == pytest.approx(kernel_seconds, abs=0.005 * (busy + window) + 1e-4)
    assert last.endswith("s; bound by kernel")


def test_emulated_output_is_no_product(operands: tuple[str, str], tmp_path: Path) -> None:
    """The emulated device does no math: OUT holds NaN, never numbers to trust."""
    with dask.config.set({"tilegemm.emulated.tflops": 100.0, "tilegemm.emulated.h2d-gbps": 50.0}):
        gpu_feed.run(*operands, out=str(tmp_path / "c.zarr"))
    assert np.isnan(zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[:]).all()


def test_gpu_decode_leaves_the_host_only_reading(operands: tuple[str, str]) -> None:
    """--gpu-decode: every chunk goes compressed over the copy engine and is decoded on the
    device (its time on the compute engine, not counted as busy); the host decodes nothing and
    the plan models no host decode."""
    from kernels.device.shared import shared_timelines

    settings = {"tilegemm.emulated.tflops": 50.0, "tilegemm.emulated.h2d-gbps": 25.0}
    with dask.config.set(settings):
        report = gpu_feed.run(*operands, gpu_decode=True)
    (timeline,) = shared_timelines()
    decodes = [e for e in timeline if e.name == "decode"]
    chunks = 2 * (N // CHUNK) ** 2  # A and B once each: one tile
    assert sum(e.amount for e in decodes) == chunks * CHUNK * CHUNK * 4
    assert {e.engine for e in decodes} == {"compute"}
    assert sum(e.amount for e in timeline if e.name == "copy_compressed") < 2 * N * N * 4
    plan = report["plan"]
    assert dict(plan.resource_seconds)["decode"] == 0.0 and plan.device.decodes_chunks
    gemm = sum(e.end - e.start for e in timeline if e.name == "gemm")
    assert report["busy"] * report["window"] <= gemm + 1e-6  # busy counts gemms only


def test_kernel_events_are_recorded_in_the_simulator() -> None:
    from kernels.device.gpu import NumbaDevice

    device = NumbaDevice()
    device.record_kernels = True
    s = device.stream()
    acc = device.zeros((4, 4), np.float32, s)
    a, b = device.zeros((4, 3), np.float32, s), device.zeros((3, 4), np.float32, s)
    device.gemm(acc, a, b, s)
    s.synchronize()
    assert len(device.kernel_events) == 1
    # The simulator's events measure nothing (elapsed_time is -1 ms): counted as 0, not -1 ms.
    assert device.kernel_seconds() == 0.0


def test_worker_processes_kernel_time_reaches_the_report(operands: tuple[str, str]) -> None:
    """--real's measurement when the job runs in worker processes (as in a LocalCUDACluster's),
    on the emulated device: each worker's own kernel time is read there, so busy is not 0."""
    tflops = 2 * N**3 / 0.3 / 1e12  # 0.3 s of kernels in all
    with dask.config.set({"tilegemm.emulated.tflops": tflops, "tilegemm.emulated.h2d-gbps": 5.0}):
        measured = gpu_feed.measure_busy(*operands, None, "emulated", workers=2)
    assert measured["kernel_seconds"] == pytest.approx(0.3, rel=1e-3)
    assert 0.0 < measured["busy"] <= 1.0
    assert measured["busy"] == pytest.approx(0.3 / (2 * measured["window"]), rel=1e-6)


@pytest.mark.gpu
def test_real_gpu_feed_prints_measured_and_model(
    operands: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_feed.main([*operands, "--real"]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "model" in out and out.strip().endswith("s (measured)")
    assert "busy 0.00 " not in out  # the workers' kernel time reached the report


def test_narrow_panels_leave_room_for_the_band_buffers(tmp_path: Path) -> None:
    """The pinned pool's budget (planned) holds the last panel's two band buffers, also when
    they are bigger than the staged panel pairs (narrow K chunks, wide tiles)."""
    rng = np.random.default_rng(8)
    a = zarr.create_array(
        tmp_path / "a.zarr", data=random_matrix(rng, (1024, 96), "float32"), chunks=(1024, 16)
    )
    b = zarr.create_array(
        tmp_path / "b.zarr", data=random_matrix(rng, (96, 1024), "float32"), chunks=(16, 1024)
    )
    from kernels.device.shared import shared_timelines
    from pipeline import prepare

    job = prepare(a, b, str(tmp_path / "c.zarr"), backend="emulated")
    plan = job.plan
    bands = 2 * 4 * plan.tile_shape[1] * first_band_rows(plan.tile_shape[0], plan.block_shape[0])
    assert bands > 2 * plan.panel_pair_bytes  # the case: bands outweigh the staged panels
    settings = {"tilegemm.emulated.tflops": 100.0, "tilegemm.emulated.h2d-gbps": 50.0}
    with dask.config.set(settings):
        report = gpu_feed.run(str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"))
    (timeline,) = shared_timelines()
    # Every tile ran through the device: the emulated gemms add up to the product's flops.
    assert sum(e.amount for e in timeline if e.name == "gemm") == 2 * 1024 * 96 * 1024
    assert report["plan"].n_tiles == plan.n_tiles

"""The device-aware plan (pure): GPU backends plan tiles against the device's memory and a
per-resource time model; the dry run says what bounds the run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import zarr

from pipeline.errors import MemoryBudgetError
from pipeline.plan.device_model import DEVICE_CLASSES, DeviceModel
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec
from tests.helpers import run_cli

GiB = 2**30
H100 = DEVICE_CLASSES["h100-pcie"]
BIG = ArraySpec((131072, 131072), (4096, 4096), "float32")


def gpu_plan(device_bytes: int, backend: str = "cuda", **kw: object) -> object:
    device = replace(H100, memory_bytes=device_bytes)
    options = {"workers": 1, "threads_per_worker": 1, "memory_limit_bytes": 23 * GiB, **kw}
    return plan_matmul(BIG, BIG, backend=backend, device=device, decode_threads=8, **options)  # type: ignore[arg-type]


def test_a_big_device_plans_fewer_bigger_tiles_than_the_cpu() -> None:
    cpu = plan_matmul(BIG, BIG, workers=1, threads_per_worker=2, memory_limit_bytes=23 * GiB)
    big, small = gpu_plan(80 * GiB), gpu_plan(6 * GiB)
    assert big.n_tiles < cpu.n_tiles  # type: ignore[attr-defined]
    assert small.n_tiles > big.n_tiles  # type: ignore[attr-defined]
    for plan, limit in ((big, 80 * GiB), (small, 6 * GiB)):
        assert plan.device_bytes <= limit  # type: ignore[attr-defined]
        # the accumulator lives on the device: the host holds staging, smaller than the tile
        tm, tn = plan.tile_shape  # type: ignore[attr-defined]
        assert plan.task_bytes < tm * tn * 4 + plan.device_bytes  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("device", "bound"),
    [
        # a slow kernel: the kernel bounds the run
        (DeviceModel("slow", 80 * GiB, 1e12, 0.5e12, 50e9, "test"), "kernel"),
        # a fast kernel and a slow bus: the copies bound it
        (DeviceModel("thin-bus", 80 * GiB, 1e15, 1e15, 0.5e9, "test"), "host-to-device"),
        # a fast kernel and bus: decoding on the host bounds it
        (DeviceModel("fast", 80 * GiB, 1e15, 1e15, 1e12, "test"), "decode"),
    ],
)
def test_bound_by_names_the_busiest_resource(device: DeviceModel, bound: str) -> None:
    a = ArraySpec((8192, 8192), (2048, 2048), "float32")
    plan = plan_matmul(
        a, a, workers=1, threads_per_worker=1, memory_limit_bytes=16 * GiB, backend="cuda",
        device=device, decode_threads=2,
    )  # fmt: skip
    assert plan.bound_by == bound
    seconds = dict(plan.resource_seconds)
    assert seconds[bound] == max(seconds.values())
    assert plan.estimated_seconds >= seconds[bound]


def test_a_device_too_small_is_refused_with_the_fix() -> None:
    with pytest.raises(MemoryBudgetError, match=r"device memory.*raise --device-memory-limit"):
        gpu_plan(64 * 2**20)


def test_cpu_plans_are_unchanged_by_the_device_model() -> None:
    a = ArraySpec((8192, 8192), (2048, 2048), "float32")
    plan = plan_matmul(a, a, workers=1, threads_per_worker=2, memory_limit_bytes=8 * GiB)
    assert plan.device is None and plan.resource_seconds == ()
    # 1.1e12 flops over 0.5 GB of input: the multiply; 1.1e9 flops over the same: the decode.
    assert plan.bound_by == "product"
    skinny = plan_matmul(
        ArraySpec((8, 8192), (8, 2048), "float32"), a, workers=1, threads_per_worker=2,
        memory_limit_bytes=8 * GiB,
    )  # fmt: skip
    assert skinny.bound_by == "decode"


def test_dry_run_prints_device_memory_and_bound_by(tmp_path: Path) -> None:
    for name in "ab":  # metadata only: no chunk is written
        zarr.create_array(
            tmp_path / f"{name}.zarr", shape=(131072, 131072), chunks=(4096, 4096), dtype="float32"
        )
    args = [str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), str(tmp_path / "c.zarr")]
    tiles = {}
    for limit in ("80GiB", "6GiB"):
        done = run_cli(
            "multiply", *args, "--dry-run", "--backend", "cuda", "--device-memory-limit", limit
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[-1].startswith("bound by: ")
        (memory,) = [x for x in lines if x.startswith("memory per task")]
        assert f"device of {limit[:-3]}.0 GiB" in memory
        (tile_line,) = [x for x in lines if x.startswith("tiles")]
        tiles[limit] = int(tile_line.split()[1])
    cpu = run_cli("multiply", *args, "--dry-run", "--backend", "cpu")
    cpu_tiles = int([x for x in cpu.stdout.splitlines() if x.startswith("tiles")][0].split()[1])
    assert tiles["80GiB"] < cpu_tiles and tiles["6GiB"] > tiles["80GiB"]
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.parametrize(
    ("chunks", "slow"),
    [
        ((2048, 2048), True),  # 16 MiB frames: a handful per panel, far below the peak
        ((128, 128), False),  # 64 KiB frames, as nvCOMP's figures assume: the peak
    ],
)
def test_gpu_decode_rate_follows_the_frames_per_panel(chunks: tuple[int, int], slow: bool) -> None:
    """--gpu-decode: a panel's chunks are its frames, each decoded by one thread block at
    FRAME_DECODE_BYTES_PER_SECOND; the plan's kernel time holds the inputs' bytes at that rate,
    capped by the device's peak (50 GB/s assumed), which the plan keeps."""
    from kernels.constants import FRAME_DECODE_BYTES_PER_SECOND
    from pipeline.plan.gpu_candidate import panel_decode_rate, with_device

    a = ArraySpec((8192, 8192), chunks, "float32")
    plan = plan_matmul(
        a, a, workers=1, threads_per_worker=1, memory_limit_bytes=16 * GiB, backend="cuda",
        device=replace(H100, decodes_chunks=True), decode_threads=2,
    )  # fmt: skip
    tm, tn = plan.tile_shape
    width = plan.panel_width
    a_frames = -(-tm // chunks[0]) * -(-width // chunks[1])
    b_frames = -(-width // chunks[0]) * -(-tn // chunks[1])
    rates = [min(50e9, f * FRAME_DECODE_BYTES_PER_SECOND) for f in (a_frames, b_frames)]
    want = (tm * width + width * tn) / (tm * width / rates[0] + width * tn / rates[1])
    assert panel_decode_rate(plan, plan.device) == pytest.approx(want, rel=1e-12)
    assert plan.device.decode_bytes_per_second == 50e9  # the peak, kept
    # The same tiles timed with and without decoding on the device: the kernel's time grows
    # by the inputs' bytes at the panels' rate.
    on, off = (with_device(plan, replace(H100, decodes_chunks=d), 1.0, 2) for d in (True, False))
    kernel = [dict(p.resource_seconds)["kernel"] for p in (on, off)]
    assert kernel[0] - kernel[1] == pytest.approx(plan.read_bytes / want, rel=1e-9)
    assert (want < 10e9) if slow else (want == 50e9)

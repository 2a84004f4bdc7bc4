"""The GPU side of the plan (pure): a device's memory and rates, and the modelled seconds each
resource — storage, host decode, host→device copies, the kernel, the output write — spends
on a plan. The stages overlap in the staged engine, so the busiest resource bounds the run.

The device classes below are planning defaults, not measurements of ours: they come from the
vendor's figures (NVIDIA's datasheets: peak FP32 and FP64 rates without tensor cores, memory;
pinned host→device copies at about 80 % of the PCIe link: Gen5 ≈ 50 GB/s, Gen4 ≈ 25 GB/s). A
live job replaces them with a calibration on its workers, a dry run with a device record that
`doctor` saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kernels.exact import panel_dtype
from kernels.memory.buffers import group_bytes
from pipeline.plan.costs import CostModel

DECODE_BYTES_PER_SECOND = 0.6e9
"""Host zstd decode (and encode) of one thread, in bytes/s (numcodecs, measured here)."""
DEVICE_DECODE_BYTES_PER_SECOND = 50e9
"""zstd decoded on the device (nvCOMP), in decoded bytes/s: an assumption, never measured here
(no GPU); the emulated device's default is the same."""
DEVICE_SLOTS = 2
"""Panel pairs resident on the device: one being copied in while the other is multiplied."""
STAGED_PANELS = 1
"""Panel pairs decoded ahead of the one on its way to the device, in pinned host memory, per
task (the engine's depth). A staging buffer comes back as soon as its fast copy is done, so
one ahead keeps the decode threads busy; a second buys nothing warm and slows a cold job
measurably (its fresh pinned pages)."""


GiB = 2**30
TiB = 2**40


@dataclass(frozen=True)
class ReferenceServer:
    """A server a device class ships in, as its vendor describes it."""

    name: str
    memory_bytes: int
    """Its host memory, in bytes."""
    gpus: int

    @property
    def memory_per_gpu_bytes(self) -> int:
        """Host memory per GPU (one worker per GPU), in bytes."""
        return self.memory_bytes // self.gpus

    def __str__(self) -> str:
        memory = self.memory_bytes / (TiB if self.memory_bytes >= TiB else GiB)
        unit = "TiB" if self.memory_bytes >= TiB else "GiB"
        return f"{self.name}: {memory:g} {unit} for {self.gpus} GPU(s)"


@dataclass(frozen=True)
class DeviceModel:
    """One worker's GPU, as the planner sees it."""

    name: str
    memory_bytes: int
    """Device memory a worker's tasks may use, in bytes."""
    float32_flops: float
    """Peak float32 rate, in flop/s; a backend reaches its ``flops_fraction`` of it."""
    float64_flops: float
    """Peak float64 rate, in flop/s."""
    h2d_bytes_per_second: float
    """Host→device copy rate from pinned memory (device→host taken as the same)."""
    source: str
    """Where the figures come from: VENDOR ("defaults"), "calibrated", "saved DATE" (a record
    `doctor` saved) or "emulated"."""
    decode_bytes_per_second: float = DEVICE_DECODE_BYTES_PER_SECOND
    """Decoded bytes per second of zstd decoding on the device (nvCOMP)."""
    decodes_chunks: bool = False
    """--gpu-decode: the inputs' zstd chunks are copied compressed and decoded here."""
    host_cores: int | None = None
    """CPU cores per GPU in the servers this class usually ships in (the vendor's reference
    designs): the host threads decoding panels in a plan for a cluster not at hand."""
    server: ReferenceServer | None = None
    """A reference server of this class: its host memory per GPU is each worker's memory
    limit in a plan for a cluster not at hand, unless --memory-limit gives one."""

    def flops(self, dtype: str) -> float:
        return self.float64_flops if np.dtype(dtype).itemsize >= 8 else self.float32_flops


VENDOR = "defaults"
"""A DeviceModel's ``source`` when its figures are the vendor's (its share of the peak assumed)."""


# Host memory per GPU, from the vendor's own systems (DIMMs of 2^30 bytes: "2 TB" is 2 TiB):
# the DGX datasheets (DGX H100 and DGX H200: 2 TB, 32 DIMMs of 64 GB; DGX A100 640GB: 2 TB;
# DGX A100 320GB: 1 TB) and, for the PCIe cards no DGX holds, the servers of NVIDIA's own
# MLPerf Inference submissions (mlcommons/inference_results_v3.1 and _v4.0,
# closed/NVIDIA/systems/*.json: host_memory_capacity, host_memory_configuration).
DGX_H100 = ReferenceServer("NVIDIA DGX H100", 2 * TiB, 8)
DGX_H200 = ReferenceServer("NVIDIA DGX H200", 2 * TiB, 8)
DGX_A100_640GB = ReferenceServer("NVIDIA DGX A100 640GB", 2 * TiB, 8)
DGX_A100_320GB = ReferenceServer("NVIDIA DGX A100 320GB", TiB, 8)
MLPERF_H100_PCIE = ReferenceServer("NVIDIA's MLPerf v3.1 Gigabyte G482-Z54", 2 * TiB, 8)
MLPERF_L40S = ReferenceServer("NVIDIA's MLPerf v4.0 ASRock Rack 4U8G-ROME2", TiB, 8)
MLPERF_L4 = ReferenceServer("NVIDIA's MLPerf v3.1 ASRock Rack 1U1G-MILAN", 256 * GiB, 1)

DEVICE_CLASSES = {
    "h100-sxm": DeviceModel(
        "H100-SXM", 80 * GiB, 67e12, 34e12, 50e9, VENDOR, host_cores=14, server=DGX_H100
    ),
    "h100-pcie": DeviceModel(
        "H100-PCIe", 80 * GiB, 51e12, 26e12, 50e9, VENDOR, host_cores=8, server=MLPERF_H100_PCIE
    ),
    "h200": DeviceModel(
        "H200-SXM", 141 * GiB, 67e12, 34e12, 50e9, VENDOR, host_cores=14, server=DGX_H200
    ),
    "a100-80gb": DeviceModel(
        "A100-80GB", 80 * GiB, 19.5e12, 9.7e12, 25e9, VENDOR, host_cores=16, server=DGX_A100_640GB
    ),
    "a100-40gb": DeviceModel(
        "A100-40GB", 40 * GiB, 19.5e12, 9.7e12, 25e9, VENDOR, host_cores=16, server=DGX_A100_320GB
    ),
    "l40s": DeviceModel(
        "L40S", 48 * GiB, 91.6e12, 1.4e12, 25e9, VENDOR, host_cores=8, server=MLPERF_L40S
    ),
    "l4": DeviceModel("L4", 24 * GiB, 30e12, 0.5e12, 25e9, VENDOR, host_cores=4, server=MLPERF_L4),
}
"""Named device classes for plans made with no device at hand (--dry-run)."""


@dataclass(frozen=True)
class GpuWork:
    """A plan's work for one worker (one GPU), in bytes and flops."""

    read_bytes: float
    """Stored input bytes read and decoded."""
    copy_bytes: float
    """Panel bytes copied host→device, plus the result copied back."""
    flops: float
    write_bytes: float
    """Output bytes encoded and written."""
    read_chunks: float = 0.0
    """Stored input chunks fetched and decoded (each pays a fixed cost: plan.costs)."""
    decoded_bytes: float = 0.0
    """Their bytes decoded, whole chunks (0: ``read_bytes``)."""
    write_chunks: float = 0.0
    """OUT's chunks encoded and written."""


def resource_seconds(
    work: GpuWork,
    device: DeviceModel,
    flops_fraction: float,
    compute_dtype: str,
    decode_threads: int,
    costs: CostModel,
) -> dict[str, float]:
    """Modelled busy seconds of each resource of one worker (``costs``: the host's per-chunk
    and per-byte costs of storage, decode and write)."""
    kernel = work.flops / (device.flops(compute_dtype) * flops_fraction)
    if device.decodes_chunks:  # the host only reads; decoding shares the device with the gemms
        kernel += work.read_bytes / device.decode_bytes_per_second
    threads = max(decode_threads, 1)
    decoded = work.decoded_bytes or work.read_bytes
    fetched = costs.read.seconds(work.read_chunks, decoded)
    stored = costs.encode.seconds(work.write_chunks, work.write_bytes)
    stored += costs.write.seconds(work.write_chunks, work.write_bytes)
    return {
        "storage": fetched / threads,
        "decode": 0.0
        if device.decodes_chunks
        else costs.decode.seconds(work.read_chunks, decoded) / threads,
        "host-to-device": work.copy_bytes / device.h2d_bytes_per_second,
        "kernel": kernel,
        "write": stored / threads,
    }


def gpu_task_bytes(
    *,
    tile_shape: tuple[int, int],
    panel_width: int,
    dtypes: tuple[str, str, str, str],
    band_rows: int,
) -> tuple[int, int]:
    """Host (pinned staging) and device bytes of one staged GPU tile task.

    Host: STAGED_PANELS + 1 panel pairs decoded in the stored dtype and, when it differs, cast to
    the compute dtype; for the last panel the engine's two band buffers, the copies handed to
    the writer (one being written, one being made) and the cast for writing. The accumulator
    lives on the device. Device: the accumulator and DEVICE_SLOTS panel pairs.
    """
    tm, tn = tile_shape
    a_dtype, b_dtype, compute, out = (np.dtype(d) for d in dtypes)
    panel = np.dtype(panel_dtype(a_dtype, b_dtype, compute))  # integers: an exact float
    c, p = compute.itemsize, panel.itemsize
    a_item = a_dtype.itemsize + (p if a_dtype != panel else 0)
    b_item = b_dtype.itemsize + (p if b_dtype != panel else 0)
    staged = (STAGED_PANELS + 1) * (tm * a_item + tn * b_item) * panel_width  # + the one copying
    band = band_rows * tn * (4 * c + out.itemsize)
    device = tm * tn * c + DEVICE_SLOTS * (tm + tn) * panel_width * p
    if panel != compute:  # the exact route's float block and gathered A block (at most float64)
        device += (tm * tn + tm * panel_width) * 8
    return staged + band, device


def staging_pool_bytes(
    *,
    tile_shape: tuple[int, int],
    panel_width: int,
    compute_dtype: str,
    band_rows: int,
    tasks: int,
    panel_dtype: str = "",
) -> int:
    """The budget of a worker's pinned staging pool: what its ``tasks`` staged engines lease at
    most at once, each STAGED_PANELS + 1 panel pairs in the panels' dtype (empty: the compute
    dtype) and the last panel's two band buffers in the compute dtype, sized as the pool
    sizes its leases."""
    tm, tn = tile_shape
    read = panel_dtype or compute_dtype
    pair = group_bytes([((tm, panel_width), read), ((panel_width, tn), read)])
    bands = group_bytes([((band_rows, tn), compute_dtype)] * 2)
    return tasks * ((STAGED_PANELS + 1) * pair + bands)


def makespan(seconds: dict[str, float], fill_seconds: float) -> float:
    """Overlapped stages: the busiest resource, plus filling and draining the pipeline."""
    return max(seconds.values(), default=0.0) + fill_seconds


def default_decode_threads(cores: int, workers: int) -> int:
    """Host cores per GPU worker decode panels (one worker per GPU on a box)."""
    return max(math.floor(cores / max(workers, 1)), 1)

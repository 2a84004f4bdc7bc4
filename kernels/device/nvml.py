"""What NVML says of each GPU that CUDA does not: MIG mode and the CPUs near it (the doctor's
devices check). Read through ``pynvml`` (the nvidia-ml-py wheel); nothing here makes a CUDA
context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CPU_MASK_WORDS = 16
"""64-bit words of the CPU affinity mask asked for: 1024 CPUs."""


@dataclass(frozen=True)
class GpuFacts:
    index: int
    mig: bool | None
    """MIG mode now on; None where the GPU has no MIG (NVML: not supported)."""
    cpus: tuple[int, ...]
    """The CPUs NVML pins work for this GPU to (its NUMA node); empty when NVML cannot say."""


def cpu_list(words: Any) -> tuple[int, ...]:
    """The CPU numbers set in NVML's affinity mask (64-bit words, CPU 0 the lowest bit)."""
    return tuple(64 * w + b for w, word in enumerate(words) for b in range(64) if word >> b & 1)


def cpu_ranges(cpus: tuple[int, ...]) -> str:
    """'0-15,32-47' for those CPUs; 'unknown' for none."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "unknown"


def gpu_facts(nvml: Any = None) -> list[GpuFacts]:
    """Each GPU's facts; raises ``nvml.NVMLError`` when NVML itself cannot start."""
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    try:
        return [_facts(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()


def _facts(nvml: Any, index: int) -> GpuFacts:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        mig: bool | None = current == nvml.NVML_DEVICE_MIG_ENABLE
    except nvml.NVMLError:  # NotSupported: a GPU without MIG
        mig = None
    try:
        cpus = cpu_list(nvml.nvmlDeviceGetCpuAffinity(handle, CPU_MASK_WORDS))
    except nvml.NVMLError:
        cpus = ()
    return GpuFacts(index, mig, cpus)


def describe(facts: list[GpuFacts]) -> tuple[str, str]:
    """(one line per GPU joined by '; ', the fix when a GPU is in MIG mode or '')."""
    shown = []
    for f in facts:
        mig = "no MIG" if f.mig is None else f"MIG {'on' if f.mig else 'off'}"
        shown.append(f"GPU {f.index}: {mig}, CPUs {cpu_ranges(f.cpus)}")
    fix = ""
    if any(f.mig for f in facts):
        # CUDA shows a MIG GPU only as its instances, each named by UUID (nvidia-smi -L).
        fix = (
            "MIG on: set CUDA_VISIBLE_DEVICES to MIG instance UUIDs (nvidia-smi -L), one per worker"
        )
    return "; ".join(shown), fix

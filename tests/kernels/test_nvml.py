"""The doctor's NVML facts (kernels.device.nvml, kernels.device.doctor_probe.nvml_facts) from a fake
pynvml: MIG mode, CPU affinity, GPUs without MIG, and NVML missing altogether."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kernels.device import doctor_probe as probe
from kernels.device.nvml import GpuFacts, cpu_list, cpu_ranges, describe, gpu_facts


class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[dict[str, Any]], init_error: bool = False) -> Any:
    """A pynvml stand-in: each GPU a dict with "mig" ([current, pending] or None: not
    supported) and "mask" (the affinity words, or None: NVML cannot say)."""
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error:
            raise NVMLError("Driver Not Loaded")

    def answer(value: Any) -> Any:
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def affinity(handle: int, words: int) -> Any:
        mask = answer(gpus[handle]["mask"])
        return [*mask, *[0] * (words - len(mask))]

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_DEVICE_MIG_ENABLE=1, calls=calls,
        nvmlInit=init, nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(gpus), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMigMode=lambda h: answer(gpus[h]["mig"]), nvmlDeviceGetCpuAffinity=affinity,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("words", "cpus", "shown"),
    [
        ([0xFFFF], tuple(range(16)), "0-15"),  # one socket of 16
        ([0xFFFF0000FFFF], (*range(16), *range(32, 48)), "0-15,32-47"),  # hyperthreads
        ([0, 0b101], (64, 66), "64,66"),  # the second word
        ([0], (), "unknown"),
    ],
)
def test_cpu_masks(words: list[int], cpus: tuple[int, ...], shown: str) -> None:
    assert cpu_list(words) == cpus and cpu_ranges(cpus) == shown


def test_two_gpus_one_in_mig_mode() -> None:
    nvml = fake_nvml([{"mig": [1, 1], "mask": [0xFF]}, {"mig": None, "mask": None}])
    facts = gpu_facts(nvml)
    assert facts == [GpuFacts(0, True, tuple(range(8))), GpuFacts(1, None, ())]
    assert nvml.calls == ["init", "shutdown"]
    detail, fix = describe(facts)
    assert detail == "GPU 0: MIG on, CPUs 0-7; GPU 1: no MIG, CPUs unknown"
    assert "CUDA_VISIBLE_DEVICES" in fix and "MIG" in fix


def test_the_probe_reports_nvml_or_why_not() -> None:
    ok = fake_nvml([{"mig": [0, 0], "mask": [0xF0]}])
    assert probe.nvml_facts(ok) == ("GPU 0: MIG off, CPUs 4-7", "")
    detail, fix = probe.nvml_facts(fake_nvml([], init_error=True))
    assert detail.startswith("NVML unavailable (NVMLError: Driver Not Loaded)") and fix == ""

"""The doctor's nvCOMP round trip (kernels.device.doctor_probe.nvcomp_round_trip) in the simulator
with the fake nvCOMP module: pass, wrong bytes, a failing decode, nvCOMP missing."""

from __future__ import annotations

import sys
from typing import Any

import numcodecs
import numpy as np
import pytest

from kernels.cuda import host as cuda_host
from kernels.device import doctor_probe as probe
from tests.kernels.test_decode_nvcomp import install

pytestmark = [
    pytest.mark.skipif(not cuda_host.cuda_available(), reason="needs NUMBA_ENABLE_CUDASIM=1"),
    pytest.mark.filterwarnings("ignore:Grid size .* under-utilization"),
]
SHAPE = (20, 24)  # two blocks of the place kernel across, two down


def test_round_trip_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install(monkeypatch)
    found = probe.nvcomp_round_trip(SHAPE)
    assert found["status"] == "pass", found
    assert len(calls.decodes) == 1 and calls.decodes[0]["n"] == 1  # decoded by the fake nvCOMP


def test_wrong_bytes_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    real = numcodecs.Zstd.decode

    def off_by_one(self: Any, buf: Any, out: Any = None) -> Any:
        decoded = np.frombuffer(real(self, buf, out), np.float32).copy()
        decoded[3] += 1
        return decoded.view(np.uint8)

    monkeypatch.setattr(numcodecs.Zstd, "decode", off_by_one)  # the fake decodes with it
    found = probe.nvcomp_round_trip(SHAPE)
    assert found["status"] == "fail" and "1 of 480 elements differ" in found["detail"], found


def test_a_failing_decode_fails_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, corrupt=True)
    found = probe.nvcomp_round_trip(SHAPE)
    assert found["status"] == "fail" and "illegal memory access" in found["detail"], found
    assert "--gpu-decode" in found["fix"]


def test_skipped_without_nvcomp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", None)  # import raises ImportError
    found = probe.nvcomp_round_trip(SHAPE)
    assert found["status"] == "skip" and "not installed" in found["detail"]

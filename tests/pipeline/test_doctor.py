"""`python -m pipeline doctor`: CPU checks here, every GPU check skipped without a driver
(exit 0), exit 1 on a failure where a driver exists or under --require-gpu, --json records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.doctor import checks as doctor
from pipeline.doctor.checks import Check, cuda_majors
from tests.helpers import run_cli

CPU_CHECKS = ["versions", "cuda-family", "toolkit", "cpu"]


def test_json_on_a_machine_without_a_gpu() -> None:
    done = run_cli("doctor", "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    assert all(set(r) == {"check", "status", "detail", "fix"} for r in records)
    names = [r["check"] for r in records]
    assert names == [*CPU_CHECKS, "driver", *doctor.GPU_CHECKS]
    status = {r["check"]: r["status"] for r in records}
    assert all(status[c] == "pass" for c in CPU_CHECKS), records
    assert all(status[c] == "skip" for c in ["driver", *doctor.GPU_CHECKS])


def test_text_and_require_gpu() -> None:
    done = run_cli("doctor", timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("[pass] versions") and "[skip] driver" in done.stdout
    assert lines[-1] == "doctor: CPU path ready (--backend cpu). 0 failed."
    required = run_cli("doctor", "--require-gpu", timeout=120)
    assert required.returncode == 1
    assert "[fail] driver" in required.stdout and "fix: run on a GPU machine" in required.stdout


@pytest.mark.parametrize(
    ("driver", "probe", "require", "code"),
    [
        (None, None, False, 0),  # CPU only: GPU checks skipped
        ("580.95", [Check("devices", "pass", "H100")], False, 0),
        ("580.95", [Check("devices", "fail", "CUDA init failed: 999")], False, 1),
        (None, None, True, 1),  # --require-gpu without a GPU
    ],
)
def test_exit_codes(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    driver: str | None,
    probe: list[Check] | None,
    require: bool,
    code: int,
) -> None:
    monkeypatch.setattr(doctor, "find_driver", lambda: driver)
    monkeypatch.setattr(doctor, "gpu_probe", lambda: probe)
    monkeypatch.setattr(doctor, "cluster_check", lambda found: [])
    monkeypatch.setattr(doctor, "cpu_backend", lambda: Check("cpu", "pass", "stub"))
    assert doctor.run_doctor(False, require) == code
    capsys.readouterr()


def test_a_failed_cpu_check_on_a_cpu_only_machine_still_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "find_driver", lambda: None)
    monkeypatch.setattr(doctor, "cpu_backend", lambda: Check("cpu", "fail", "float64 1e-3", "x"))
    assert doctor.run_doctor(False, False) == 0  # the contract: 1 only where a GPU exists
    assert "[fail] cpu" in capsys.readouterr().out


def _versions(table: dict[str, str]) -> Any:
    return lambda name: table[name]


@pytest.mark.parametrize(
    ("installed", "majors"),
    [
        ({"cupy-cuda13x": "14.2", "nvidia-nvvm": "13.5.37", "cuda-bindings": "13.5.0"}, {13}),
        ({"cupy-cuda12x": "13.6", "cupy-cuda13x": "14.2"}, {12, 13}),  # two CuPy families
        ({"nvidia-cublas-cu12": "12.9", "nvidia-nvjitlink": "13.5.37"}, {12, 13}),
        ({"nvidia-ml-py": "13.615.71", "numpy": "2.4"}, set()),  # not CUDA libraries
    ],
)
def test_cuda_majors(installed: dict[str, str], majors: set[int]) -> None:
    assert set(cuda_majors(sorted(installed), _versions(installed)).values()) == majors


def test_the_toolkit_check_names_an_old_nvjitlink(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels.cuda import toolkit

    monkeypatch.setattr(toolkit, "nvvm_version", lambda: (13, 5))
    monkeypatch.setattr(toolkit, "nvjitlink_version", lambda: (13, 0))
    found = doctor.toolkit()
    assert found.status == "fail" and "nvidia-nvjitlink>=13.5" in found.fix


def test_the_gpu_probe_compares_our_kernels_with_numpy() -> None:
    """The probe's kernel check, in the simulator on a small odd shape."""
    from kernels.device import doctor_probe as probe

    found = probe.kernels_vs_numpy((9, 11, 7))
    assert found["status"] == "pass" and "float64" in found["detail"], found


def test_the_gpu_probe_fails_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels.cuda.host import CudaAccumulator
    from kernels.device import doctor_probe as probe

    real = CudaAccumulator.result
    monkeypatch.setattr(CudaAccumulator, "result", lambda self, rows=None: 2 * real(self, rows))
    found = probe.kernels_vs_numpy((9, 11, 7))
    assert found["status"] == "fail" and "> 1e-05" in found["detail"]

"""A GPU's saved figures: measured once per GPU, driver and kernels, then read; stale keys and
files others could write are ignored; the file is written whole, mode 0600."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from kernels.device import figures
from kernels.device.rates import Calibration, figures_for

KEY = {"gpu": "NVIDIA H100 PCIe", "cc": "9.0", "memory_bytes": 80 << 30, "driver_cuda": "13.0"}


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


class Measure:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, dtype: str) -> Calibration:
        self.calls.append(dtype)
        rate = 40e12 if dtype == "float32" else 20e12
        return Calibration(rate, 50e9, 48e9)


def test_measured_once_then_read_per_dtype() -> None:
    measure = Measure()
    first, source = figures_for(KEY, "float32", measure)
    assert source == "calibrated" and first["float32_flops"] == 40e12
    again, source = figures_for(KEY, "float32", measure)
    assert source.startswith("saved 20") and again == first
    both, _ = figures_for(KEY, "float64", measure)  # only the job's dtype is measured
    assert measure.calls == ["float32", "float64"]
    assert both["float32_flops"] == 40e12 and both["float64_flops"] == 20e12


def test_the_file_is_private_and_whole(cache_home: Path) -> None:
    figures_for(KEY, "float32", Measure())
    path = figures.store_path()
    assert path == cache_home / "tilegemm" / "devices.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (record,) = json.loads(path.read_text())["records"]
    assert record["key"] == KEY
    assert [p.name for p in path.parent.iterdir()] == ["devices.json"]  # no temporary left


@pytest.mark.parametrize(
    "change",
    [{"driver_cuda": "13.1"}, {"kernels": "another-source"}, {"memory_bytes": 40 << 30}],
)
def test_a_stale_record_is_measured_again_and_replaced(change: dict[str, object]) -> None:
    measure = Measure()
    figures_for(KEY, "float32", measure)
    _, source = figures_for({**KEY, **change}, "float32", measure)
    assert source == "calibrated" and len(measure.calls) == 2
    assert len(figures.load_records()) == 1  # one record per GPU: the stale one is gone


def test_a_file_others_can_write_is_not_trusted() -> None:
    figures_for(KEY, "float32", Measure())
    figures.store_path().chmod(0o622)
    measure = Measure()
    _, source = figures_for(KEY, "float32", measure)
    assert source == "calibrated" and measure.calls == ["float32"]


def test_a_broken_file_reads_as_empty() -> None:
    path = figures.store_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    path.chmod(0o600)
    assert figures.load_records() == [] and figures.lookup(KEY) is None

"""The workers' GPU figures: asked for the job's dtype only, computed off the worker's event
loop (compiling and calibrating take seconds), and the unmeasured dtype's rate derived."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Client, LocalCluster

from pipeline.facts import devices

CALLS: list[tuple[str, bool, str]] = []


def fake_figures(dtype: str) -> dict[str, Any]:
    try:
        asyncio.get_running_loop()
        on_loop = True
    except RuntimeError:
        on_loop = False
    CALLS.append((dtype, on_loop, threading.current_thread().name))
    return {
        "name": "NVIDIA H100 PCIe",
        "memory_bytes": 79 << 30,
        f"{dtype}_flops": 40e12,
        "h2d_bytes_per_second": 50e9,
        "source": "saved 2026-11-25",
    }


@pytest.fixture
def in_process_client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def test_figures_come_off_the_event_loop_for_the_jobs_dtype(
    in_process_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "worker_device_figures", fake_figures)
    CALLS.clear()
    model = devices.calibrated_device(in_process_client, "float64")
    assert model is not None
    ((dtype, on_loop, _),) = CALLS
    assert dtype == "float64" and on_loop is False
    assert model.float64_flops == 40e12
    assert model.float32_flops == pytest.approx(40e12 * 51 / 26)  # h100-pcie's ratio
    assert model.source == "saved 2026-11-25"


def test_no_gpu_no_model(in_process_client: Client) -> None:
    assert devices.calibrated_device(in_process_client, "float32") is None  # the simulator

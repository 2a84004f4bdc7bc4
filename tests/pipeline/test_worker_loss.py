"""A worker process killed (SIGKILL) mid-job: the job completes, with the same bytes.

Two worker processes under nannies on loopback. The job runs through the Python API in a
thread; once a worker is busy with the job, its process is killed. distributed reschedules
what it was running and recomputes what it held (default allowed-failures), the nanny starts
a new worker process, and whole-chunk writes make a rerun tile harmless: OUT must equal, byte
for byte, the output of the same job without the kill (same plan, same summation order).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.generate import write_random
from pipeline.store.record import of_array
from tests.helpers import assert_product

JOB_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def two_workers() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            memory_limit="2GiB",
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def chunk_bytes(out: Path) -> dict[str, bytes]:
    """Every stored chunk of OUT by its key (zarr v3: c/I/J)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in (out / "c").rglob("*") if p.is_file()}


def busy_worker(client: Client, thread: threading.Thread, held: str) -> str:
    """A worker running one of the job's tasks and holding a result whose key starts with
    `held` (whose loss forces a recomputation); waits for one while the job runs."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        assert thread.is_alive(), "the job ended before a worker could be killed mid-job"
        processing, memory = client.processing(), client.has_what()
        for address, keys in processing.items():
            running = any(str(k).startswith("matmul-") for k in keys)
            if running and any(str(k).startswith(held) for k in memory.get(address, ())):
                return str(address)
        time.sleep(0.01)
    raise TimeoutError("no worker got busy with the job")


@pytest.mark.parametrize(
    ("m", "k", "n", "a_chunks", "b_chunks", "budget", "held"),
    [
        # many small tiles; the killed worker is running one and holds finished ones
        pytest.param(2048, 2048, 2048, (256, 256), (256, 256), "266MiB", "matmul-tile", id="tiles"),
        # one 512x512 tile in 8 split-K groups: the killed worker holds a partial sum
        pytest.param(512, 131072, 512, (512, 4096), (4096, 512), None, "matmul-", id="split-k"),
    ],
)
def test_killed_worker_does_not_fail_the_job(
    two_workers: Client,
    tmp_path: Path,
    m: int,
    k: int,
    n: int,
    a_chunks: tuple[int, int],
    b_chunks: tuple[int, int],
    budget: str | None,
    held: str,
) -> None:
    client = two_workers
    client.wait_for_workers(2, timeout=60)
    a_url, b_url = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    write_random(a_url, (m, k), a_chunks, "float32", seed=1)
    write_random(b_url, (k, n), b_chunks, "float32", seed=2)
    reference = multiply(
        a_url, b_url, str(tmp_path / "ref.zarr"), client=client, memory_limit=budget
    )
    assert (reference.plan.n_tiles >= 8) if held == "matmul-tile" else reference.plan.split_k > 1

    out = tmp_path / "c.zarr"
    box: dict[str, Any] = {}

    def job() -> None:
        try:
            box["result"] = multiply(a_url, b_url, str(out), client=client, memory_limit=budget)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            box["error"] = e

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    victim = busy_worker(client, thread, held)
    pid = client.run(os.getpid, workers=[victim])[victim]
    journaled = len(list((out / "journal").glob("*.json")))
    os.kill(pid, signal.SIGKILL)
    assert journaled < reference.plan.n_tiles, "the kill came after the last tile"

    thread.join(timeout=JOB_TIMEOUT_S)
    assert not thread.is_alive(), "the job did not finish after the worker was killed"
    assert "error" not in box, f"the job failed: {box.get('error')!r}"
    result = box["result"]
    assert result.tiles_computed == reference.plan.n_tiles
    assert of_array(zarr.open_array(str(out), mode="r")).complete is True

    # The worker really died, mid-job: the scheduler lost work (running or held) with it...
    removed = [e for _, e in client.get_events(victim) if e.get("action") == "remove-worker"]
    assert removed, "the scheduler never saw the killed worker go"
    lost = [*removed[-1]["processing-tasks"], *removed[-1]["lost-computed-tasks"]]
    assert any(str(key).startswith("matmul-") for key in lost), "the kill cost the job nothing"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # ... and the nanny replaced it with a new process.
    client.wait_for_workers(2, timeout=60)
    assert pid not in client.run(os.getpid).values()

    assert chunk_bytes(out) == chunk_bytes(tmp_path / "ref.zarr"), "not byte-identical"
    a, b = zarr.open_array(a_url, mode="r")[:], zarr.open_array(b_url, mode="r")[:]
    assert_product(zarr.open_array(str(out), mode="r")[:], np.asarray(a), np.asarray(b))

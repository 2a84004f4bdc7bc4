"""The writer's lock: a live job's lock refuses a second writer; a dead job's is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import zarr
from distributed import Client

from pipeline import multiply
from pipeline.errors import UnsafeOutputError
from tests.helpers import assert_product, random_matrix, write_array


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    a, b = random_matrix(rng, (30, 20), "float32"), random_matrix(rng, (20, 25), "float32")
    return (
        write_array(tmp_path / "a.zarr", a, (10, 10)),
        write_array(tmp_path / "b.zarr", b, (10, 10)),
        a,
        b,
    )


def write_lock(out: Path, pid: int, host: str, process_started: float) -> None:
    lock = {"pid": pid, "host": host, "started": time.time(), "process_started": process_started}
    (out / "lock.json").write_text(json.dumps(lock))


def test_live_lock_refuses_second_writer(tmp_path: Path, client: Client, inputs: tuple) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    assert not (out / "lock.json").exists(), "the lock must be released after a job"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(out, holder.pid, socket.gethostname(), psutil.Process(holder.pid).create_time())
        before = zarr.open_array(str(out))[:]
        for flags in ({"overwrite": True}, {"resume": True}):
            with pytest.raises(UnsafeOutputError, match=rf"another job \(pid {holder.pid} on"):
                multiply(a_url, b_url, str(out), client=client, **flags)
        np.testing.assert_array_equal(zarr.open_array(str(out))[:], before)
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_is_taken_over(tmp_path: Path, client: Client, inputs: tuple) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(out, dead.pid, socket.gethostname(), 0.0)
    result = multiply(a_url, b_url, str(out), client=client, resume=True)
    assert result.tiles_skipped == result.plan.n_tiles
    assert not (out / "lock.json").exists()
    assert_product(zarr.open_array(str(out))[:], a, b)


def test_lock_from_another_host_is_refused(tmp_path: Path, client: Client, inputs: tuple) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    write_lock(out, os.getpid(), "some-other-host", 0.0)
    with pytest.raises(UnsafeOutputError, match="another host.*delete .*lock.json"):
        multiply(a_url, b_url, str(out), client=client, overwrite=True)

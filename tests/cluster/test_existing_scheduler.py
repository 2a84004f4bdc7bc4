"""`--scheduler ADDRESS` and `--scheduler-file PATH`: the CLI joins a running `dask scheduler`
and never shuts it down."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client

from cluster.lifecycle import scheduler_address, start
from cluster.spec import ClusterSpec
from pipeline.api import prepare
from pipeline.errors import ClusterError, UsageError
from tests.cluster.processes import QUIET_HTTP, START_TIMEOUT_S, env, read_address, spawn, stop
from tests.helpers import assert_product, random_matrix, write_array

CLI_TIMEOUT_S = 120


@dataclass
class RunningCluster:
    address: str
    processes: list[subprocess.Popen[bytes]]
    workers: int
    scheduler_file: Path


@pytest.fixture(scope="module")
def running_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    """`dask scheduler` + `dask worker --nworkers 2` on loopback, killed at teardown."""
    root = tmp_path_factory.mktemp("dask-cluster")
    scheduler_file = root / "scheduler.json"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(
            spawn(
                "distributed.cli.dask_scheduler",
                *("--host", "127.0.0.1", "--port", "0", *QUIET_HTTP),
                *("--scheduler-file", str(scheduler_file)),
                log=root / "scheduler.log",
            )
        )
        address = read_address(scheduler_file, processes[0])
        processes.append(
            spawn(
                "distributed.cli.dask_worker",
                *("--scheduler-file", str(scheduler_file), "--host", "127.0.0.1"),
                *("--nworkers", "2", "--nthreads", "1", "--memory-limit", "2GiB"),
                *(*QUIET_HTTP, "--death-timeout", "60"),
                log=root / "worker.log",
            )
        )
        with Client(address, timeout=START_TIMEOUT_S) as client:
            client.wait_for_workers(2, timeout=START_TIMEOUT_S)
        yield RunningCluster(address, processes, workers=2, scheduler_file=scheduler_file)
    finally:
        for process in reversed(processes):
            stop(process)


def run_cli(*args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
        check=False,
    )


def _assert_alive(cluster: RunningCluster) -> None:
    for process in cluster.processes:
        assert process.poll() is None, f"{process.args!r} exited with {process.returncode}"
    with Client(cluster.address, timeout=20) as client:
        assert len(client.scheduler_info()["workers"]) == cluster.workers


def _inputs(tmp_path: Path, seed: int) -> tuple[np.ndarray, np.ndarray, str, str]:
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, (37, 29), "float32"), random_matrix(rng, (29, 23), "float64")
    a_url = write_array(tmp_path / "a.zarr", a, (10, 8))
    b_url = write_array(tmp_path / "b.zarr", b, (8, 9))
    return a, b, a_url, b_url


def test_multiply_on_a_running_cluster_leaves_it_running(
    running_cluster: RunningCluster, tmp_path: Path
) -> None:
    a, b, a_url, b_url = _inputs(tmp_path, seed=1)
    out = str(tmp_path / "c.zarr")
    cli = ("multiply", a_url, b_url, out, "--scheduler", running_cluster.address, "--no-progress")
    done = run_cli(*cli)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert_product(zarr.open_array(out, mode="r")[:], a, b)
    _assert_alive(running_cluster)

    # Same paths, new data of the same shape, same long-lived workers: the new product.
    a2, b2, _, _ = _inputs(tmp_path / "second", seed=2)
    zarr.open_array(a_url, mode="r+")[:] = a2
    zarr.open_array(b_url, mode="r+")[:] = b2
    again = run_cli(*cli, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert_product(zarr.open_array(out, mode="r")[:], a2, b2)
    _assert_alive(running_cluster)


def test_unreachable_scheduler_is_one_error_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (4, 3), "float32"), (2, 2))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (3, 5), "float32"), (2, 2))
    out = tmp_path / "c.zarr"
    started = time.monotonic()
    done = run_cli(
        *("multiply", a_url, b_url, str(out), "--scheduler", "tcp://127.0.0.1:1", "--no-progress"),
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "tcp://127.0.0.1:1" in errors[0]
    assert elapsed < 20, f"took {elapsed:.1f} s to give up"
    assert not out.exists(), "OUT was created although no cluster was reached"


def test_the_scheduler_file_names_the_running_scheduler(running_cluster: RunningCluster) -> None:
    """The file `dask scheduler --scheduler-file` wrote leads to that scheduler."""
    assert scheduler_address(str(running_cluster.scheduler_file)) == running_cluster.address
    with start(ClusterSpec(scheduler_file=str(running_cluster.scheduler_file))) as client:
        assert len(client.scheduler_info()["workers"]) == running_cluster.workers
    _assert_alive(running_cluster)


def test_a_scheduler_file_that_never_comes_is_one_error(tmp_path: Path) -> None:
    missing = tmp_path / "scheduler.json"
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"does not exist after 0\.3 s; start the scheduler"):
        scheduler_address(str(missing), wait_s=0.3)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"not json", "JSONDecodeError"), (b'{"id": 1}', "KeyError"), (b'{"address": 7}', "not text")],
)
def test_a_scheduler_file_without_an_address_is_refused(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "scheduler.json"
    path.write_bytes(content)
    with pytest.raises(ClusterError, match=f"holds no scheduler address.*{problem}"):
        scheduler_address(str(path), wait_s=0.2)


def test_a_fifo_or_a_huge_file_is_not_read_as_a_scheduler_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ClusterError, match="not a regular file"):
        scheduler_address(str(fifo), wait_s=0.2)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (1 << 20))
    with pytest.raises(ClusterError, match="more than"):
        scheduler_address(str(huge), wait_s=0.2)


def test_scheduler_and_scheduler_file_exclude_each_other() -> None:
    with pytest.raises(UsageError, match="give one of them"):
        ClusterSpec(scheduler="tcp://127.0.0.1:8786", scheduler_file="scheduler.json")


def test_multiply_through_the_scheduler_file(
    running_cluster: RunningCluster, tmp_path: Path
) -> None:
    a, b, a_url, b_url = _inputs(tmp_path, seed=4)
    out = str(tmp_path / "c.zarr")
    path = str(running_cluster.scheduler_file)
    done = run_cli("multiply", a_url, b_url, out, "--scheduler-file", path, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert_product(zarr.open_array(out, mode="r")[:], a, b)
    _assert_alive(running_cluster)


@pytest.mark.parametrize(("asked", "share"), [(0.5, 0.5), ("auto", 1.0), ("0.25", 0.25)])
def test_a_fraction_is_of_the_running_workers_limit(
    running_cluster: RunningCluster, tmp_path: Path, asked: object, share: float
) -> None:
    """On workers started with --memory-limit 2GiB, 0.5 plans for 1 GiB each, auto for 2."""
    _, _, a_url, b_url = _inputs(tmp_path, seed=5)
    job = prepare(a_url, b_url, str(tmp_path / "c.zarr"), memory_limit=asked)  # type: ignore[arg-type]
    with Client(running_cluster.address, timeout=20) as client:
        planned = job.for_cluster(client).plan.memory_limit_bytes
    assert planned == int(share * 2 * 2**30)

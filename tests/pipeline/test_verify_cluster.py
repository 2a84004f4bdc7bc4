"""Commands against a `dask scheduler` and `dask worker` started from another folder: relative
paths reach the workers as absolute ones, and an input a worker cannot read is exit 2 naming
the input and the worker (a job that failed is exit 1; this is bad input). Also what verify
shows of itself (its result's repr)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import VerifyResult, verify_product
from pipeline.errors import InputNotFoundError, InputUnreachableError, StoredObjectError
from pipeline.run.client import input_error
from pipeline.store import inputs
from pipeline.store.fs import absolute
from tests.cluster.processes import START_TIMEOUT_S, env, read_address, stop
from tests.helpers import file_modes_bind, run_cli

DASK = str(Path(sys.executable).parent / "dask")


@dataclass(frozen=True)
class Cluster:
    scheduler_file: Path
    separate: bool
    """The worker runs without root's override of file modes: a folder the client reads
    (mode 000) is one it cannot."""


def spawn(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """A dask CLI process in ``cwd``, in its own session so teardown ends its children too."""
    with log.open("wb") as out:
        return subprocess.Popen(
            args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env(), start_new_session=True
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One scheduler and one single-threaded worker, both working in a folder of their own;
    for root, the worker without CAP_DAC_OVERRIDE where setpriv allows."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    scheduler_file = elsewhere / "scheduler.json"
    prefix = file_modes_bind() if os.geteuid() == 0 else None
    http = ("--no-dashboard", "--dashboard-address", "127.0.0.1:0")
    processes = []
    try:
        processes.append(
            spawn(
                [DASK, "scheduler", "--scheduler-file", str(scheduler_file), "--port", "0"]
                + ["--host", "127.0.0.1", *http],
                elsewhere,
                elsewhere / "scheduler.log",
            )
        )
        address = read_address(scheduler_file, processes[0])
        processes.append(
            spawn(
                [*(prefix or ()), DASK, "worker", "--scheduler-file", str(scheduler_file)]
                + ["--nthreads", "1", "--host", "127.0.0.1", *http],
                elsewhere,
                elsewhere / "worker.log",
            )
        )
        with Client(address, timeout=START_TIMEOUT_S) as client:
            client.wait_for_workers(1, timeout=START_TIMEOUT_S)
        yield Cluster(scheduler_file, separate=bool(prefix))
    finally:
        for process in reversed(processes):
            stop(process)


def test_relative_paths(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on = ("--scheduler-file", str(cluster.scheduler_file))
    for args in (
        ["random", "a.zarr", "--shape", "300x200", "--chunks", "100x100"],
        ["random", "b.zarr", "--shape", "200x150", "--chunks", "100x100", "--seed", "1"],
        ["multiply", "a.zarr", "b.zarr", "c.zarr", "--no-progress", *on],
    ):
        done = run_cli(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    done = run_cli("verify", "a.zarr", "b.zarr", "c.zarr", *on, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("verify ok"), done.stdout
    monkeypatch.chdir(tmp_path)  # the Python API too
    with Client(scheduler_file=str(cluster.scheduler_file), timeout=START_TIMEOUT_S) as client:
        assert verify_product(client, "a.zarr", "b.zarr", "c.zarr").passed


UNREACHABLE = (
    r"error: a worker \(tcp://127\.0\.0\.1:\d+\) cannot read {name} \({url}\): permission "
    r"denied on {url}; the workers must see the same paths as this machine \(a shared file "
    r"system\), or use a URL they can reach{then}\n"
)


def test_an_input_the_worker_cannot_read(cluster: Cluster, tmp_path: Path) -> None:
    """The inputs in a folder only this process may enter: multiply, gram and verify exit 2
    naming the input and the worker."""
    if not cluster.separate:
        pytest.skip("needs root and setpriv: the worker must lack the client's access")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((60, 40)), rng.standard_normal((40, 30))
    locked, open_ = tmp_path / "locked", tmp_path / "open"
    open_.mkdir()
    for name, data in (("a", a), ("b", b)):
        zarr.create_array(str(locked / f"{name}.zarr"), data=data, chunks=(20, 20))
    zarr.create_array(str(open_ / "c.zarr"), data=a @ b, chunks=(20, 20))
    a_url, b_url = str(locked / "a.zarr"), str(locked / "b.zarr")
    on = ("--scheduler-file", str(cluster.scheduler_file), "--no-progress")
    locked.chmod(0)
    try:
        runs = [
            ("A", a_url, ", then rerun with --resume", ["multiply", a_url, b_url]),
            ("X", a_url, ", then rerun with --resume", ["gram", a_url]),
            ("A", a_url, "", ["verify", a_url, b_url, str(open_ / "c.zarr")]),
        ]
        for name, url, then, args in runs:
            out = [] if args[0] == "verify" else [str(open_ / f"{args[0]}.zarr")]
            done = run_cli(*args, *out, *on)
            line = UNREACHABLE.format(name=name, url=re.escape(url), then=re.escape(then))
            assert done.returncode == 2, done.stderr
            assert re.fullmatch(r"(.*\n)*" + line, done.stderr), done.stderr
    finally:
        locked.chmod(0o700)


def test_what_a_worker_reports_unreachable(tmp_path: Path, client: Client) -> None:
    """On a worker, a missing input or one without Zarr metadata is unreachable (exit 2, the
    worker named); an input refused for what it holds keeps its own error; and this machine
    says what it sees itself (the client maps a task's error with ``input_error``)."""
    (tmp_path / "empty.zarr").mkdir()
    (tmp_path / "fifo.zarr").mkdir()
    os.mkfifo(tmp_path / "fifo.zarr" / "zarr.json")
    workers = set(client.scheduler_info()["workers"])

    def on_worker(path: Path) -> BaseException | None:
        return client.submit(inputs.open_on_worker, str(path), None, "A", pure=False).exception()

    missing = on_worker(tmp_path / "gone.zarr")
    assert isinstance(missing, InputUnreachableError), missing
    assert (missing.reason, missing.name, missing.worker in workers) == (
        "it does not exist there",
        "A",
        True,
    )
    # gone from this machine too: removed during the job, not a worker's view
    gone = input_error(missing)
    assert isinstance(gone, InputNotFoundError) and not isinstance(gone, InputUnreachableError)
    assert str(gone).startswith(f"A ({tmp_path / 'gone.zarr'}) no longer exists on this machine")
    empty = on_worker(tmp_path / "empty.zarr")
    assert isinstance(empty, InputUnreachableError)
    assert empty.reason == "no Zarr array is there"
    assert input_error(empty) is empty  # this machine sees the folder: the worker's view
    fifo = on_worker(tmp_path / "fifo.zarr")
    assert isinstance(fifo, StoredObjectError) and input_error(fifo) is None
    with pytest.raises(InputNotFoundError) as here:  # not on a worker: this machine's own read
        inputs.open_on_worker(str(tmp_path / "gone.zarr"), None, "A")
    assert not isinstance(here.value, InputUnreachableError)


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        # a pass
        (
            {"passed": True, "worst_ratio": 0.173, "worst_row": 131},
            "<VerifyResult ok: worst residual/tolerance 0.173 at row 131, 2 round(s)>",
        ),
        # a failure in two row blocks, with a non-finite element C should not hold
        (
            {
                "passed": False, "worst_ratio": 1250.0, "worst_row": 50,
                "failing_row_blocks": ((0, 64), (64, 128)), "c_unexpected": 1,
            },
            "<VerifyResult FAILED in 2 row block(s): worst residual/tolerance 1.25e+03 at row 50, "
            "2 round(s); non-finite: A 0, B 0, C 1 unexpected, 0 missing>",
        ),
    ],
)  # fmt: skip
def test_verify_result_shows_itself_in_one_line(fields: dict[str, Any], shown: str) -> None:
    defaults = {"rounds": 2, "worst_row": -1, "failing_row_blocks": ()}
    result = VerifyResult(**(defaults | fields))
    assert repr(result) == shown


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("a.zarr", "{cwd}/a.zarr"),
        ("file://a.zarr", "{cwd}/a.zarr"),
        ("zip://A::a.zip", "zip://A::{cwd}/a.zip"),
        ("zip://::/d/a.zip", "zip://::/d/a.zip"),
        ("zip://A::s3://b/a.zip", "zip://A::s3://b/a.zip"),
        ("s3://b/a.zarr", "s3://b/a.zarr"),
    ],
)
def test_paths_sent_to_workers_are_absolute(url: str, expected: str) -> None:
    assert absolute(url) == expected.format(cwd=os.getcwd())

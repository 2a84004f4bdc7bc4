"""A scheduler address that leads to something other than a Dask scheduler is refused within
the connect timeout, exit 2, before OUT is created: a port that takes the connection and
never answers, a service that answers in another protocol, and a scheduler file that names
one."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import numpy as np
import pytest

from cluster.handshake import CONNECT_TIMEOUT_S, connect_timeout_s
from cluster.lifecycle import scheduler_address
from pipeline.errors import ClusterError
from tests.helpers import random_matrix, refused, run_cli, write_array

TIMEOUT = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "1s"}
"""The refusals below wait the whole connect timeout: 1 s here (10 s by default)."""


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (4, 3), "float32"), (2, 2))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (3, 4), "float32"), (2, 2))
    return a, b


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that completes TCP connections (the kernel's backlog) and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def http_port() -> Iterator[int]:
    """A port that answers whatever it is sent with an HTTP error, as a web server does."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at teardown
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.mark.parametrize("dry_run", [False, True], ids=["multiply", "dry-run"])
def test_a_port_that_never_answers_is_not_a_scheduler(
    tmp_path: Path, inputs: tuple[str, str], silent_port: int, dry_run: bool
) -> None:
    out = tmp_path / "c.zarr"
    address = f"tcp://127.0.0.1:{silent_port}"
    started = time.monotonic()
    done = run_cli(
        *("multiply", *inputs, str(out), "--scheduler", address, "--no-progress"),
        *(("--dry-run",) if dry_run else ()),
        env=TIMEOUT,
        timeout=60,
    )
    line = refused(done)
    assert f"{address} is not a Dask scheduler" in line
    assert "did not answer Dask's handshake in 1 s" in line
    assert time.monotonic() - started < 60
    assert not out.exists(), "OUT was created before the scheduler answered"


def test_a_scheduler_file_naming_a_web_server_is_refused(
    tmp_path: Path, inputs: tuple[str, str], http_port: int
) -> None:
    out = tmp_path / "c.zarr"
    scheduler_file = tmp_path / "scheduler.json"
    scheduler_file.write_text(f'{{"address": "tcp://127.0.0.1:{http_port}"}}')
    done = run_cli(
        *("multiply", *inputs, str(out), "--scheduler-file", str(scheduler_file)),
        "--no-progress",
        env=TIMEOUT,
        timeout=60,
    )
    line = refused(done)
    assert f"tcp://127.0.0.1:{http_port} is not a Dask scheduler" in line
    assert "another protocol" in line and "EiB" not in line
    assert not out.exists(), "OUT was created before the scheduler answered"


def test_the_wait_is_distributed_s_connect_timeout_when_set() -> None:
    assert connect_timeout_s() == CONNECT_TIMEOUT_S  # distributed's 30 s default is not ours
    with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):
        assert connect_timeout_s() == 3.0


def test_a_scheduler_file_nested_too_deep_is_no_address(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    path.write_text("[" * 30_000 + "]" * 30_000)  # within the 64 KiB a file may hold
    with pytest.raises(ClusterError, match="holds no scheduler address .*RecursionError"):
        scheduler_address(str(path), wait_s=0.2)

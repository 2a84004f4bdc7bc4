"""The Dask dashboard answers over HTTP while a `multiply` job runs, and shows our task prefixes."""

from __future__ import annotations

import html
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
from dask.utils import key_split

from tests.child_env import child_env
from tests.helpers import run_cli, write_array

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    """(HTTP status, body); status 0 when nothing answers yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def task_prefixes(base: str) -> set[str]:
    """Prefixes (as the task stream and progress bars group them) of the tasks the scheduler
    lists on its workers' pages: processing and in memory."""
    _, workers = get(f"{base}/info/main/workers.html")
    prefixes: set[str] = set()
    for link in sorted(set(re.findall(r'href="\.\./worker/([^"]+)\.html"', workers))):
        _, page = get(f"{base}/info/worker/{link}.html")
        keys = re.findall(r'href="\.\./task/[^"]+\.html">([^<]+)</a>', page)
        prefixes |= {key_split(html.unescape(k)) for k in keys}
    return prefixes


def test_dashboard_answers_while_a_job_runs(tmp_path: Path) -> None:
    # Integer products go through numpy's loops here (slow_integers), not BLAS: many seconds
    # of work from 8 MiB inputs, on one thread. The job is stopped as soon as the dashboard
    # has been seen.
    # int16 inputs into int64 (--dtype): int32 inputs could overflow any integer dtype.
    rng = np.random.default_rng(0)
    a = rng.integers(-5, 5, (2048, 1024), dtype=np.int16)
    b = rng.integers(-5, 5, (1024, 2048), dtype=np.int16)
    a_url = write_array(tmp_path / "a.zarr", a, (512, 512))
    b_url = write_array(tmp_path / "b.zarr", b, (512, 512))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    options = f"--dashboard-address 127.0.0.1:{port} --threads-per-worker 1 --no-progress"
    options += " --dtype int64"
    job = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "multiply", a_url, b_url, str(tmp_path / "c.zarr")]
        + options.split(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(slow_integers=True),
    )
    status, running = 0, False
    prefixes: set[str] = set()
    listeners: set[tuple[str, int]] = set()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while job.poll() is None and time.monotonic() < deadline:
            status = status if status == 200 else get(f"{base}/status")[0]
            if status == 200:
                prefixes |= task_prefixes(base)
                if "matmul-tile" in prefixes:
                    listeners = listening(job.pid)
                    break
            time.sleep(0.1)
        running = job.poll() is None
    finally:
        job.send_signal(signal.SIGTERM)
        try:
            _, stderr = job.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            job.kill()
            _, stderr = job.communicate()
    assert running, f"the job ended before the dashboard showed its tasks:\n{stderr}"
    assert status == 200, f"{base}/status never answered 200:\n{stderr}"
    assert "matmul-tile" in prefixes, f"task prefixes seen: {sorted(prefixes)}"
    assert f"dashboard: {base}/status" in stderr
    # during the job every socket it listens on is on loopback, the worker's HTTP server too
    assert ("127.0.0.1", port) in listeners
    assert {ip for ip, _ in listeners} == {"127.0.0.1"}, sorted(listeners)


def listening(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of every listening inet socket of process ``pid`` and its children."""
    process = psutil.Process(pid)
    return {
        (c.laddr.ip, c.laddr.port)
        for p in (process, *process.children(recursive=True))
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.mark.parametrize(
    ("address", "message"),
    [
        # not HOST:PORT: refused before anything runs, not once the cluster has started
        ("nonsense", "dashboard address 'nonsense' is not HOST:PORT"),
        ("127.0.0.1:70000", "a port from 0 to 65535"),
        # every interface: a local cluster listens on loopback only
        ("0.0.0.0:8787", "dashboard address '0.0.0.0:8787' is not on loopback"),
    ],
)
def test_bad_dashboard_address_is_refused_first(tmp_path: Path, address: str, message: str) -> None:
    # missing inputs: the error is the dashboard's, so nothing was opened or started first
    missing = [str(tmp_path / name) for name in ("a.zarr", "b.zarr", "c.zarr")]
    started = time.monotonic()
    done = run_cli("multiply", *missing, "--dashboard-address", address, "--no-progress")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert time.monotonic() - started < 30

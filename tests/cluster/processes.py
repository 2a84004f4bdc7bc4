"""`dask scheduler` and `dask worker` as test processes: spawned in a session of their own,
read back through a scheduler file, ended with their children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO

START_TIMEOUT_S = 60
QUIET_HTTP = ("--no-dashboard", "--dashboard-address", "127.0.0.1:0")
"""Without an address the HTTP servers (metrics, health) would listen on every interface."""


def env() -> dict[str, str]:
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), environ.get("PYTHONPATH")) if p)
    return environ


def spawn(module: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """A dask CLI process in its own session, so teardown can end it and its children."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env(),
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


def read_address(scheduler_file: Path, scheduler: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert scheduler.poll() is None, "dask scheduler exited during start-up"
        if scheduler_file.exists():
            try:
                return str(json.loads(scheduler_file.read_text())["address"])
            except (ValueError, KeyError):
                pass  # still being written
        time.sleep(0.1)
    raise TimeoutError(f"no scheduler file {scheduler_file} after {START_TIMEOUT_S} s")

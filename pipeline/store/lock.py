"""A writer's lock inside OUT, so two jobs never write the same output at once.

The lock is a small JSON file (owner pid, host, start time, a random token). A lock whose owner
is gone — same host, process not running — is stale: it is explained and taken over. A lock
from another host cannot be checked, so it is refused with the way to clear it by hand.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psutil

from pipeline.errors import UnsafeOutputError
from pipeline.store.fs import url_to_fs, write_bytes

log = logging.getLogger("pipeline")
LOCK_NAME = "lock.json"


def check_lock(url: str, storage_options: dict[str, Any] | None) -> None:
    """Refuse when a live job holds OUT's lock; log and ignore a stale one."""
    holder = read_lock(url, storage_options)
    if holder is None:
        return
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    who = f"pid {holder.get('pid')} on {holder.get('host')} since {started}"
    if holder.get("host") != socket.gethostname():
        raise UnsafeOutputError(
            f"OUT ({url}) is locked by a job ({who}) on another host, which can't be checked "
            f"from here; if that job is gone, delete {url.rstrip('/')}/{LOCK_NAME} and rerun"
        )
    if _alive(holder):
        raise UnsafeOutputError(
            f"OUT ({url}) is being written by another job ({who}); wait for it to finish "
            "or stop it, then rerun with --resume"
        )
    log.info("OUT had a stale lock from a job that is gone (%s); taking it over", who)


@contextlib.contextmanager
def hold_lock(url: str, storage_options: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    """Write our lock for the duration of the job; remove it when the job ends either way."""
    proc = psutil.Process()
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "process_started": proc.create_time(), "token": uuid.uuid4().hex}  # fmt: skip
    write_bytes(url, LOCK_NAME, json.dumps(mine).encode(), storage_options or {})
    if (read_lock(url, storage_options) or {}).get("token") != mine["token"]:
        raise UnsafeOutputError(f"OUT ({url}) was locked by another job at the same moment")
    try:
        yield mine
    finally:
        with contextlib.suppress(FileNotFoundError, OSError):
            fs, path = url_to_fs(url, storage_options)
            fs.rm_file(f"{path.rstrip('/')}/{LOCK_NAME}")


def read_lock(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    fs, path = url_to_fs(url, storage_options)
    target = f"{path.rstrip('/')}/{LOCK_NAME}"
    try:
        holder = json.loads(fs.cat_file(target))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"pid": None, "host": "unknown", "started": 0}
    return holder if isinstance(holder, dict) else None


def _alive(holder: dict[str, Any]) -> bool:
    """The lock's process still runs (same pid and the same start time: pids are reused)."""
    try:
        proc = psutil.Process(int(holder["pid"]))
        return bool(abs(proc.create_time() - float(holder.get("process_started", 0))) < 1.0)
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False

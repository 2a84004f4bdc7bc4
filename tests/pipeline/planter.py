"""The second user of a shared project folder, for tests/pipeline/fuzz_planter.py.

``start(shared, ops, delay_s)`` forks a child that enters ``shared`` (as root: the folders
above it may be closed to others), drops to PLANTER_UID with PLANTER_GID as its only group,
waits ``delay_s`` and applies ``ops`` there: links, folders, files, FIFOs, hard links. The
kernel then holds it to what that user may do, so whatever it changed, that user could have.
The child does nothing but system calls and JSON (it is forked from a process with threads).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

PLANTER_UID = 65534
"""nobody: no file of root's is its own."""
PLANTER_GID = 4242
"""A project group: the 2775 folder's group, and the planter's only one."""
PLANTER_GROUPS = frozenset({PLANTER_GID})

Op = tuple[Any, ...]
"""("mkdir", path, mode), ("write", path, bytes, mode), ("symlink", target, path),
("swap", target, path): path replaced by a link (a folder there is renamed to path.moved
first), ("folder", path): path replaced by an empty folder, ("fifo", path),
("hardlink", source, path), ("move", source, path) (a rename: someone else's link or file
taken from a folder the planter may write), ("read", path). Paths relative to the shared
folder."""


@dataclass(frozen=True)
class Done:
    what: str
    error: str | None
    """Why the kernel (or anything else) refused the op; None where it was done."""
    at: float
    """time.monotonic() when it ended (one clock for every process of the machine)."""

    def describe(self) -> str:
        return self.what + (f" (refused: {self.error})" if self.error else "")


class Planting:
    """A planter at work; ``finish`` collects what it did."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd

    def finish(self, timeout_s: float = 30.0) -> list[Done]:
        raw, deadline = b"", time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.fd], [], [], left)[0]:
                break
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                break
            raw += chunk
        os.close(self.fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)  # only where it is still running
        os.waitpid(self.pid, 0)
        try:
            record = json.loads(raw)
        except ValueError:
            return [Done("the planter", f"no report ({len(raw)} bytes)", time.monotonic())]
        if "error" in record:
            return [Done("the planter", record["error"], time.monotonic())]
        return [Done(*item) for item in record["done"]]


def start(shared: Path, ops: Sequence[Op], delay_s: float = 0.0) -> Planting:
    """Fork the planter; it acts ``delay_s`` after this call."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # the child makes system calls only: no lock to deadlock on
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child never returns
        os.close(read_fd)
        _child(shared, ops, delay_s, write_fd)
    os.close(write_fd)
    return Planting(pid, read_fd)


def plant(shared: Path, ops: Sequence[Op]) -> list[Done]:
    return start(shared, ops).finish()


def _child(shared: Path, ops: Sequence[Op], delay_s: float, fd: int) -> NoReturn:
    payload: dict[str, Any] = {"error": "the planter stopped"}
    try:
        os.chdir(shared)
        os.setgroups(list(PLANTER_GROUPS))
        os.setresgid(PLANTER_GID, PLANTER_GID, PLANTER_GID)
        os.setresuid(PLANTER_UID, PLANTER_UID, PLANTER_UID)
        os.umask(0o022)
        if os.getresuid() != (PLANTER_UID,) * 3 or os.getresgid() != (PLANTER_GID,) * 3:
            raise PermissionError("the planter still holds root's uid or gid")
        time.sleep(delay_s)
        payload = {"done": [_apply(op) for op in ops]}
    except BaseException as e:  # noqa: BLE001 - reported to the parent, never raised here
        payload = {"error": f"{type(e).__name__}: {e}"}
    finally:
        with contextlib.suppress(BaseException):
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(fd, data) :]
        os._exit(0)


def _apply(op: Op) -> tuple[str, str | None, float]:
    what = describe(op)
    try:
        _do(op)
        error = None
    except OSError as e:
        error = f"{type(e).__name__}: {e.strerror}"
    return what, error, time.monotonic()


def describe(op: Op) -> str:
    kind, *args = op
    if kind in ("symlink", "swap", "hardlink", "move"):
        return f"{args[1]} -> {args[0]} ({kind})"
    if kind == "write":
        return f"{args[0]}: {len(args[1])} bytes"
    return f"{args[0]}: {kind}"


def _do(op: Op) -> None:
    kind, *args = op
    if kind == "mkdir":
        os.mkdir(args[0])
        os.chmod(args[0], args[1])
    elif kind == "write":
        fd = os.open(args[0], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, args[2])
        with os.fdopen(fd, "wb") as f:
            f.write(args[1])
    elif kind == "symlink":
        os.symlink(args[0], args[1])
    elif kind == "swap":  # a link put in place by one rename, as a racing attacker would
        _move_folder_aside(args[1])
        os.symlink(args[0], args[1] + ".tmp")
        os.rename(args[1] + ".tmp", args[1])
    elif kind == "folder":
        _move_folder_aside(args[0])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args[0])
        os.mkdir(args[0])
    elif kind == "fifo":
        os.mkfifo(args[0])
    elif kind == "hardlink":
        os.link(args[0], args[1], follow_symlinks=False)
    elif kind == "move":
        os.rename(args[0], args[1])
    elif kind == "read":
        with open(args[0], "rb") as f:
            f.read(1)
    else:
        raise ValueError(f"unknown op {kind!r}")


def _move_folder_aside(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        os.rename(path, path + ".moved")

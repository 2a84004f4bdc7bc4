"""One job per OUT: a lock inside OUT, taken atomically before anything else is written.

Local files: ``lock.json`` held with an exclusive ``flock`` for the job's whole life. The kernel
drops it when the process dies, so a dead job's lock is simply free (no guessing from pids,
which are reused); the JSON inside only names the holder in the loser's message.

Object stores: ``lock.json`` is created with a conditional write (``If-None-Match: *`` on S3,
fsspec's ``mode="create"``). A holder on this host whose process is gone (same pid *and* start
time) is taken over; one on another host can't be checked, so it is refused with the way to
clear it by hand. Where a file system has no conditional write, fsspec checks then writes:
two jobs starting within one round trip could both get in (the token read back narrows it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from pipeline.errors import UnsafeOutputError, UsageError
from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr
from pipeline.store.door import Door, pin
from pipeline.store.fs import local_path, read_json, url_to_fs

log = logging.getLogger("pipeline")
LOCK_NAME = "lock.json"
LOCK_FIELDS = frozenset({"pid", "host", "started", "process_started", "token"})
LOCK_BYTES = 4096
"""A lock record is well under this; more is not one of ours."""
HEX = frozenset("0123456789abcdef")
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
"""flock's errors on file systems without locks (some FUSE and parallel file systems)."""
NAMING_SECONDS = 1.0
"""How long a refused job waits for the lock's new holder to write its name, in seconds (it
writes it microseconds after taking the lock, unless the machine stalls it)."""


@dataclass
class HeldLock:
    """A lock this process holds; ``still_held`` is checked before OUT is marked complete."""

    url: str
    storage_options: dict[str, Any] = field(metadata=SENSITIVE_FIELD)
    token: str
    fd: int | None = None
    """The flock'd descriptor (local files); None on object stores."""
    folder: tuple[int, int] | None = None
    """(st_dev, st_ino) of the local folder holding this lock, once pinned (``pin_folder``)."""

    __repr__ = redacted_repr

    def pin_folder(self) -> None:
        """Hold OUT's path to the folder whose lock this is, for every door of this process
        (pipeline.store.door.pin): a folder swapped in at its path is refused from now on."""
        if self.fd is None:
            return
        self.folder = Door(self.url).identity()
        pin(self.url, self.folder)
        if not _same_file(self.fd, self.url):  # the folder pinned is not the locked one
            pin(self.url, None)
            raise UnsafeOutputError(f"OUT ({self.url}) was replaced as its lock was taken; rerun")

    def still_held(self) -> bool:
        if self.fd is not None:
            return _same_file(self.fd, self.url)
        return (read_lock(self.url, self.storage_options) or {}).get("token") == self.token

    def release(self) -> None:
        with contextlib.suppress(OSError, UnsafeOutputError):
            if self.fd is not None:  # unlinked while still locked: a waiter re-checks the inode
                Door(self.url).remove_if_same(LOCK_NAME, self.fd)
            elif self.still_held():
                fs, _ = url_to_fs(self.url, self.storage_options)
                fs.rm_file(_lock_path(self.url, self.storage_options))
        if self.fd is not None:
            os.close(self.fd)
        if self.folder is not None:
            pin(self.url, None)


@contextlib.contextmanager
def hold_lock(url: str, storage_options: dict[str, Any] | None) -> Iterator[HeldLock]:
    """Take OUT's lock (OUT's folder must exist) for the duration of the block."""
    held = acquire(url, dict(storage_options or {}))
    try:
        yield held
    finally:
        held.release()


def acquire(url: str, storage_options: dict[str, Any]) -> HeldLock:
    """Take the lock or refuse (``UnsafeOutputError``, naming the holder)."""
    mine = _holder()
    if local_path(url) is not None:
        try:
            return _acquire_local(url, mine)
        except OSError as e:
            if e.errno not in NO_FLOCK:
                raise _unwritable(url, e) from e
            log.warning("OUT's file system has no file locks (%s); using a lock file", e)
    return _acquire_object(url, storage_options, mine)


def read_lock(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """OUT's lock record, None when there is none. On a store without atomic writes a record
    being written reads torn (empty, cut short): it is read again, for up to NAMING_SECONDS,
    before it is taken as naming no one."""
    deadline = time.monotonic() + NAMING_SECONDS
    while True:
        try:
            found = read_json(url, LOCK_NAME, storage_options)
        except (OSError, ValueError):
            found = {"pid": None, "host": "unknown", "started": 0}
        holder: dict[str, Any] | None = (
            found if found is None or isinstance(found, dict) else {"pid": None, "host": "unknown"}
        )
        if holder is None or holder.get("pid") is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.05)


def _acquire_local(url: str, mine: dict[str, Any]) -> HeldLock:
    door = Door(url)
    for _ in range(20):
        fd, created = _open_lock(door)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _named_holder(fd)
            os.close(fd)
            raise _busy(url, holder) from None
        except OSError as e:
            os.close(fd)
            if created and e.errno in NO_FLOCK:  # left empty, it would refuse the lock file
                door.remove(LOCK_NAME)
            raise
        try:
            if _same_file(fd, url):
                return _take(fd, url, mine, created)
        except BaseException:
            os.close(fd)  # never left open (and locked) behind a refusal
            raise
        os.close(fd)  # the holder removed this file as we opened it: take the new one
    raise UnsafeOutputError(f"OUT ({url}): its lock changed hands 20 times in a row; rerun")


def _take(fd: int, url: str, mine: dict[str, Any], created: bool) -> HeldLock:
    """The locked file at ``fd`` rewritten to name this job (only a lock file of ours)."""
    left = _read_fd(fd)
    if not created and not _ours(fd, left):
        raise _foreign(url)
    if left.get("pid") is not None:  # a job killed before it could remove its lock
        log.info("OUT had a stale lock from a job that is gone (%s); taking it over", _who(left))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(mine).encode(), 0)
    return HeldLock(url, {}, mine["token"], fd)


def _acquire_object(url: str, storage_options: dict[str, Any], mine: dict[str, Any]) -> HeldLock:
    fs, _ = url_to_fs(url, storage_options)
    target = _lock_path(url, storage_options)
    for _ in range(3):
        try:
            fs.pipe_file(target, json.dumps(mine).encode(), mode="create")
        except FileExistsError:
            holder = read_lock(url, storage_options)
            if holder is None:  # released as we looked: try again
                continue
            if not _stale(holder):
                raise _busy(url, holder) from None
            log.info("OUT had a stale lock from a job that is gone (%s); taking it over",
                     _who(holder))  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(target)
            continue
        except PermissionError as e:
            raise _unwritable(url, e) from e
        held = HeldLock(url, storage_options, mine["token"])
        if not held.still_held():
            raise _busy(url, read_lock(url, storage_options) or {})
        return held
    raise UnsafeOutputError(f"OUT ({url}): its lock changed hands 3 times in a row; rerun")


def _open_lock(door: Door) -> tuple[int, bool]:
    """The lock file, opened read-write, and whether this call created it: created with
    ``O_EXCL | O_NOFOLLOW``, or reopened only as a regular file (a link, a FIFO or a folder
    at its name is refused, never followed)."""
    for _ in range(100):
        with contextlib.suppress(FileExistsError):
            return door.create(LOCK_NAME, b""), True
        with contextlib.suppress(FileNotFoundError):  # removed as we looked: create it then
            return door.open_existing(LOCK_NAME), False
    raise UnsafeOutputError(f"OUT ({door.root}): its lock file keeps appearing and vanishing")


def is_lock_record(holder: object) -> bool:
    """A lock as this tool writes it (``_holder``): its fields, a 32-digit hex token."""
    if not isinstance(holder, dict) or not holder.keys() >= LOCK_FIELDS:
        return False
    token = holder.get("token")
    return isinstance(token, str) and len(token) == 32 and all(c in HEX for c in token)


def _ours(fd: int, holder: dict[str, Any]) -> bool:
    """An existing lock file may be taken over only when it is ours by its content: a lock
    record, or empty (a job killed between creating and writing it)."""
    return os.fstat(fd).st_size == 0 or is_lock_record(holder)


def _foreign(url: str) -> UnsafeOutputError:
    return UnsafeOutputError(
        f"OUT ({url}) holds a {LOCK_NAME} that is not a lock this tool wrote; it will not be "
        "replaced: move it away or choose another OUT"
    )


def _holder() -> dict[str, Any]:
    started = psutil.Process().create_time()
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "process_started": started, "token": uuid.uuid4().hex}  # fmt: skip


def _busy(url: str, holder: dict[str, Any]) -> UnsafeOutputError:
    if holder.get("pid") is None:
        return UnsafeOutputError(
            f"OUT ({url}) is locked, but its {LOCK_NAME} names no job (its holder has not "
            "written its name yet, or it was cut short by a crash or by jobs writing it at once "
            f"on a store without atomic writes); if no job is writing OUT, delete "
            f"{url.rstrip('/')}/{LOCK_NAME} and rerun"
        )
    if holder.get("host") not in (socket.gethostname(), None, "unknown"):
        return UnsafeOutputError(
            f"OUT ({url}) is locked by a job ({_who(holder)}) on another host, which can't be "
            f"checked from here; if that job is gone, delete {url.rstrip('/')}/{LOCK_NAME} "
            "and rerun"
        )
    return UnsafeOutputError(
        f"OUT ({url}) is being written by another job ({_who(holder)}); wait for it to "
        "finish or stop it, then rerun with --resume"
    )


def _unwritable(url: str, error: OSError) -> UsageError:
    return UsageError(
        f"OUT ({url}) cannot be written here ({error.strerror or error}); choose a location "
        "you can write to"
    )


def _who(holder: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started") or 0))
    return f"pid {holder.get('pid')} on {holder.get('host')} since {started}"


def _stale(holder: dict[str, Any]) -> bool:
    """A holder on this host whose process is gone (same pid and start time: pids are reused)."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        proc = psutil.Process(int(holder["pid"]))
        return not abs(proc.create_time() - float(holder.get("process_started", 0))) < 1.0
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _lock_path(url: str, storage_options: dict[str, Any] | None) -> str:
    local = local_path(url)
    if local is not None:
        return os.path.join(local, LOCK_NAME)
    _, path = url_to_fs(url, storage_options)
    return f"{path.rstrip('/')}/{LOCK_NAME}"


def _same_file(fd: int, url: str) -> bool:
    """``fd`` is still OUT's lock file (not removed, nor replaced by another or a link)."""
    st = Door(url).lstat(LOCK_NAME)
    return st is not None and os.path.samestat(st, os.fstat(fd))


def _named_holder(fd: int) -> dict[str, Any]:
    """The holder the flock'd file at ``fd`` names. A job that has just taken the lock writes
    its name a moment later: a file naming no one is read again, for up to NAMING_SECONDS."""
    deadline = time.monotonic() + NAMING_SECONDS
    while (holder := _read_fd(fd)).get("pid") is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return holder


def _read_fd(fd: int) -> dict[str, Any]:
    try:
        holder = json.loads(os.pread(fd, LOCK_BYTES, 0))
    except (OSError, ValueError):
        return {"pid": None, "host": None}
    return holder if isinstance(holder, dict) else {"pid": None, "host": None}

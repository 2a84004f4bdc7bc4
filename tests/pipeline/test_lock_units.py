"""The lock in one process, fast: what its file says and who may read it, the refusal's words
and numbers, a stale, torn or foreign lock.json, pid reuse, a file system without flock, and an
object store that needs its storage options (credentials) on every call."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import psutil
import pytest
from fsspec.implementations.local import LocalFileSystem

from pipeline.errors import UnsafeOutputError, UsageError
from pipeline.store import lock

HOST = socket.gethostname()
SECRET = {"secret": "s3cr3t"}
"""The storage options the keyed:// store refuses to work without."""


class KeyedFileSystem(LocalFileSystem):
    """The local disk as an object store (fsspec's create: check, then write) that needs
    credentials: opened without them, it refuses, so a call that drops the caller's storage
    options fails."""

    protocol = ("keyed",)

    def __init__(self, *args: Any, secret: str | None = None, **kwargs: Any) -> None:
        if secret != SECRET["secret"]:
            raise ValueError("keyed:// needs its secret")
        super().__init__(*args, **kwargs)


class StickyFileSystem(KeyedFileSystem):
    """A store where a stale lock can't be removed (another taker keeps putting one back)."""

    protocol = ("sticky",)

    def rm_file(self, path: str) -> None:
        pass


class VanishingFileSystem(KeyedFileSystem):
    """A store where removing a stale lock finds it already gone (another taker removed it)."""

    protocol = ("vanishing",)

    def rm_file(self, path: str) -> None:
        super().rm_file(path)
        raise FileNotFoundError(path)


class OvertakenFileSystem(KeyedFileSystem):
    """A store without conditional writes where another job's create lands just after ours
    (both checked, both wrote): the lock is theirs."""

    protocol = ("overtaken",)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        super().pipe_file(path, value, mode, **kwargs)
        theirs = {"pid": 4242, "host": HOST, "started": 1e9, "token": "theirs"}
        super().pipe_file(path, json.dumps(theirs).encode())


class ReleasingFileSystem(KeyedFileSystem):
    """A store where the holder releases the lock just as a taker goes to read who holds it."""

    protocol = ("releasing",)

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> Any:
        if path.endswith("/lock.json") and not getattr(self, "released", False):
            self.released = True
            self.rm_file(path)
        return super().cat_file(path, start, end, **kwargs)


STORES = (
    KeyedFileSystem,
    StickyFileSystem,
    VanishingFileSystem,
    OvertakenFileSystem,
    ReleasingFileSystem,
)


@pytest.fixture(autouse=True)
def stores() -> Iterator[None]:
    for fs in STORES:
        fsspec.register_implementation(fs.protocol[0], fs, clobber=True)
    yield
    for fs in STORES:
        fs.clear_instance_cache()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "c.zarr"
    folder.mkdir()
    return folder


def since(started: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))


def took_over(caplog: pytest.LogCaptureFixture, out: Path, held: Any, pid: int) -> None:
    """The stale lock of ``pid`` (started at 1e9) was taken over with the one log line, and
    OUT's lock.json is now ``held``'s; released."""
    assert caplog.messages == [
        f"OUT had a stale lock from a job that is gone (pid {pid} on {HOST} since "
        f"{since(1e9)}); taking it over"
    ]
    assert json.loads((out / "lock.json").read_text())["token"] == held.token
    held.release()


def busy(url: str, pid: object, host: object, started: float) -> str:
    """The refusal's words (as a regex) for a holder on this host; for a lock record naming no
    job (no pid), the words that say how to clear it."""
    if pid is None:
        return (
            rf"^OUT \({url}\) is locked, but its lock.json names no job \(.*\); if no job is "
            rf"writing OUT, delete {url}/lock.json and rerun$"
        )
    return (
        rf"^OUT \({url}\) is being written by another job \(pid {pid} on {host} since "
        rf"{since(started)}\); wait for it to finish or stop it, then rerun with --resume$"
    )


def write_lock(out: Path, **fields: Any) -> None:
    """A lock record as this tool writes one (its fields and a token), ``fields`` over it."""
    record = {"pid": None, "host": None, "started": 0, "process_started": 0,
              "token": uuid.uuid4().hex}  # fmt: skip
    (out / "lock.json").write_text(json.dumps({**record, **fields}))


def open_fds(out: Path) -> int:
    """This process's descriptors on OUT's folder and what is in it (the lock's): a count of
    all of them would move with the session cluster's sockets, opened and closed meanwhile."""
    inside = os.path.realpath(out)
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since it was listed
            continue
        found += target == inside or target.startswith(inside + os.sep)
    return found


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- local files (flock) ---------------------------------------------------------------------


def test_local_lock_names_its_holder_in_a_file_everyone_can_read(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0o022)
    try:
        fds, before = open_fds(out), time.time()
        held = lock.acquire(str(out), {})
    finally:
        os.umask(old)
    path = out / "lock.json"
    assert path.stat().st_mode & 0o777 == 0o644, "other users must read who holds OUT"
    written = json.loads(path.read_text())
    assert written.pop("started") == pytest.approx((before + time.time()) / 2, abs=1.0)
    me = psutil.Process()
    assert written == {"pid": me.pid, "host": HOST, "process_started": me.create_time(),
                       "token": held.token}  # fmt: skip
    assert held.fd is not None and held.still_held()
    held.release()
    assert not path.exists() and open_fds(out) == fds, "released: the file and its descriptor"


def test_second_local_taker_is_refused_naming_the_holder(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = lock.acquire(str(out), {})
    started = json.loads((out / "lock.json").read_text())["started"]
    fds, slept = open_fds(out), []
    monkeypatch.setattr(lock.time, "sleep", slept.append)
    with pytest.raises(UnsafeOutputError, match=busy(str(out), os.getpid(), HOST, started)):
        lock.acquire(str(out), {})
    assert open_fds(out) == fds, "the refused taker closed its descriptor"
    assert slept == [], "a holder that has written its name is named at once"
    assert held.still_held()
    held.release()


@pytest.mark.parametrize(
    "content",
    [
        "",  # a holder that never wrote its name
        "[1, 2]",  # a foreign file (not a JSON object)
        "{torn",
    ],
)
def test_local_lock_held_with_unreadable_contents_is_still_refused(
    out: Path, content: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock, "NAMING_SECONDS", 0.05)  # no name is coming: don't wait long
    (out / "lock.json").write_text(content)
    fd = os.open(out / "lock.json", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(UnsafeOutputError, match=busy(str(out), None, None, 0)):
            lock.acquire(str(out), {})
    finally:
        os.close(fd)


def test_refused_in_the_instant_a_new_holder_takes_the_lock_names_it(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The winner of a race takes the flock, then writes its name: a loser refused in between
    waits for the name (briefly) rather than naming no one ("pid None")."""
    fd = os.open(out / "lock.json", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the winner writes its name while the loser waits
        slept.append(seconds)
        name = {"pid": 4242, "host": HOST, "started": 1e9}
        os.pwrite(fd, json.dumps(name).encode(), 0)

    monkeypatch.setattr(lock.time, "sleep", sleep)
    try:
        with pytest.raises(UnsafeOutputError, match=busy(str(out), 4242, HOST, 1e9)):
            lock.acquire(str(out), {})
    finally:
        os.close(fd)
    assert len(slept) == 1 and slept[0] <= lock.NAMING_SECONDS


def test_stale_local_lock_is_taken_over_with_a_word_and_rewritten_whole(
    out: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = dead_pid()
    # longer than what replaces it: a lock not truncated first would keep a torn tail
    write_lock(out, pid=gone, host=HOST, started=1e9, process_started=1.0, note="x" * 500)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        held = lock.acquire(str(out), {})
    took_over(caplog, out, held, gone)


def test_an_empty_lock_file_is_taken_without_a_word(
    out: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (out / "lock.json").write_text("")  # a job killed between creating and writing it
    with caplog.at_level(logging.INFO, logger="pipeline"):
        held = lock.acquire(str(out), {})
    assert caplog.messages == []
    held.release()


def test_a_lock_file_removed_as_it_is_opened_is_created_again(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another job removes the lock file between this job's two opens (create, then open)."""
    path, real, calls = str(out / "lock.json"), os.open, []
    (out / "lock.json").write_text("")

    def racing_open(name: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if name == "lock.json":  # opened by name inside OUT's folder
            calls.append(flags)
            if not flags & os.O_CREAT and len(calls) == 2:
                os.unlink(path)
        return real(name, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(lock.os, "open", racing_open)
    held = lock.acquire(str(out), {})
    monkeypatch.undo()
    assert len(calls) == 3 and json.loads((out / "lock.json").read_text())["token"] == held.token
    held.release()


def test_a_lock_that_keeps_changing_hands_gives_up_after_20_tries(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries = []
    monkeypatch.setattr(lock, "_same_file", lambda fd, path: tries.append(fd) and False)
    fds = open_fds(out)
    with pytest.raises(UnsafeOutputError) as refused:
        lock.acquire(str(out), {})
    assert str(refused.value) == f"OUT ({out}): its lock changed hands 20 times in a row; rerun"
    assert len(tries) == 20 and open_fds(out) == fds


def test_file_system_without_flock_falls_back_to_a_lock_file(
    out: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_locks(fd: int, how: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)
    fds = open_fds(out)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        held = lock.acquire(str(out), {})
    assert caplog.messages == [
        f"OUT's file system has no file locks ([Errno {errno.ENOLCK}] "
        f"{os.strerror(errno.ENOLCK)}); using a lock file"
    ]
    assert held.fd is None and open_fds(out) == fds
    assert json.loads((out / "lock.json").read_text())["token"] == held.token
    started = json.loads((out / "lock.json").read_text())["started"]
    with pytest.raises(UnsafeOutputError, match=busy(str(out), os.getpid(), HOST, started)):
        lock.acquire(str(out), {})
    held.release()
    assert not (out / "lock.json").exists()


def test_lock_error_other_than_no_flock_is_a_usage_error_saying_why(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int, how: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(lock.fcntl, "flock", broken)
    fds = open_fds(out)
    with pytest.raises(UsageError) as refused:
        lock.acquire(str(out), {})
    assert str(refused.value) == (
        f"OUT ({out}) cannot be written here ({os.strerror(errno.EIO)}); choose a location you "
        "can write to"
    )
    assert open_fds(out) == fds and not isinstance(refused.value, UnsafeOutputError)


# --- object stores (conditional create; the storage options on every call) -----------------


def keyed(out: Path, protocol: str = "keyed") -> str:
    return f"{protocol}://{out}"


def test_object_store_lock_is_taken_held_and_released_with_its_options(out: Path) -> None:
    held = lock.acquire(keyed(out), dict(SECRET))
    written = json.loads((out / "lock.json").read_text())
    assert held.fd is None and written["token"] == held.token and written["pid"] == os.getpid()
    assert held.still_held()
    with pytest.raises(UnsafeOutputError, match=busy(keyed(out), os.getpid(), HOST,
                                                     written["started"])):  # fmt: skip
        lock.acquire(keyed(out), dict(SECRET))
    held.release()
    assert not (out / "lock.json").exists()
    with lock.hold_lock(keyed(out), SECRET) as again:
        assert again.still_held()
    assert not (out / "lock.json").exists()


def test_a_lock_that_cannot_be_removed_at_the_end_does_not_fail_the_job(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The product is written by then: a store refusing the lock's removal leaves the lock
    behind (the next job finds it stale or names it), not an exception."""

    def refuse(self: Any, path: str) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    held = lock.acquire(keyed(out), dict(SECRET))
    monkeypatch.setattr(KeyedFileSystem, "rm_file", refuse)
    held.release()
    assert json.loads((out / "lock.json").read_text())["token"] == held.token


def test_object_store_lock_taken_by_another_is_no_longer_held(out: Path) -> None:
    held = lock.acquire(keyed(out), dict(SECRET))
    write_lock(out, pid=1, host=HOST, token="someone else's")
    assert not held.still_held()
    held.release()
    assert json.loads((out / "lock.json").read_text())["token"] == "someone else's"


@pytest.mark.parametrize(
    "content",
    [
        "{torn",  # a partial write of a store without atomic puts
        "[1, 2]",  # JSON, but not a lock
        '"a string"',
    ],
)
def test_object_store_lock_torn_or_foreign_is_refused_not_taken(out: Path, content: str) -> None:
    (out / "lock.json").write_text(content)
    with pytest.raises(UnsafeOutputError, match=busy(keyed(out), None, "unknown", 0)):
        lock.acquire(keyed(out), dict(SECRET))
    assert (out / "lock.json").read_text() == content


@pytest.mark.parametrize(
    ("offset", "taken"),
    [
        (0.0, False),  # the holder itself
        (-0.5, False),  # the holder, its start time read half a second apart (clock steps)
        (1.0, True),  # a process started a second or more after the holder: the pid reused
        (-3600.0, True),
    ],
)
def test_object_store_lock_of_a_live_pid_is_its_holder_only_at_its_start_time(
    out: Path, offset: float, taken: bool
) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        started = psutil.Process(child.pid).create_time()
        write_lock(out, pid=child.pid, host=HOST, started=1e9, process_started=started + offset)
        if not taken:
            with pytest.raises(UnsafeOutputError, match=busy(keyed(out), child.pid, HOST, 1e9)):
                lock.acquire(keyed(out), dict(SECRET))
            return
        held = lock.acquire(keyed(out), dict(SECRET))
        assert json.loads((out / "lock.json").read_text())["token"] == held.token
        held.release()
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("fields", "taken"),
    [
        # its process is gone: free
        ({"pid": "dead", "process_started": 1.0}, True),
        # a live pid with no start time can't be told from a reused one: free
        ({"pid": "live"}, True),
        # no pid at all: nothing to check, so refused rather than guessed
        ({}, False),
        ({"pid": "not a number"}, False),
    ],
)
def test_object_store_lock_on_this_host_is_checked_by_its_pid(
    out: Path, caplog: pytest.LogCaptureFixture, fields: dict[str, Any], taken: bool
) -> None:
    pid = {"dead": dead_pid(), "live": os.getpid()}.get(fields.get("pid"), fields.get("pid"))
    write_lock(out, host=HOST, started=1e9, **{**fields, **({"pid": pid} if pid else {})})
    if not taken:
        with pytest.raises(UnsafeOutputError, match=busy(keyed(out), pid, HOST, 1e9)):
            lock.acquire(keyed(out), dict(SECRET))
        return
    with caplog.at_level(logging.INFO, logger="pipeline"):
        held = lock.acquire(keyed(out), dict(SECRET))
    took_over(caplog, out, held, pid)


def test_object_store_stale_lock_that_keeps_coming_back_gives_up_after_3_tries(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_lock(out, pid=dead_pid(), host=HOST, started=1e9, process_started=1.0)
    tries = []
    real = StickyFileSystem.pipe_file

    def pipe_file(self: Any, path: str, value: bytes, mode: str = "overwrite") -> None:
        tries.append(path)
        real(self, path, value, mode)

    monkeypatch.setattr(StickyFileSystem, "pipe_file", pipe_file)
    with pytest.raises(UnsafeOutputError) as refused:
        lock.acquire(keyed(out, "sticky"), dict(SECRET))
    url = keyed(out, "sticky")
    assert str(refused.value) == f"OUT ({url}): its lock changed hands 3 times in a row; rerun"
    assert tries == [f"{out}/lock.json"] * 3


def test_object_store_stale_lock_removed_by_another_taker_first_is_taken(out: Path) -> None:
    write_lock(out, pid=dead_pid(), host=HOST, started=1e9, process_started=1.0)
    held = lock.acquire(keyed(out, "vanishing"), dict(SECRET))
    assert json.loads((out / "lock.json").read_text())["token"] == held.token


def test_object_store_lock_overtaken_after_the_write_is_refused_naming_the_winner(
    out: Path,
) -> None:
    """Two jobs pass the check and write; the token read back tells this one it lost, and
    its refusal names the job whose lock it is."""
    with pytest.raises(UnsafeOutputError, match=busy(keyed(out, "overtaken"), 4242, HOST, 1e9)):
        lock.acquire(keyed(out, "overtaken"), dict(SECRET))
    assert json.loads((out / "lock.json").read_text())["token"] == "theirs", "theirs stays"


@pytest.mark.parametrize("name", ["c.zarr", "C_MATRIX", "c.zarr "])  # what a bad strip eats
def test_object_store_lock_of_another_host_names_the_file_to_delete(
    tmp_path: Path, name: str
) -> None:
    out = tmp_path / name
    out.mkdir()
    write_lock(out, pid=4242, host="some-other-host", started=1e9, process_started=1.0)
    words = (
        rf"^OUT \(keyed://{out}/\) is locked by a job \(pid 4242 on some-other-host since "
        rf"{since(1e9)}\) on another host, which can't be checked from here; if that job is "
        rf"gone, delete keyed://{out}/lock.json and rerun$"
    )
    with pytest.raises(UnsafeOutputError, match=words):
        lock.acquire(f"keyed://{out}/", dict(SECRET))


def test_object_store_lock_released_as_a_taker_looks_is_taken(out: Path) -> None:
    """Refused by the create, then the holder lets go before its name is read: the lock is
    free, so it is taken (not refused naming "pid None on None")."""
    write_lock(out, pid=os.getpid(), host=HOST, started=1e9,
               process_started=psutil.Process().create_time())  # fmt: skip
    held = lock.acquire(keyed(out, "releasing"), dict(SECRET))
    assert json.loads((out / "lock.json").read_text())["token"] == held.token
    held.release()


def test_object_store_that_refuses_the_write_is_a_usage_error(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Any, path: str, value: bytes, mode: str = "overwrite") -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(KeyedFileSystem, "pipe_file", refuse)
    with pytest.raises(UsageError) as refused:
        lock.acquire(keyed(out), dict(SECRET))
    assert str(refused.value) == (
        f"OUT ({keyed(out)}) cannot be written here ({os.strerror(errno.EACCES)}); choose a "
        "location you can write to"
    )


def test_a_lock_record_read_as_it_is_written_is_read_again(tmp_path: Path) -> None:
    """A store without atomic writes shows a record being written torn (here: empty, then
    whole 0.2 s later): the reader waits for the name instead of naming no one."""
    import threading

    out = tmp_path / "c.zarr"
    out.mkdir()
    (out / lock.LOCK_NAME).write_text("")
    record = {"pid": 4242, "host": "elsewhere", "started": 1.0, "token": "t"}
    writer = threading.Timer(0.2, (out / lock.LOCK_NAME).write_text, [json.dumps(record)])
    writer.start()
    try:
        assert lock.read_lock(str(out), None) == record
    finally:
        writer.join()
    (out / lock.LOCK_NAME).write_text("{")  # torn for good: named no one, after the wait
    started = time.monotonic()
    assert lock.read_lock(str(out), None) == {"pid": None, "host": "unknown", "started": 0}
    assert time.monotonic() - started >= lock.NAMING_SECONDS


def test_a_lock_file_not_of_ours_and_unlocked_is_refused_in_words(out: Path) -> None:
    """A lock.json nobody holds that this tool did not write is neither taken nor replaced."""
    (out / "lock.json").write_text('{"owner": "someone else"}')
    with pytest.raises(UnsafeOutputError) as refused:
        lock.acquire(str(out), {})
    assert str(refused.value) == (
        f"OUT ({out}) holds a lock.json that is not a lock this tool wrote; it will not be "
        "replaced: move it away or choose another OUT"
    )
    assert (out / "lock.json").read_text() == '{"owner": "someone else"}'

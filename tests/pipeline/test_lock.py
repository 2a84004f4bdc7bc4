"""One job per OUT: the lock is taken atomically (flock on local files), a live holder refuses
every other writer, a dead one's lock is free, and real processes racing for one OUT leave
exactly one winner whose product OUT holds, never a mix."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.errors import JobError, UnsafeOutputError
from pipeline.store import lock
from pipeline.store.record import of_array
from tests.child_env import child_env
from tests.helpers import assert_product, random_matrix, run_cli, write_array
from tests.pipeline import racy_fs

HOLD = textwrap.dedent(
    """
    import sys, time
    from pipeline.store import lock
    try:
        held = lock.acquire(sys.argv[1], {})
    except Exception as e:
        print("refused", type(e).__name__, e, flush=True)
        sys.exit(3)
    print("holding", time.time(), flush=True)
    time.sleep(float(sys.argv[2]))
    released = time.time()
    held.release()
    print("released", released, flush=True)
    """
)


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


def holder(out: Path, seconds: float) -> subprocess.Popen[str]:
    """A process of its own that takes OUT's lock with the tool's code and keeps it."""
    env = child_env()
    argv = [sys.executable, "-c", HOLD, str(out), str(seconds)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().startswith("holding")
    return proc


def write_lock(out: Path, pid: int, host: str, process_started: float) -> None:
    lock_ = {"pid": pid, "host": host, "started": time.time(), "process_started": process_started,
             "token": uuid.uuid4().hex}  # fmt: skip
    (out / "lock.json").write_text(json.dumps(lock_))


def test_live_lock_refuses_second_writer(tmp_path: Path, client: Client, inputs: tuple) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    assert not (out / "lock.json").exists(), "the lock must be released after a job"
    proc = holder(out, 60)
    try:
        before = zarr.open_array(str(out))[:]
        for flags in ({"overwrite": True}, {"resume": True}):
            with pytest.raises(UnsafeOutputError, match=rf"another job \(pid {proc.pid} on"):
                multiply(a_url, b_url, str(out), client=client, **flags)
        np.testing.assert_array_equal(zarr.open_array(str(out))[:], before)
    finally:
        proc.kill()
        proc.wait()
    # Killed (no clean-up): its lock file stays, but the kernel dropped the lock with it.
    assert (out / "lock.json").exists()
    result = multiply(a_url, b_url, str(out), client=client, resume=True)
    assert result.tiles_skipped == result.plan.n_tiles


@pytest.mark.parametrize(
    "host, pid_of",
    [
        # a job that is gone
        ("self", "dead"),
        # pid reuse: the lock names a live process (this one) that does not hold the lock
        ("self", "live"),
        # a lock file from another host (over NFS its live holder would hold the flock too)
        ("some-other-host", "live"),
    ],
)
def test_lock_file_without_holder_is_taken_over(
    tmp_path: Path, client: Client, inputs: tuple, host: str, pid_of: str
) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    if pid_of == "dead":
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        pid = dead.pid
    else:
        pid = os.getpid()
    started = psutil.Process(pid).create_time() if pid_of == "live" else 0.0
    write_lock(out, pid, socket.gethostname() if host == "self" else host, started)
    result = multiply(a_url, b_url, str(out), client=client, resume=True)
    assert result.tiles_skipped == result.plan.n_tiles
    assert not (out / "lock.json").exists()
    assert_product(zarr.open_array(str(out))[:], a, b)


def test_processes_racing_for_one_lock_leave_one_winner(tmp_path: Path) -> None:
    """Many rounds of four processes started together: never two holders at once."""
    out = tmp_path / "c.zarr"
    out.mkdir()
    env = child_env()
    for _ in range(12):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", HOLD, str(out), "0.4"],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(4)
        ]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        said = [o.split() for o in outs]
        held = sorted((float(s[1]), float(s[3])) for s in said if s[0] == "holding")
        refused = [o for o in outs if not o.startswith("holding")]
        assert held and len(held) + len(refused) == 4, said
        # Each refusal names a job that held the lock (never "pid None": a loser refused as
        # the winner takes the lock waits for the winner's name).
        holders = [p.pid for p, o in zip(procs, outs, strict=True) if o.startswith("holding")]
        for o in refused:
            assert o.startswith(f"refused UnsafeOutputError OUT ({out}) is being written by "), o
            assert any(f"(pid {pid} on {socket.gethostname()} since " in o for pid in holders), o
        # Never two at once: one started after the winner let go may win in turn.
        for (_, end), (start, _) in zip(held, held[1:], strict=False):
            assert start >= end, f"two holders at once: {held}"
        assert not (out / "lock.json").exists()


def test_cli_jobs_racing_into_one_new_out(tmp_path: Path) -> None:
    """Two real CLI jobs, A @ B and A2 @ B, started together into one new OUT: one wins and
    OUT holds exactly its product; the other exits 2 naming the holder or the change."""
    rng = np.random.default_rng(3)
    a, a2, b = (random_matrix(rng, s, "float32") for s in ((60, 40), (60, 40), (40, 50)))
    urls = [
        write_array(tmp_path / f"{n}.zarr", x, (20, 20))
        for n, x in (("a", a), ("a2", a2), ("b", b))
    ]
    for round_ in range(3):
        out = tmp_path / f"c{round_}.zarr"
        argv = [
            [u, urls[2], str(out), "--no-progress", "--dashboard-address", ":0"] for u in urls[:2]
        ]
        env = child_env()
        procs = [
            subprocess.Popen([sys.executable, "-m", "pipeline", "multiply", *x], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for x in argv
        ]  # fmt: skip
        done = [(p.wait(timeout=120), p.communicate()[1]) for p in procs]
        codes = sorted(code for code, _ in done)
        assert codes == [0, 2], done
        winner = [i for i, (code, _) in enumerate(done) if code == 0][0]
        loser_err = done[1 - winner][1]
        assert "error: OUT" in loser_err and (
            "another job" in loser_err or "already exists" in loser_err or "changed" in loser_err
        ), loser_err
        assert_product(zarr.open_array(str(out))[:], (a, a2)[winner], b)
        assert of_array(zarr.open_array(str(out))).complete is True


def test_lock_is_checked_before_the_completion_mark(
    tmp_path: Path, client: Client, inputs: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "c.zarr"
    monkeypatch.setattr(lock.HeldLock, "still_held", lambda self: False)
    with pytest.raises(JobError, match="lost its lock"):
        multiply(a_url, b_url, str(out), client=client)
    assert of_array(zarr.open_array(str(out))).complete is False


def test_held_lock_notices_removal_and_replacement(tmp_path: Path) -> None:
    out = tmp_path / "c.zarr"
    out.mkdir()
    held = lock.acquire(str(out), {})
    assert held.still_held()
    (out / "lock.json").unlink()
    assert not held.still_held(), "removed by hand"
    (out / "lock.json").write_text("{}")
    assert not held.still_held(), "replaced by another file"
    held.release()
    assert (out / "lock.json").exists(), "a lock that is not ours is never removed"


def test_unwritable_out_location_is_exit_2_before_any_cluster(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root writes anywhere: a file where OUT's parent folder should be stands in (/proc
        # would be refused first for its 0 B free)
        (tmp_path / "file").write_bytes(b"")
        where = str(tmp_path / "file" / "c.zarr")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        where = str(ro / "c.zarr")
    a_url = write_array(tmp_path / "a.zarr", np.ones((4, 4), "float32"), (2, 2))
    done = run_cli("multiply", a_url, a_url, where, "--no-progress")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: OUT") and "cannot be created" in done.stderr
    assert "started" not in done.stderr, "refused before a cluster started"


RACE = textwrap.dedent(
    """
    import sys, time
    from tests.pipeline import racy_fs
    from pipeline.store import lock
    racy_fs.register()
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all start at one instant
    try:
        held = lock.acquire(sys.argv[1], {})
    except Exception as e:
        print("refused", type(e).__name__, e, flush=True)
        sys.exit(3)
    print("holding", flush=True)
    sys.stdin.readline()  # until every racer has answered: a late one finds it held
    held.release()
    """
)


def first_line(process: subprocess.Popen[str], deadline: float) -> str:
    """The first line the process printed, waiting until ``deadline`` (time.monotonic())."""
    assert process.stdout is not None
    if select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
        return process.stdout.readline().strip()
    return "no answer"


def test_jobs_racing_on_a_store_without_conditional_writes(tmp_path: Path) -> None:
    """Three processes take one OUT's lock at the same instant on a store whose 'create' checks,
    then writes (tests/pipeline/racy_fs.py): all three pass the check and write, so only the
    token read back tells them apart; exactly one may hold the lock."""
    env = child_env()
    for round_ in range(3):
        out = tmp_path / f"c{round_}.zarr"
        out.mkdir()
        start = str(time.time() + 2.0)  # past every interpreter's start-up
        procs = [
            subprocess.Popen([sys.executable, "-c", RACE, f"racy://{out}", start],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(3)
        ]  # fmt: skip
        deadline = time.monotonic() + 60
        said = [first_line(p, deadline) for p in procs]
        for p in procs:  # the holder releases now; the others have ended
            p.communicate("\n", timeout=60)
        assert sorted(s.split(" OUT ")[0] for s in said) == [
            "holding",
            "refused UnsafeOutputError",
            "refused UnsafeOutputError",
        ], said
        # Each refusal names a racer whose lock it read (the winner's, unless a write landed
        # late on a loaded machine), never "pid None" nor a mangled URL.
        words = f"OUT (racy://{out}) is being written by another job (pid "
        pids = [f"{words}{p.pid} on {socket.gethostname()} since " for p in procs]
        for s in said:
            assert s == "holding" or any(pid in s for pid in pids), said
        assert not (out / "lock.json").exists(), "the winner released it"


def test_lock_record_naming_no_job_says_how_to_clear_it(tmp_path: Path) -> None:
    """A lock.json cut short (a crash, or two jobs writing it at once on a store without atomic
    writes) is refused, never taken over, and the refusal says how to clear it."""
    racy_fs.register()
    out = tmp_path / "c.zarr"
    out.mkdir()
    torn = json.dumps({"pid": 1, "host": socket.gethostname(), "token": "ab" * 16})[:-9]
    (out / "lock.json").write_text(torn)
    with pytest.raises(UnsafeOutputError) as refused:
        lock.acquire(f"racy://{out}", {})
    message = str(refused.value)
    assert "names no job" in message and "pid None" not in message, message
    assert message.endswith(f"delete racy://{out}/lock.json and rerun"), message
    assert (out / "lock.json").read_text() == torn, "a lock naming no job is never replaced"


@pytest.mark.parametrize(
    ("started_offset", "taken_over"),
    [
        (0.0, False),  # the live process that wrote the lock: it holds it
        (-3600.0, True),  # its pid now belongs to a process started later: the holder is gone
    ],
)
def test_object_store_lock_tells_a_reused_pid_from_its_holder(
    tmp_path: Path, started_offset: float, taken_over: bool
) -> None:
    """On a store without flock the lock names its holder by pid and start time: a live
    process with the holder's pid that started at another time is not the holder."""
    racy_fs.register()
    out = tmp_path / "c.zarr"
    out.mkdir()
    me = psutil.Process()
    write_lock(out, me.pid, socket.gethostname(), me.create_time() + started_offset)
    if not taken_over:
        words = (
            rf"OUT \(racy://{out}\) is being written by another job \(pid {me.pid} on "
            rf"{socket.gethostname()} since .*\); wait for it to finish or stop it, then rerun "
            "with --resume$"
        )
        with pytest.raises(UnsafeOutputError, match=words):
            lock.acquire(f"racy://{out}", {})
        return
    held = lock.acquire(f"racy://{out}", {})
    assert json.loads((out / "lock.json").read_text())["token"] == held.token
    held.release()
    assert not (out / "lock.json").exists()


def test_object_store_lock_of_another_host_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """A holder on another host can't be checked from here: refused, naming the file to delete
    if that job is gone (never taken over, whatever its pid means here)."""
    racy_fs.register()
    out = tmp_path / "c.zarr"
    out.mkdir()
    write_lock(out, os.getpid(), "some-other-host", psutil.Process().create_time())
    words = (
        rf"OUT \(racy://{out}/\) is locked by a job \(pid {os.getpid()} on some-other-host "
        r"since .*\) on another host, which can't be checked from here; if that job is gone, "
        rf"delete racy://{out}/lock.json and rerun$"
    )
    with pytest.raises(UnsafeOutputError, match=words):
        lock.acquire(f"racy://{out}/", {})
    assert json.loads((out / "lock.json").read_text())["host"] == "some-other-host"


def test_a_failed_job_lets_go_of_out_only_when_its_tasks_have_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelling a future does not stop a task already running: without waiting for it, a
    tile would go on writing OUT after the job released its lock (to a --resume, say)."""
    import threading

    import pipeline.run.worker as worker

    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, (600, 96), "float32"), random_matrix(rng, (96, 520), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (100, 96))
    b_url = write_array(tmp_path / "b.zarr", b, (96, 104))
    real, calls, journaled = worker._journal, [], threading.Event()

    def journal(*args: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the first tile fails")
        time.sleep(2.0)  # the other one is still running when the job hears of the failure
        stats = real(*args)
        journaled.set()
        return stats

    monkeypatch.setattr(worker, "_journal", journal)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:  # fmt: skip
        with pytest.raises(JobError, match="the first tile fails"), caplog.at_level("WARNING"):
            multiply(a_url, b_url, str(tmp_path / "c.zarr"), client=c)
        assert len(calls) >= 2, "the plan has two tiles running at once"
        assert journaled.is_set(), "the job returned while a tile task was still writing"
        said = "a tile task failed: waiting for the tile tasks already running to stop"
        assert any(m.startswith(said) for m in caplog.messages), caplog.messages


def test_an_interrupted_job_lets_go_of_out_only_when_its_tasks_have_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (KeyboardInterrupt in the client's wait) cancels the tasks not started and waits
    for the running ones, as a failure does."""
    import threading

    import pipeline.run.client as client_module
    import pipeline.run.worker as worker

    rng = np.random.default_rng(4)
    a, b = random_matrix(rng, (600, 96), "float32"), random_matrix(rng, (96, 520), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (100, 96))
    b_url = write_array(tmp_path / "b.zarr", b, (96, 104))
    real_journal, started, began, finished = worker._journal, threading.Event(), [], []

    def journal(*args: object) -> object:
        began.append(1)
        started.set()
        time.sleep(1.5)  # still running when Ctrl-C comes
        stats = real_journal(*args)
        finished.append(1)
        return stats

    def interrupted(pending: object) -> object:
        started.wait(10)
        raise KeyboardInterrupt

    monkeypatch.setattr(worker, "_journal", journal)
    monkeypatch.setattr(client_module, "wait_some", interrupted)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:  # fmt: skip
        with pytest.raises(KeyboardInterrupt):
            multiply(a_url, b_url, str(tmp_path / "c.zarr"), client=c)
        assert began, "no task had started: nothing was checked"
        assert len(finished) == len(began), "a tile task was still running when the job returned"

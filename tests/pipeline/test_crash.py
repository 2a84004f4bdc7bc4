"""kill -9 of a whole job midway, then `--resume`, as a user meets it (CLI subprocesses).

The job runs in a session of its own, so SIGKILL to its process group takes its worker
processes too. Afterwards: OUT says incomplete, the dead job's lock is still there; `--resume`
takes the lock over, skips exactly the tiles journaled before the kill, computes the rest,
and leaves the right product marked complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import zarr
from distributed import Client

from pipeline import multiply
from pipeline.generate import write_random
from pipeline.store.record import OutRecord, of_array
from tests.helpers import assert_product, random_matrix, write_array

REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 240
SUMMARY = re.compile(r"tiles computed (\d+), skipped (\d+)")
RESUMED = re.compile(r"resume: (\d+) of (\d+) tile\(s\) already written")
WORKERS_CPU = re.compile(r"workers' CPU: user ([0-9.]+) s, system ([0-9.]+) s")


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


def multiply_argv(a: str, b: str, out: Path, *options: str) -> list[str]:
    return [
        *(sys.executable, "-m", "pipeline", "multiply", a, b, str(out)),
        *("--no-progress", "--dashboard-address", "127.0.0.1:0", *options),
    ]


@contextlib.contextmanager
def job(argv: list[str], logs: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The CLI in a new session; whatever is left of its process group is killed after."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    with logs.with_suffix(".out").open("wb") as out, logs.with_suffix(".err").open("wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def run(argv: list[str], logs: Path) -> Done:
    with job(argv, logs) as proc:
        proc.wait(timeout=CLI_TIMEOUT_S)
    return Done(
        proc.returncode, logs.with_suffix(".out").read_text(), logs.with_suffix(".err").read_text()
    )


def workers_cpu(done: Done) -> float:
    """The workers' CPU seconds, user and system, from the CLI's accounting line."""
    found = WORKERS_CPU.search(done.stdout)
    assert found, done.stdout
    return float(found.group(1)) + float(found.group(2))


def digest(*roots: Path) -> str:
    """One hash of every file's path and bytes under the roots."""
    h = hashlib.sha256()
    for root in roots:
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(root.parent)).encode() + f.read_bytes())
    return h.hexdigest()


def first_int(pattern: str, text: str) -> int:
    found = re.search(pattern, text, re.M)
    assert found, f"{pattern!r} not in {text!r}"
    return int(found.group(1))


def journaled(out: Path) -> set[tuple[int, int]]:
    """Tiles with a complete journal entry in OUT."""
    tiles = set()
    for entry in (out / "journal").glob("tile-*.json"):
        with contextlib.suppress(ValueError, OSError):
            tiles.add(tuple(json.loads(entry.read_bytes())["index"]))
    return tiles


def kill_midway(argv: list[str], out: Path, logs: Path, at: int) -> tuple[int, set[Any]]:
    """Start the job; once `at` tiles are journaled, SIGKILL its whole process group.
    Returns the job's pid and the tiles journaled when it died."""
    with job(argv, logs) as proc:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while len(journaled(out)) < at:
            assert proc.poll() is None, (
                f"the job ended (exit {proc.returncode}) before it was killed: "
                + logs.with_suffix(".err").read_text()
            )
            assert time.monotonic() < deadline, "the job never got halfway"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert_group_gone(proc.pid)
    return proc.pid, journaled(out)


def assert_group_gone(pgid: int) -> None:
    """No live process (zombies aside) is left in the killed job's process group."""
    deadline = time.monotonic() + 10
    while True:
        left = []
        for p in psutil.process_iter(["status"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
        if not left:
            return
        assert time.monotonic() < deadline, f"processes {left} survived the kill of the group"
        time.sleep(0.1)


def attrs(out: Path) -> dict[str, Any]:
    return of_array(zarr.open_array(str(out), mode="r")).to_dict()


def resume_counts(done: Done) -> tuple[int, int, int]:
    """(computed, skipped, total) from the summary line and the resume log line."""
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    summary, resumed = SUMMARY.search(done.stdout), RESUMED.search(done.stderr)
    assert summary and resumed, (done.stdout, done.stderr)
    assert int(resumed.group(1)) == int(summary.group(2))
    return int(summary.group(1)), int(summary.group(2)), int(resumed.group(2))


@pytest.mark.parametrize(
    "cluster",
    [
        # the default local cluster: one in-process worker, a thread per core
        pytest.param([], id="in-process"),
        # two worker processes (nannies) in the job's process group
        pytest.param(["--workers", "2", "--threads-per-worker", "1"], id="two-processes"),
    ],
)
def test_kill_midway_then_resume(tmp_path: Path, cluster: list[str]) -> None:
    rng = np.random.default_rng(11)
    a, b = random_matrix(rng, (2048, 2048), "float32"), random_matrix(rng, (2048, 2048), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (256, 256))
    b_url = write_array(tmp_path / "b.zarr", b, (256, 256))
    inputs = digest(tmp_path / "a.zarr", tmp_path / "b.zarr")
    out = tmp_path / "c.zarr"
    # 264 MiB per worker forces small tiles: many of them, each a short task.
    argv = multiply_argv(a_url, b_url, out, "--memory-limit", "266MiB", *cluster)
    plan = run([*argv, "--dry-run"], tmp_path / "plan")
    total = first_int(r"^tiles\s+(\d+)", plan.stdout)
    assert total >= 16, plan.stdout

    pid, before = kill_midway(argv, out, tmp_path / "killed", at=total // 2)
    assert 0 < len(before) < total, f"{len(before)} of {total} tiles journaled: not midway"
    assert attrs(out)["complete"] is False, "a killed job's OUT must not say complete"
    assert json.loads((out / "lock.json").read_text())["pid"] == pid, "the dead job's lock"

    resumed = run([*argv, "--resume"], tmp_path / "resumed")
    computed, skipped, planned = resume_counts(resumed)
    assert skipped == len(before), "every tile journaled before the kill is kept"
    assert computed == planned - len(before), "only the unfinished tiles are computed"
    assert re.search(rf"stale lock .*pid {pid} .*taking it over", resumed.stderr), resumed.stderr
    assert not (out / "lock.json").exists(), "the lock is released at the end"
    assert attrs(out)["complete"] is True
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)
    assert digest(tmp_path / "a.zarr", tmp_path / "b.zarr") == inputs, "an input changed"


def test_torn_journal_entry_is_recomputed(tmp_path: Path, client: Client) -> None:
    # Stores without atomic writes can keep a half-written entry of a killed job; so can a
    # crash between writing an entry aside and renaming it.
    rng = np.random.default_rng(12)
    a, b = random_matrix(rng, (512, 100), "float32"), random_matrix(rng, (100, 512), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (128, 100))
    b_url = write_array(tmp_path / "b.zarr", b, (100, 128))
    out = tmp_path / "c.zarr"
    first = multiply(a_url, b_url, str(out), client=client)
    assert first.tiles_computed >= 2
    entries = sorted((out / "journal").iterdir())
    assert all(e.suffix == ".json" for e in entries), "no .partial file is left by a run"
    torn = entries[0].read_bytes()
    entries[0].write_bytes(torn[: len(torn) // 2])
    partial = f"{entries[1].name}.{'ab' * 16}.partial"  # as ours are named: uuid4 hex
    (out / "journal" / partial).write_bytes(torn[:7])
    unfinished = OutRecord.from_dict({**attrs(out), "complete": False})
    zarr.open_array(str(out), mode="r+").attrs.update(unfinished.attributes())

    resumed = multiply(a_url, b_url, str(out), client=client, resume=True)
    assert resumed.tiles_computed == 1
    assert resumed.tiles_skipped == first.tiles_computed - 1
    assert attrs(out)["complete"] is True
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)


@pytest.mark.slow
def test_resume_costs_at_most_0_6_of_a_fresh_run(tmp_path: Path) -> None:
    """The workers' CPU seconds (the resume check included), which other work on the machine
    does not change as it does wall time; the job is long against the workers' start-up:
    10240² float32, 16 tiles. Medians of 2. The wall-clock target, the CLI's start-up
    included, is benchmarks/resume_cost.py's."""
    a_url, b_url = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    write_random(a_url, (10240, 10240), (1280, 1280), "float32", seed=1)
    write_random(b_url, (10240, 10240), (1280, 1280), "float32", seed=2)
    fresh, resumed, halves = [], [], []
    for attempt in range(2):
        options = ("--memory-limit", "600MiB")
        done = run(multiply_argv(a_url, b_url, tmp_path / f"fresh{attempt}.zarr", *options),
                   tmp_path / f"fresh{attempt}")  # fmt: skip
        assert done.returncode == 0, done.stderr
        total = first_int(r"tiles computed (\d+)", done.stdout)
        fresh.append(workers_cpu(done))
        out = tmp_path / f"c{attempt}.zarr"
        argv = multiply_argv(a_url, b_url, out, *options)
        _, before = kill_midway(argv, out, tmp_path / f"killed{attempt}", at=total // 2)
        again = run([*argv, "--resume"], tmp_path / f"resumed{attempt}")
        computed, skipped, planned = resume_counts(again)
        assert (skipped, computed, planned) == (len(before), total - len(before), total)
        resumed.append(workers_cpu(again))
        halves.append(len(before) / total)
        _spot_check(out, a_url, b_url)
    ratio = statistics.median(resumed) / statistics.median(fresh)
    report = f"CPU fresh {fresh} s, resumed {resumed} s, done before the kill {halves}: {ratio:.2f}"
    print(report)
    assert ratio <= 0.6, report


def _spot_check(out: Path, a_url: str, b_url: str) -> None:
    """16 rows across the product against float64 numpy (all of it would take minutes)."""
    a, b, c = (zarr.open_array(u, mode="r") for u in (a_url, b_url, str(out)))
    picks = np.linspace(0, a.shape[0] - 1, num=16).astype(int)
    a64, b64 = np.asarray(a.oindex[picks, :], "float64"), np.asarray(b[:], "float64")
    error = np.abs(np.asarray(c.oindex[picks, :], "float64") - a64 @ b64)
    assert (error / (np.abs(a64) @ np.abs(b64))).max() <= 2e-4

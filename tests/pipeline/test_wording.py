"""What the command line says matches what it did: the arithmetic a product ran in, reads
against the lower bound of what this run computed, one line on Ctrl-C (on a terminal too), and
a refused --resume that names what differs."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply, prepare
from pipeline.errors import UsageError
from pipeline.options.job_options import MultiplyResult
from pipeline.plan.limits import computed_regions, read_lower_bound
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec
from pipeline.store import journal
from pipeline.store.output import Output
from pipeline.store.record import OutRecord, of_array
from pipeline.summary import arithmetic, format_summary
from tests.child_env import child_env
from tests.helpers import random_matrix, write_array
from tests.pipeline.test_cli_polish import POSIX, ctrl_c, job, slow_inputs, start_job

__all__ = ["job", "slow_inputs"]  # fixtures
GiB = 2**30
SMALL = 280 << 20
"""A memory limit that leaves each thread little fast memory: Smith's bound is the larger."""
INTERRUPTED = (
    "error: interrupted; the tiles written so far are kept: rerun the same command with "
    "--resume to finish OUT"
)


# --- the arithmetic: --precision fp32 is the dtype's own -------------------------------------


@pytest.mark.parametrize(("precision", "compute", "expected"), [
    ("fp32", "float32", "fp32"),
    ("fp32", "float64", "fp64"),  # float64 stays float64
    ("fp32", "complex64", "fp32 complex"),
    ("fp32", "complex128", "fp64 complex"),
    ("fp32", "int64", "exact int64"),  # products that could overflow are refused
    ("tf32", "float32", "tf32"),
    ("3xtf32", "float32", "3xtf32"),
])  # fmt: skip
def test_arithmetic_names_what_runs(precision: str, compute: str, expected: str) -> None:
    assert arithmetic(precision, compute) == expected


def _inputs(tmp_path: Path, dtype: str) -> tuple[str, str]:
    rng = np.random.default_rng(1)
    a, b = random_matrix(rng, (30, 20), dtype), random_matrix(rng, (20, 25), dtype)
    return write_array(tmp_path / "a.zarr", a, (10, 10)), write_array(
        tmp_path / "b.zarr", b, (10, 10)
    )


def _result(plan: MatmulPlan, **fields: Any) -> MultiplyResult:
    given = {"tiles_computed": plan.n_tiles, "tiles_skipped": 0, "bytes_read": 0, **fields}
    return MultiplyResult(
        plan.out.shape, plan.out.dtype, 1.0, given["tiles_computed"], given["tiles_skipped"],
        given["bytes_read"], "cpu", plan,
    )  # fmt: skip


@pytest.mark.parametrize(("dtype", "options", "plan_says", "done_says"), [
    ("float64", {}, "fp64 (the dtype's own arithmetic)", "precision fp64)"),
    ("float64", {"dtype": "float32"}, "fp32 (the dtype's own arithmetic)", "precision fp32)"),
    ("int16", {"dtype": "int64"}, "exact int64 (the dtype's own arithmetic)",
     "precision exact int64)"),
    ("float32", {"dtype": "float16"}, "fp32 (the dtype's own arithmetic)", "precision fp32)"),
])  # fmt: skip
def test_plan_and_summary_name_the_dtypes_arithmetic(
    tmp_path: Path, dtype: str, options: dict[str, Any], plan_says: str, done_says: str
) -> None:
    a, b = _inputs(tmp_path, dtype)
    job = prepare(a, b, str(tmp_path / "c.zarr"), **options)
    assert re.search(rf"^precision +{re.escape(plan_says)}$", job.describe(), re.M), job.describe()
    assert done_says in format_summary(_result(job.plan))
    assert job.plan.precision == "fp32"  # what OUT records and --precision takes


# --- reads against the lower bound of what this run computed ---------------------------------


def _plan(symmetric: bool = False, rows: bool = False, memory: int = GiB) -> MatmulPlan:
    """1024x768 @ 768x1024 (B in float64; a Gram product's X in float32) in a 4x4 grid of 256²
    tiles (a Gram product's on and above the diagonal)."""
    a = ArraySpec((1024, 768), (256, 256), "float32")
    b = ArraySpec((768, 1024), (256, 256), "float32" if symmetric else "float64")
    return plan_matmul(
        a, b, workers=1, threads_per_worker=2, memory_limit_bytes=memory, tile_shape=(256, 256),
        symmetric=symmetric, transposed=(not rows, rows) if symmetric else (False, False),
    )  # fmt: skip


@pytest.mark.parametrize("plan", [
    _plan(),
    _plan(memory=SMALL),  # Smith's bound above the compulsory reads
    _plan(symmetric=True),
    _plan(symmetric=True, rows=True),
], ids=["plain", "smith", "gram", "gram-rows"])  # fmt: skip
def test_the_whole_products_part_is_the_plans_bound(plan: MatmulPlan) -> None:
    assert read_lower_bound(plan, computed_regions(plan, set(), {})) == (
        plan.lower_bound_read_bytes
    )


def test_a_parts_bound_counts_what_it_needs() -> None:
    plan = _plan()
    k, tiles = 768, {t.index for t in plan.tiles()}
    one = computed_regions(plan, tiles - {(1, 2)}, {})
    assert one == (((256, 512), (512, 768)),)
    assert read_lower_bound(plan, one) == k * (256 * 4 + 256 * 8)  # its A rows, its B columns
    # A tile in flight kept its bands up to row 448: only its last 64 rows are computed.
    kept = computed_regions(plan, tiles - {(1, 2)}, {(1, 2): (448, 0)})
    assert kept == (((448, 512), (512, 768)),)
    assert read_lower_bound(plan, kept) == k * (64 * 4 + 256 * 8)
    # Where Smith's bound exceeds the compulsory reads, it counts in proportion to the part.
    smith = _plan(memory=SMALL)
    whole = smith.lower_bound_read_bytes
    assert whole > smith.compulsory_read_bytes
    most = computed_regions(smith, {(0, 0)}, {})  # every row and column is still needed
    assert read_lower_bound(smith, most) == int(whole * 15 / 16) > smith.compulsory_read_bytes


def test_a_resumes_reads_are_not_compared_with_the_whole_product(
    tmp_path: Path, client: Client
) -> None:
    """A real --resume that computes one tile of two: it reads all of A and half of B, which
    no schedule computing that tile can beat; against the whole product's bound it was 0.75x."""
    rng = np.random.default_rng(2)
    a, b = random_matrix(rng, (512, 64), "float32"), random_matrix(rng, (64, 512), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (128, 64))
    b_url = write_array(tmp_path / "b.zarr", b, (64, 128))
    out = str(tmp_path / "c.zarr")
    first = multiply(a_url, b_url, out, client=client)
    assert first.plan.grid == (1, 2), first.plan.grid
    (tmp_path / "c.zarr" / journal.entry_name((0, 1))).unlink()  # as if stopped before it
    record = of_array(zarr.open_array(out))
    assert record is not None and record.fingerprint is not None
    Output(out).mark(record.fingerprint, complete=False)
    resumed = multiply(a_url, b_url, out, client=client, resume=True)
    text = format_summary(resumed)
    assert "tiles computed 1, skipped 1" in text, text
    ratio = re.search(r"\(([\d.]+) x lower bound", text)
    assert ratio is None or float(ratio.group(1)) >= 1.0, text
    if ratio is None:  # the job gave no bound of its part: said so, not compared
        assert "(for the part computed in this run, whose lower bound is not known)" in text
    else:
        assert "x lower bound of the part computed in this run); " in text, text


def test_a_summary_says_what_its_reads_are_compared_with() -> None:
    plan = _plan()
    whole = plan.lower_bound_read_bytes
    fresh = format_summary(_result(plan, bytes_read=whole))
    assert "(1.00 x lower bound); " in fresh, fresh
    resumed = format_summary(
        _result(plan, tiles_computed=4, tiles_skipped=12, bytes_read=whole // 4)
    )
    assert "x lower bound)" not in resumed, resumed
    assert "(for the part computed in this run, whose lower bound is not known)" in resumed
    finished = format_summary(_result(plan, tiles_computed=0, tiles_skipped=16))
    assert "; read 0 B (no tile computed in this run); " in finished, finished


# --- Ctrl-C: one line ------------------------------------------------------------------------


SMALL_TILES = ("--dtype", "int64", "--memory-limit", "300MiB")
"""Integer tiles of a few CPU-seconds each: the running ones stop soon after Ctrl-C (the
job's wait for them gives up, with a line of its own, after 30 s)."""


def after_start(stderr: str) -> list[str]:
    """The non-empty lines after the job's start-up lines (cluster, backend)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    return [line for line in lines if not line.startswith(("started ", "backend: "))]


@POSIX
def test_ctrl_c_in_a_pipe_says_one_line(
    tmp_path: Path,
    slow_inputs: tuple[str, str, np.ndarray, np.ndarray],
    job: list[Any],
) -> None:
    a_url, b_url, _, _ = slow_inputs
    process, seen = start_job(job, "multiply", a_url, b_url, str(tmp_path / "c.zarr"), *SMALL_TILES)
    ctrl_c(process)
    _, rest = process.communicate(timeout=60)
    assert process.returncode == 1, seen + rest
    assert after_start(seen + rest) == [INTERRUPTED], seen + rest


def screen(output: bytes, columns: int) -> list[str]:
    """The rows a terminal ``columns`` wide shows after ``output``: text wraps at the edge;
    CR, LF, erase to the end of the row (ESC [K) and cursor up (ESC [A) act."""
    rows: list[list[str]] = [[]]
    row = col = 0
    text, i = output.decode(errors="replace"), 0
    while i < len(text):
        if text.startswith("\x1b[K", i):
            del rows[row][col:]
            i += 3
            continue
        if text.startswith("\x1b[A", i):
            row, i = max(row - 1, 0), i + 3
            continue
        ch, i = text[i], i + 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
        else:
            if col == columns:
                row, col = row + 1, 0
            while len(rows) <= row:
                rows.append([])
            rows[row][col : col + 1] = [ch]
            col += 1
        while len(rows) <= row:
            rows.append([])
    return ["".join(r) for r in rows]


@POSIX
def test_ctrl_c_on_a_terminal_leaves_one_line(
    tmp_path: Path, slow_inputs: tuple[str, str, np.ndarray, np.ndarray]
) -> None:
    """Ctrl-C typed on an 80-column terminal (the terminal sends SIGINT to the job's process
    group): the progress line as it was, then the one error line; the waiting notice shown
    meanwhile is gone, and no wrapped progress line left rows behind."""
    a_url, b_url, _, _ = slow_inputs
    argv = ["multiply", a_url, b_url, str(tmp_path / "c.zarr"), *SMALL_TILES]
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own on the terminal, 80 columns, no echo of ^C
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        mode = termios.tcgetattr(0)
        mode[3] &= ~(termios.ECHO | termios.ECHOCTL)
        termios.tcsetattr(0, termios.TCSANOW, mode)
        os.execvpe(
            sys.executable, [sys.executable, "-m", "pipeline", *argv], child_env(slow_integers=True)
        )
    output, sent, deadline = b"", False, time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            if not sent and b"tiles " in output:
                time.sleep(0.5)  # tiles are running
                os.write(fd, b"\x03")  # Ctrl-C, as typed
                sent = True
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the job ended: the terminal's other side is closed
                    break
                if not chunk:
                    break
                output += chunk
    finally:
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert sent, output
    assert os.waitstatus_to_exitcode(status) == 1, output
    rows = [r for r in screen(output, 80) if r.strip()]
    progress = [i for i, r in enumerate(rows) if r.startswith("tiles ")]
    assert len(progress) == 1, rows  # drawn in place, never wrapped
    assert "".join(rows[progress[0] + 1 :]) == INTERRUPTED, rows


# --- a refused --resume names what differs ---------------------------------------------------


def _out(tmp_path: Path, record: OutRecord, shape: tuple[int, int] = (1024, 1024)) -> Output:
    out = Output(str(tmp_path / "c.zarr"))
    out.create(shape, (256, 256), "float32", record)
    return out


STARTED = OutRecord(fingerprint="f0", complete=False, tile_shape=(256, 256))


@pytest.mark.parametrize(("started", "plan", "alpha", "expected"), [
    (dataclasses.replace(STARTED, transpose_b=True), _plan(), 1.0,
     "was started with --transpose-b and this run has no --transpose-b; rerun with "
     "--transpose-b, or pass --overwrite to start over"),
    (STARTED, dataclasses.replace(_plan(), transposed=(True, False)), 1.0,
     "was started without --transpose-a and this run has --transpose-a; rerun without "
     "--transpose-a, or pass --overwrite to start over"),
    (dataclasses.replace(STARTED, transpose_b=True, precision="tf32"), _plan(), 1.0,
     "was started with --transpose-b and with --precision tf32, and this run has no "
     "--transpose-b and --precision fp32; rerun with --transpose-b and with --precision tf32, "
     "or pass --overwrite to start over"),
    (STARTED, _plan(), 2.0,
     "was started with --alpha 1 and this run has --alpha 2; rerun with --alpha 1, or pass "
     "--overwrite to start over"),
    (dataclasses.replace(STARTED, alpha=0.5), _plan(), 1.0,
     "was started with --alpha 0.5 and this run has --alpha 1; rerun with --alpha 0.5"),
    (dataclasses.replace(STARTED, symmetric=True, transpose_a=True), _plan(), 1.0,
     "was started as a Gram product (`gram`) and this run has a plain product (`multiply`); "
     "rerun `gram`"),
    (dataclasses.replace(STARTED, symmetric=True, transpose_a=True), _plan(True, rows=True), 1.0,
     "G ({url}) was started without --rows and this run has --rows; rerun without --rows"),
])  # fmt: skip
def test_resume_names_the_options_that_differ(
    tmp_path: Path, started: OutRecord, plan: MatmulPlan, alpha: float, expected: str
) -> None:
    out = _out(tmp_path, started)
    with pytest.raises(UsageError) as refused:
        out.finished_tiles(plan, "f9", started.to_dict(), alpha=alpha)
    message = str(refused.value)
    assert message.startswith("--resume: "), message
    assert expected.format(url=out.url) in message, message
    assert "fingerprint" not in message, message


def test_resume_says_in_words_when_only_the_inputs_differ(tmp_path: Path) -> None:
    out = _out(tmp_path, STARTED)
    with pytest.raises(UsageError) as refused:
        out.finished_tiles(_plan(), "f9", STARTED.to_dict(), alpha=1.0)
    assert str(refused.value) == (
        f"--resume: OUT ({out.url}) was started with other inputs: A or B is not the array it "
        "was started with, or its metadata (shape, chunks, dtype, codecs or attributes) changed "
        "since (fingerprint f0, this run's f9); rerun with the inputs it was started with, or "
        "pass --overwrite to start over"
    )
    other = _out(tmp_path / "other", STARTED, shape=(512, 1024))
    with pytest.raises(
        UsageError,
        match=r"is a 512x1024 product and this run's is 1024x1024: "
        r"A or B is not the array it was started with; rerun with the inputs",
    ):
        other.finished_tiles(_plan(), "f9", STARTED.to_dict(), alpha=1.0)
    # This run's --alpha not known: it may be the difference too.
    with pytest.raises(
        UsageError,
        match=r"; or this run's --alpha is another \(OUT was started "
        r"with --alpha 1\); rerun",
    ):
        out.finished_tiles(_plan(), "f9", STARTED.to_dict())

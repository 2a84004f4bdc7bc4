"""The command line's edges: -v after the command, suggestions for misspelled options, Ctrl-C,
a taken dashboard port, and an offline --report."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import zarr
from distributed import Client

from pipeline.cli.main import build_parser, dashboard_address, main, parse_args
from pipeline.store.record import of_array
from pipeline.summary import report_context
from tests.child_env import child_env
from tests.helpers import assert_product, random_matrix, run_cli, write_array

POSIX = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")


@pytest.mark.parametrize(
    ("argv", "debug"),
    [
        (["multiply", "a", "b", "c"], False),
        (["-v", "multiply", "a", "b", "c"], True),  # before the command, as always
        (["multiply", "a", "b", "c", "--debug"], True),  # after it, as error lines suggest
        (["verify", "a", "b", "c", "-v"], True),
        (["random", "x", "--shape", "2x2", "--chunks", "1x1", "--debug"], True),
    ],
)
def test_debug_is_accepted_before_or_after_the_command(argv: list[str], debug: bool) -> None:
    assert parse_args(build_parser(), argv).debug is debug


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["multiply", "a", "b", "c", "--memroy-limit", "2GiB"],
            "error: unrecognized arguments: --memroy-limit 2GiB; did you mean --memory-limit? "
            "(see `python -m pipeline multiply --help`)",
        ),
        (  # --option=value
            ["verify", "a", "b", "c", "--raunds=3"],
            "error: unrecognized arguments: --raunds=3; did you mean --rounds? "
            "(see `python -m pipeline verify --help`)",
        ),
        (  # nothing close: no suggestion
            ["multiply", "a", "b", "c", "--colour"],
            "error: unrecognized arguments: --colour (see `python -m pipeline multiply --help`)",
        ),
        (  # a misspelled choice
            ["multiply", "a", "b", "c", "--backend", "cdua"],
            "error: argument --backend: invalid choice: 'cdua' (choose from 'auto', 'cuda', "
            "'cpu', 'cublas', 'emulated'); did you mean 'cuda'? "
            "(see `python -m pipeline multiply --help`)",
        ),
        (  # a misspelled command
            ["multipy", "a", "b", "c"],
            "error: argument command: invalid choice: 'multipy' (choose from 'multiply', "
            "'gram', 'pca', 'svd', 'verify', 'doctor', 'random'); did you mean 'multiply'? "
            "(see `python -m pipeline --help`)",
        ),
    ],
)
def test_misspellings_get_a_suggestion(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_debug_after_the_command_shows_the_traceback(tmp_path: Path) -> None:
    args = ("multiply", str(tmp_path / "none.zarr"), str(tmp_path / "b"), str(tmp_path / "c"))
    plain = run_cli(*args)
    assert plain.returncode == 2 and plain.stderr.startswith("error: A (")
    assert len(plain.stderr.splitlines()) == 1, plain.stderr
    debug = run_cli(*args, "--debug")
    assert "Traceback" in debug.stderr and "InputNotFoundError" in debug.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dashboard_address_replaces_a_taken_port() -> None:
    port = free_port()
    assert dashboard_address(f"127.0.0.1:{port}") == f"127.0.0.1:{port}"
    assert dashboard_address("127.0.0.1:0") == "127.0.0.1:0"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert dashboard_address(f"127.0.0.1:{port}") == "127.0.0.1:0"
        assert dashboard_address(f":{port}") == ":0"


def test_a_normal_run_prints_only_our_lines_even_with_the_dashboard_port_taken(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(0)
    a, b = random_matrix(rng, (40, 30), "float32"), random_matrix(rng, (30, 20), "float32")
    urls = [write_array(tmp_path / n, x, (16, 16)) for n, x in (("a.zarr", a), ("b.zarr", b))]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(
            "multiply", *urls, str(tmp_path / "c.zarr"), "--verify",
            "--dashboard-address", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["started", "backend:"], done.stderr
    link = re.search(r"dashboard: http://127\.0\.0\.1:(\d+)/status", lines[0])
    assert link and int(link.group(1)) != port, lines[0]
    assert_product(zarr.open_array(str(tmp_path / "c.zarr"))[:], a, b)


@pytest.fixture(scope="module")
def slow_inputs(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, str, np.ndarray, np.ndarray]:
    """Integer products run numpy's loops in the jobs start_job starts (slow_integers), not
    BLAS: about 4 s of work on 2 threads here.
    int16 inputs into --dtype int64 (an int32 product could overflow any integer dtype)."""
    root = tmp_path_factory.mktemp("slow")
    rng = np.random.default_rng(0)
    a = rng.integers(-5, 5, (2048, 1024), dtype=np.int16)
    b = rng.integers(-5, 5, (1024, 2048), dtype=np.int16)
    return (
        write_array(root / "a.zarr", a, (256, 256)),
        write_array(root / "b.zarr", b, (256, 256)),
        a,
        b,
    )


@pytest.fixture
def job(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Started jobs, killed if a test leaves one running."""
    jobs: list[subprocess.Popen[str]] = []
    yield jobs
    for process in jobs:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


def start_job(jobs: list[subprocess.Popen[str]], *args: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m pipeline args`` in its own process group, as a terminal would, and
    return it once its cluster is up, with the stderr read so far."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(slow_integers=True),
        start_new_session=True,
    )
    jobs.append(process)
    assert process.stderr is not None
    seen, deadline = "", time.monotonic() + 60
    while "started " not in seen and time.monotonic() < deadline:
        if select.select([process.stderr], [], [], 1)[0]:
            line = process.stderr.readline()
            assert line, f"the job ended before its cluster started:\n{seen}"
            seen += line
    assert "started " in seen, seen
    time.sleep(0.5)  # the first tiles are running
    assert process.poll() is None, f"the job ended before it could be interrupted:\n{seen}"
    return process, seen


def ctrl_c(process: subprocess.Popen[str]) -> None:
    """What a terminal does on Ctrl-C: SIGINT to the whole foreground process group."""
    os.killpg(process.pid, signal.SIGINT)


@POSIX
def test_ctrl_c_ends_with_one_line_and_resume_finishes(
    tmp_path: Path,
    slow_inputs: tuple[str, str, np.ndarray, np.ndarray],
    job: list[subprocess.Popen[str]],
) -> None:
    a_url, b_url, a, b = slow_inputs
    out = str(tmp_path / "c.zarr")
    args = ("multiply", a_url, b_url, out, "--no-progress", "--dtype", "int64")
    process, seen = start_job(job, *args)
    ctrl_c(process)
    _, rest = process.communicate(timeout=60)
    stderr = seen + rest
    assert process.returncode == 1, stderr
    assert [line for line in stderr.splitlines() if line.startswith("error")] == [
        "error: interrupted; the tiles written so far are kept: rerun the same command with "
        "--resume to finish OUT"
    ], stderr
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr
    assert of_array(zarr.open_array(out)).complete is False
    resumed = run_cli("multiply", a_url, b_url, out, "--resume", "--no-progress")  # keeps int64
    assert resumed.returncode == 0, resumed.stderr
    assert_product(zarr.open_array(out)[:], a, b, "int64")


def deaf_to_sigint(pid: int) -> bool:
    """The process blocks or ignores SIGINT."""
    status = Path(f"/proc/{pid}/status").read_text()
    masks = [int(m, 16) for m in re.findall(r"^Sig(?:Blk|Ign):\s*([0-9a-f]+)$", status, re.M)]
    return any(mask & (1 << (signal.SIGINT - 1)) for mask in masks)


@POSIX
def test_worker_processes_never_see_ctrl_c_and_a_second_one_exits_at_once(
    tmp_path: Path,
    slow_inputs: tuple[str, str, np.ndarray, np.ndarray],
    job: list[subprocess.Popen[str]],
) -> None:
    a_url, b_url, _, _ = slow_inputs
    out = str(tmp_path / "c.zarr")
    args = ("multiply", a_url, b_url, out, "--workers", "2", "--dtype", "int64")
    process, seen = start_job(job, *args)
    children = psutil.Process(process.pid).children(recursive=True)
    assert len(children) >= 2, children  # the worker processes (and multiprocessing's tracker)
    assert all(deaf_to_sigint(child.pid) for child in children), children
    assert not deaf_to_sigint(process.pid)  # the CLI's main thread takes Ctrl-C
    ctrl_c(process)
    time.sleep(0.3)
    ctrl_c(process)
    started = time.monotonic()
    _, rest = process.communicate(timeout=60)
    assert time.monotonic() - started < 2.0
    stderr = seen + rest
    assert process.returncode == 1, stderr
    assert [line for line in stderr.splitlines() if line.startswith("error")] == [
        "error: interrupted again; stopped at once: the tiles written so far are kept: rerun "
        "the same command with --resume to finish OUT"
    ], stderr
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr


def test_report_context_writes_a_report_that_opens_offline(tmp_path: Path, client: Client) -> None:
    path = tmp_path / "report.html"
    with client.as_current(), report_context(str(path)):
        assert client.submit(sum, [1, 2]).result() == 3
    html = path.read_text()
    assert "Dask Performance Report" in html
    sources = re.findall(r"<script[^>]*\bsrc=\"([^\"]*)\"", html)
    assert sources == [], sources  # Bokeh's JavaScript is inline, not from cdn.bokeh.org
    assert "Bokeh.set_log_level" in html and len(html) > 500_000
    with report_context(None):  # no path: nothing to do
        pass


def test_multiply_report_opens_offline(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    urls = [
        write_array(tmp_path / n, random_matrix(rng, (20, 20), "float64"), (10, 10))
        for n in ("a.zarr", "b.zarr")
    ]
    report = tmp_path / "report.html"
    done = run_cli(
        "multiply", *urls, str(tmp_path / "c.zarr"), "--report", str(report),
        "--dashboard-address", "127.0.0.1:0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.findall(r"<script[^>]*\bsrc=\"([^\"]*)\"", report.read_text()) == []

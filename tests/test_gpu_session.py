"""benchmarks.gpu_session: the GPU machine's one prepared command. Without a GPU it skips every
step in seconds; its engine (timeouts, failures, the budget, the table) runs here on trivial
commands, and the figures are read from the real tools' own output formats."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import gpu_session
from benchmarks.gpu_session import BUDGET_S, INPUTS, NVCOMP_TEST, Probes, plan_steps
from benchmarks.gpu_session_figures import (
    cli_figures,
    doctor_figures,
    feed_figures,
    inspect_figures,
    kernels_figures,
    pytest_figures,
)
from benchmarks.gpu_session_run import SUMMARY, Step, run_session
from tests.helpers import REPO, run_cli

STEPS = [
    "doctor",
    "gpu tests",
    "kernels inspect",
    "kernels vs cuBLAS",
    INPUTS,
    "cli cuda fp32",
    "cli cuda tf32",
    "cli cublas",
    "feed",
]
VERSIONS = ["python", "numpy", "numba", "numba-cuda", "cupy", "dask", "distributed", "dask-cuda"]


def rows(summary: str) -> dict[str, list[str]]:
    """The step table's cells by step name."""
    table = summary.split("| step | status |")[1].split("\n\n")[0]
    cells = [line.strip("|").split(" | ") for line in table.splitlines()[2:]]
    return {c[0].strip(): [x.strip() for x in c[1:]] for c in cells}


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


# --- the command on a machine without a GPU ---------------------------------------------------


def test_without_a_gpu_every_step_is_skipped_in_seconds(tmp_path: Path) -> None:
    # No nvidia-smi on PATH: the same "no GPU" on a GPU machine.
    (tmp_path / "bin").mkdir()
    started = time.perf_counter()
    done = run_cli("--out", str(tmp_path / "out"), module="benchmarks.gpu_session",
                   env={"PATH": str(tmp_path / "bin")}, timeout=60)  # fmt: skip
    assert time.perf_counter() - started < 30  # ~0.5 s idle
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [SUMMARY]
    summary = (tmp_path / "out" / SUMMARY).read_text()
    assert "**Result: all passed or skipped**" in summary
    assert "| device | no GPU: nvidia-smi is not on PATH |" in summary
    for name in [*VERSIONS, "zarr"]:
        assert re.search(rf"^\| {name} \| \S", summary, re.M), name
    table = rows(summary)
    assert list(table) == STEPS
    assert all(cells[:2] == ["skipped: no GPU", "-"] for cells in table.values()), table
    assert not list(Path(gpu_session.NO_SCRATCH).parent.glob("gpu-session-XXXXXXXX"))


# --- the plan for a GPU machine ---------------------------------------------------------------


def test_the_plan_fits_one_device_call_in_at_most_eight_files() -> None:
    steps = plan_steps("python3", Path("/scratch"), Probes())
    assert [s.name for s in steps] == STEPS
    assert sum(s.timeout_s for s in steps) <= BUDGET_S <= 9.5 * 60 - 20
    assert len({s.log for s in steps}) + 1 <= 8  # the logs and summary.md
    words = [word for s in steps for c in s.commands for word in c]
    assert all(w.startswith("/scratch/") for w in words if w.endswith((".zarr", ".md"))), words
    by_name = {s.name: s for s in steps}
    clis = [shlex.join(by_name[f"cli {tag}"].commands[0]) for tag in ("cuda fp32", "cuda tf32")]
    assert all("--backend cuda" in c and "--verify" in c for c in clis)
    assert "--precision tf32" in clis[1] and "--precision" not in clis[0]
    assert "--backend cublas --verify" in shlex.join(by_name["cli cublas"].commands[0])
    assert all(by_name[n].needs == INPUTS for n in ("cli cublas", "feed"))
    assert by_name[INPUTS].commands[1][5:7] == ("--shape", "16384x16384")
    assert by_name["feed"].commands[0][-1] == "--real"
    assert dict(by_name["gpu tests"].env) == {"TILEGEMM_TEST_GPU": "1"}


@pytest.mark.parametrize(
    ("probes", "deselected"),
    [
        (Probes(nvcomp=False), True),  # nvCOMP not carried: its test deselected
        (Probes(nvcomp=True), False),  # nvCOMP there: every gpu test runs
    ],
)
def test_the_nvcomp_test_is_deselected_without_nvcomp(probes: Probes, deselected: bool) -> None:
    (tests,) = plan_steps("python3", Path("/s"), probes)[1].commands
    assert tests[:5] == ("python3", "-m", "pytest", "-m", "gpu")
    assert (NVCOMP_TEST in tests) == deselected
    path, name = NVCOMP_TEST.split("::")
    assert f"def {name}(" in (REPO / path).read_text()


def test_without_pytest_timeout_the_gpu_tests_still_start(tmp_path: Path) -> None:
    """pyproject's `timeout` is pytest-timeout's key: --strict-config refuses it when the plugin
    is absent (`-p no:timeout` here), so the command drops --strict-config from addopts."""
    command = gpu_session.pytest_command(sys.executable, Probes(pytest_timeout=False))
    assert "--strict-config" not in " ".join(command)
    done = run_cli(*command[3:], "-p", "no:timeout", "--co", "-q", "tests/test_layers.py",
                   module="pytest", env={"TILEGEMM_TEST_GPU": None})  # fmt: skip
    assert done.returncode == 5, done.stdout + done.stderr  # 5: collected, none marked gpu
    assert "Unknown config option" not in done.stdout + done.stderr


def test_kernels_inspect_is_skipped_without_the_cuda_tools() -> None:
    steps = plan_steps("python3", Path("/s"), Probes(inspect_missing="no ptxas", cc="8.0"))
    assert steps[2].skip == "no ptxas"
    assert steps[2].commands[0][4:6] == ("--cc", "8.0")


def test_the_steps_never_run_the_simulator() -> None:
    env = gpu_session.step_env({"NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": "/deps", "X": "y"})
    assert "NUMBA_ENABLE_CUDASIM" not in env and env["X"] == "y"
    assert env["PYTHONPATH"] == os.pathsep.join((str(REPO), "/deps"))


FAKE_SMI = """#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-0000)";;
  *compute_cap*) echo "9.0";;
  *query-gpu*) echo "NVIDIA H200, 143771 MiB, 580.65.06";;
  *) echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |";;
esac
"""


@pytest.mark.parametrize(
    ("script", "found"),
    [
        (FAKE_SMI, "GPU 0: NVIDIA H200 (UUID: GPU-0000)"),  # a GPU listed
        ("#!/bin/sh\necho 'No devices were found'; exit 6\n", None),  # a driver, no GPU
        (None, None),  # no nvidia-smi at all
    ],
)
def test_a_gpu_is_what_nvidia_smi_lists(tmp_path: Path, script: str | None, found: str) -> None:
    if script is not None:
        (tmp_path / "nvidia-smi").write_text(script)
        (tmp_path / "nvidia-smi").chmod(0o755)
    smi, gpus = gpu_session.detect_gpu(str(tmp_path))
    assert (gpus if smi else None) == found
    if smi:
        assert gpu_session.describe_gpu(smi) == {
            "device": "NVIDIA H200 (143771 MiB)",
            "driver": "580.65.06",
            "CUDA": "13.0",
            "compute capability": "9.0",
        }


# --- the engine, on trivial commands ----------------------------------------------------------


def session(
    tmp_path: Path, steps: list[Step], budget_s: float = 60
) -> tuple[int, dict[str, list[str]], str]:
    """run_session's exit code, its table's cells by step, and summary.md."""
    code = run_session(steps, tmp_path, {"device": "test"}, dict(os.environ), budget_s)
    summary = (tmp_path / SUMMARY).read_text()
    return code, rows(summary), summary


def test_a_step_that_times_out_is_recorded_and_the_next_one_runs(tmp_path: Path) -> None:
    started = time.perf_counter()
    code, table, _ = session(
        tmp_path,
        [
            Step("slow", (py("import time; time.sleep(60)"),), 1, "a.log"),
            Step("quick", (py("print('quick ran')"),), 30, "a.log"),
        ],
    )
    assert time.perf_counter() - started < 20  # not the 60 s sleep
    assert code == 1
    assert table["slow"][0] == "timed out after 1 s" and table["quick"][0] == "passed"
    log = (tmp_path / "a.log").read_text()
    assert "time.sleep(60)" in log and "quick ran" in log  # one log for both
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.log", SUMMARY]


def test_a_step_that_times_out_is_ended_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    session(tmp_path, [Step("spawns", (py(code),), 5, "a.log")])
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def alive(pid: int) -> bool:
    """Running: a zombie (dead, not yet reaped by a container's init) does not count."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_failing_step_fails_the_session_and_the_table_is_written(tmp_path: Path) -> None:
    code, table, summary = session(
        tmp_path,
        [
            Step(
                "inputs", (py("pass"), py("raise SystemExit(3)"), py("print('never')")), 30, "a.log"
            ),
            Step("uses inputs", (py("pass"),), 30, "a.log", needs="inputs"),
            Step("independent", (py("pass"),), 30, "b.log"),
            Step("known absent", (py("pass"),), 30, "c.log", skip="no ptxas"),
        ],
    )
    assert code == 1
    assert table["inputs"][0] == "failed rc 3"
    assert table["uses inputs"][0] == "skipped: needs inputs (failed rc 3)"
    assert table["independent"][0] == "passed" and table["known absent"][0] == "skipped: no ptxas"
    assert "**Result: FAILED: inputs (failed rc 3)**" in summary
    assert "print('never')" not in (tmp_path / "a.log").read_text()  # the step stopped at rc 3
    assert not (tmp_path / "c.log").exists()


def test_the_budget_bounds_the_session(tmp_path: Path) -> None:
    code, table, _ = session(
        tmp_path,
        [
            Step("long", (py("import time; time.sleep(60)"),), 30, "a.log"),
            Step("after", (py("pass"),), 30, "a.log"),
        ],
        budget_s=1.5,
    )
    assert code == 1
    assert table["long"][0] == "timed out after 1.5 s"
    assert table["after"][0] == "skipped: the session's 1.5 s were spent"


def test_the_cli_runs_figures_come_from_its_summary_line(tmp_path: Path) -> None:
    """A real CLI run (CPU, tiny) through the engine: the figures column reads its line."""
    cli = (sys.executable, "-m", "pipeline")
    a, b, c = (str(tmp_path / f"{x}.zarr") for x in "abc")
    shape = ("--shape", "64x64", "--chunks", "32x32")
    inputs = tuple((*cli, "random", url, *shape) for url in (a, b))
    options = ("--backend", "cpu", "--workers", "1", "--verify", "--no-progress")
    multiply = (*cli, "multiply", a, b, c, *options, "--dashboard-address", "127.0.0.1:0")
    code, table, _ = session(
        tmp_path / "out",
        [
            Step("inputs", inputs, 60, "cli.log"),
            Step("cli", (multiply,), 120, "cli.log", cli_figures, needs="inputs"),
        ],
    )
    assert code == 0, (tmp_path / "out" / "cli.log").read_text()
    assert re.fullmatch(r"[\d.]+ s, [\d.]+ GFLOP/s, verify passed", table["cli"][2]), table


# --- figures from the tools' own formats -------------------------------------------------------


def test_kernels_figures() -> None:
    from benchmarks.gpu_kernels import Row, format_table

    table = format_table(
        [
            Row(4096, "float32", "cublas", False, 0.004, 0.0),
            Row(4096, "float32", "blocked_float32", True, 0.008, 1e-6),
            Row(4096, "float32", "mma_tf32", False, 0.002, 1e-3),
        ],
        "NVIDIA H200",
    )
    assert kernels_figures(table) == (
        "4096: cublas 34.36, blocked_float32* 17.18 (0.50), mma_tf32 68.72 (2.00) TFLOP/s "
        "(x cuBLAS)"
    )


def test_inspect_figures() -> None:
    from kernels.inspect.machine_code import format_table

    def report(name: str, missed: list[str]) -> dict[str, object]:
        counts = ("regs", "spill_bytes", "local_bytes", "shared_bytes", "ffma", "instructions")
        fixed = {"name": name, "default": True, "ffma_share": 0.5, "ffma_per_lds": 2}
        loads = {"lds32": 0, "lds64": 0, "lds128": 4, "fp64_instructions": None, "ptx": "/x.ptx"}
        return {**dict.fromkeys(counts, 1), **fixed, **loads, "targets_missed": missed}

    text = format_table([report("blocked_float32", []), report("mma_tf32", ["hmma 4 < 8"])])
    assert inspect_figures(text) == "2 variants, targets missed by: mma_tf32"


def test_feed_figures(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import gpu_feed

    plan = SimpleNamespace(flops=8.8e12, estimated_seconds=2.0, bound_by="kernel")
    measured = {"window": 4.0, "busy": 0.75, "plan": plan}
    monkeypatch.setattr(gpu_feed, "measure_busy", lambda *args: measured)
    gpu_feed.real("a.zarr", "b.zarr", None)
    assert feed_figures(capsys.readouterr().out) == "busy 0.75 of a 4.00 s window, 2.20 TFLOP/s"


@pytest.mark.parametrize(
    ("reader", "text", "figures"),
    [
        (pytest_figures, "x\n====== 11 passed, 1 deselected in 80.12s (0:01:20) ======\n",
         "11 passed, 1 deselected in 80.12s (0:01:20)"),
        (doctor_figures, "[pass] cpu  ok\n[fail] kernels  x\ndoctor: no GPU ready. 1 failed.\n",
         "doctor: no GPU ready. 1 failed: kernels"),
        (cli_figures, "no summary line", ""),  # a run that died early
    ],
)  # fmt: skip
def test_text_figures(reader: Callable[[str], str], text: str, figures: str) -> None:
    assert reader(text) == figures


def test_a_command_that_cannot_start_fails_its_step(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    code, table, _ = session(tmp_path, [Step("absent", ((missing, "-V"),), 30, "a.log")])
    assert code == 1 and table["absent"][0] == "failed rc 127"
    assert "cannot start" in (tmp_path / "a.log").read_text()

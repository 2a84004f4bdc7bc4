"""A GPU machine's first-contact table from one command, in under 9½ minutes (make gpu-session).

    python -m benchmarks.gpu_session --out DIR

Runs, each step a subprocess under its own timeout: the doctor (--require-gpu), the `gpu` tests,
`kernels inspect` (when ptxas and cuobjdump are installed), the kernels against cuBLAS, the CLI
at 16384² float32 from zstd Zarr with --verify (cuda fp32, cuda tf32, cublas) and the feed
(benchmarks.gpu_feed --real). A step that fails or times out is recorded and the next one runs;
one that times out is ended with every process it started. The inputs live in a temporary
folder, removed at the end. DIR gets summary.md (the device, the versions, a row per step: status,
seconds, the figures read from its output) and a log per group of steps: at most 8 files.
summary.md is rewritten after every step, so a session cut short still leaves its table.

Without a GPU (no nvidia-smi on PATH that lists one) every step is skipped: seconds, exit 0.
Exit 1 when a step failed or timed out. NUMBA_ENABLE_CUDASIM is removed from the steps'
environment: it would time the simulator.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from benchmarks.gpu_session_figures import (
    cli_figures,
    doctor_figures,
    feed_figures,
    inspect_figures,
    kernels_figures,
    pytest_figures,
)
from benchmarks.gpu_session_run import ROOT, SUMMARY, Step, run_session

BUDGET_S = 550.0
"""The session's wall-clock limit in seconds: steps still waiting then are skipped (9½ minutes
less what ending a step and removing the inputs take). It fits one device call (at most 10
minutes) with time left in a 15-minute lease for the machine's start and a short rerun. The
step timeouts allow for numba-cuda's first compile in each process: about 25 s on an H200 with
NumPy 2.5."""
SIZE, CHUNK = 16384, 2048
"""The CLI runs' n x n float32 inputs and their chunks."""
INPUTS = f"inputs {SIZE}² zstd"
NVCOMP_TEST = "tests/kernels/test_device_decode.py::test_nvcomp_decodes_zarr_zstd_frames"
NO_SCRATCH = str(Path(tempfile.gettempdir(), "gpu-session-XXXXXXXX"))
"""The inputs' folder shown in the commands of a session without a GPU (none is made)."""
PACKAGES = ("numpy", "numba", "numba-cuda", "cupy", "dask", "distributed", "dask-cuda", "zarr")


@dataclass(frozen=True)
class Probes:
    """What the GPU machine has, read before the steps are planned."""

    nvcomp: bool = False
    """``from nvidia import nvcomp`` works (the nvCOMP test runs)."""
    pytest_timeout: bool = True
    """pytest-timeout is installed (pyproject's `timeout` key is its own)."""
    inspect_missing: str | None = None
    """Why ``kernels inspect`` cannot run here, if it cannot."""
    cc: str = "9.0"
    """The GPU's compute capability."""


# --- the steps ----------------------------------------------------------------------------------


def plan_steps(python: str, scratch: Path, probes: Probes) -> list[Step]:
    """The session's steps, in order; their timeouts sum to under BUDGET_S."""

    def m(template: str) -> tuple[str, ...]:  # {tmp} filled in after splitting: one word
        return (python, "-m", *(word.format(tmp=scratch) for word in template.split()))

    a_b = "{tmp}/a.zarr {tmp}/b.zarr"
    shape = f"--shape {SIZE}x{SIZE} --chunks {CHUNK}x{CHUNK}"
    inputs = tuple(m(f"pipeline random {{tmp}}/{x}.zarr {shape} --seed {i} --overwrite")
                   for i, x in enumerate("ab", 1))  # fmt: skip
    inspect = m(f"kernels inspect --cc {probes.cc} --ptx-dir {{tmp}}/ptx")
    kernels = m("benchmarks.gpu_kernels --sizes 4096,8192 --dtype float32 --repeats 5 "
                "--out {tmp}/gpu_kernels.md")  # fmt: skip
    gpu = (("TILEGEMM_TEST_GPU", "1"),)
    steps = [
        Step("doctor", (m("pipeline doctor --require-gpu"),), 90, "doctor.log", doctor_figures),
        Step("gpu tests", (pytest_command(python, probes),), 120, "test-gpu.log",
             pytest_figures, env=gpu),
        Step("kernels inspect", (inspect,), 30, "inspect.log", inspect_figures,
             skip=probes.inspect_missing),
        Step("kernels vs cuBLAS", (kernels,), 75, "gpu_kernels.log", kernels_figures),
        Step(INPUTS, inputs, 25, "cli.log"),
    ]  # fmt: skip
    for tag, options, timeout_s in (
        ("cuda fp32", "--backend cuda", 70),
        ("cuda tf32", "--backend cuda --precision tf32", 55),
        ("cublas", "--backend cublas", 40),
    ):
        multiply = m(f"pipeline multiply {a_b} {{tmp}}/c-{tag.replace(' ', '-')}.zarr {options} "
                     "--verify --no-progress --dashboard-address 127.0.0.1:0")  # fmt: skip
        steps.append(
            Step(f"cli {tag}", (multiply,), timeout_s, "cli.log", cli_figures, needs=INPUTS)
        )
    feed = m(f"benchmarks.gpu_feed {a_b} --real")
    steps.append(Step("feed", (feed,), 45, "gpu_feed.log", feed_figures, needs=INPUTS))
    return steps


def pytest_command(python: str, probes: Probes) -> tuple[str, ...]:
    """`make test-gpu`'s run: without nvCOMP its one test deselected; without pytest-timeout,
    pyproject's addopts less --strict-config, which would refuse the unknown `timeout` key."""
    command = [python, "-m", "pytest", "-m", "gpu", "--durations=10"]
    if not probes.nvcomp:
        command += ["--deselect", NVCOMP_TEST]
    if not probes.pytest_timeout:
        config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        words = shlex.split(config["tool"]["pytest"]["ini_options"]["addopts"])
        addopts = shlex.join(w for w in words if w != "--strict-config")
        command += ["-o", f"addopts={addopts}", "-W", "ignore::pytest.PytestConfigWarning"]
    return tuple(command)


def step_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The steps' environment: the repo first on PYTHONPATH (the rest kept), output unbuffered,
    and never the CUDA simulator."""
    env = {k: v for k, v in environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --- the machine ------------------------------------------------------------------------------


def detect_gpu(path: str | None = None) -> tuple[str | None, str]:
    """(nvidia-smi's path, its GPU lines) when it lists a GPU, else (None, why not); no CUDA
    library is loaded here."""
    smi = shutil.which("nvidia-smi", path=path)
    if smi is None:
        return None, "nvidia-smi is not on PATH"
    gpus = [line for line in _smi(smi, "-L").splitlines() if line.startswith("GPU ")]
    return (smi, "; ".join(gpus)) if gpus else (None, "nvidia-smi -L lists no GPU")


def describe_gpu(smi: str) -> dict[str, str]:
    """The summary's rows on the GPUs: device (name and memory, per GPU), driver, CUDA (the
    driver's version), compute capability (the first GPU's)."""
    query = _smi(smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
    gpus = [[cell.strip() for cell in line.split(",")] for line in query.splitlines()]
    gpus = [cells for cells in gpus if len(cells) == 3]
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", _smi(smi))
    caps = _smi(smi, "--query-gpu=compute_cap", "--format=csv,noheader").split()
    return {
        "device": "; ".join(f"{name} ({memory})" for name, memory, _ in gpus) or "unknown",
        "driver": gpus[0][2] if gpus else "unknown",
        "CUDA": cuda[1] if cuda else "unknown",
        "compute capability": caps[0] if caps else "unknown",
    }


def _smi(smi: str, *args: str) -> str:
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def probe(python: str, env: Mapping[str, str], cc: str) -> Probes:
    """What the steps depend on: nvCOMP (imported in a child), pytest-timeout, the CUDA tools."""
    from kernels.inspect.machine_code import find_tool

    try:
        nvcomp = (
            subprocess.run(
                [python, "-c", "from nvidia import nvcomp"],
                env=env,
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        nvcomp = False
    missing = []
    for tool in ("ptxas", "cuobjdump"):
        try:
            find_tool(tool)
        except FileNotFoundError:
            missing.append(tool)
    why = (
        f"no {' or '.join(missing)} in the nvidia wheels "
        "(pip install nvidia-cuda-nvcc nvidia-cuda-cuobjdump)"
    )
    has_timeout = importlib.util.find_spec("pytest_timeout") is not None
    return Probes(nvcomp, has_timeout, why if missing else None, cc)


def versions() -> dict[str, str]:
    """python's version and each of PACKAGES' (cupy's under its CUDA-specific name)."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = next(
                (
                    f"{d.version} ({d.metadata['Name']})"
                    for d in metadata.distributions()
                    if str(d.metadata["Name"]).lower().startswith(f"{name}-cuda")
                ),
                "not installed",
            )
    return found


# --- the command --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_session",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="summary.md and the logs' folder")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    # Killed by a time limit: still end the running step's processes and remove the inputs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    env = step_env(os.environ)
    smi, gpus = detect_gpu()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-session-") if smi else NO_SCRATCH)
    try:
        header = {"device": f"no GPU: {gpus}"}
        probes = Probes()
        if smi:
            header = {**describe_gpu(smi), "GPUs": gpus}
            cc = header["compute capability"]
            probes = probe(sys.executable, env, cc if re.fullmatch(r"\d+\.\d", cc) else "9.0")
        steps = plan_steps(sys.executable, scratch, probes)
        if not smi:
            steps = [replace(step, skip="no GPU") for step in steps]
        header |= versions()
        budget_s = BUDGET_S - (time.perf_counter() - started)
        code = run_session(steps, args.out, header, env, budget_s)
    finally:
        if smi:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"written: {args.out / SUMMARY} ({time.perf_counter() - started:.0f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""A plain install (no extras) has none of the GPU packages: every CPU path still runs, and each
GPU path says which extra to install (exit 2, one line).

No pip here: children run with a ``sitecustomize.py`` first on PYTHONPATH whose import finder
refuses the GPU packages as if they were not installed, and logs each attempt.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zarr

from kernels import backends
from kernels.backends import BACKENDS, probe_devices
from kernels.constants import CUBLAS_INSTALL, CUDA_INSTALL
from pipeline.doctor import checks as doctor
from pipeline.run.client import resolve_backend
from tests.child_env import child_env
from tests.helpers import assert_product

GPU_PACKAGES = (
    "numba", "numba_cuda", "dask_cuda", "cupy", "cupyx", "cupy_backends", "nvidia", "cuda",
    "llvmlite",
)  # fmt: skip
"""Top-level modules of the cuda and cublas extras (cuda: cuda-bindings' package)."""
NUMBA = ("numba", "numba_cuda", "llvmlite")
BLOCKER = """
import os
import sys

BLOCKED = {blocked!r}
LOG = os.environ.get("TILEGEMM_BLOCKED_LOG")


class NotInstalled:
    # First on sys.meta_path: these packages and their submodules are absent.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in BLOCKED:
            return None
        if LOG:
            with open(LOG, "a") as log:
                log.write(name + "\\n")
        raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


sys.meta_path.insert(0, NotInstalled())
"""


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose sitecustomize.py hides the GPU packages."""
    folder = tmp_path_factory.mktemp("light-site")
    (folder / "sitecustomize.py").write_text(BLOCKER.format(blocked=GPU_PACKAGES))
    return folder


def run_light(
    light: Path, *args: str, module: str = "pipeline", code: str | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``python -m module args`` (or ``python -c code``) without the GPU packages and outside
    the simulator, as a user's machine runs: the process and the GPU modules it tried."""
    log = light / "attempts.log"
    log.unlink(missing_ok=True)
    kept = os.pathsep.join(p for p in (str(light), os.environ.get("PYTHONPATH")) if p)
    env = child_env({"PYTHONPATH": kept, "TILEGEMM_BLOCKED_LOG": str(log)})
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    command = ["-c", code] if code is not None else ["-m", module, *args]
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, env=env, timeout=120
    )
    attempts = log.read_text().split() if log.exists() else []
    return done, attempts


def tried(attempts: list[str], packages: tuple[str, ...]) -> list[str]:
    return [name for name in attempts if name.partition(".")[0] in packages]


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a refused command (nothing else on stderr starts so)."""
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in done.stderr, done.stderr
    return line


@pytest.fixture(scope="module")
def inputs(light: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A (float32), B (float32) and X (float64) written by `random` without the packages."""
    folder = tmp_path_factory.mktemp("light-data")
    arrays = {"a": ("130x90", "64x40", "float32"), "b": ("90x70", "50x64", "float32")}
    arrays["x"] = ("75x40", "32x16", "float64")
    for seed, (name, (shape, chunks, dtype)) in enumerate(arrays.items(), start=1):
        done, attempts = run_light(
            light, "random", str(folder / f"{name}.zarr"), "--shape", shape, "--chunks", chunks,
            "--dtype", dtype, "--seed", str(seed),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert not tried(attempts, (*NUMBA, "dask_cuda")), attempts
    return {name: folder / f"{name}.zarr" for name in arrays}


def read(path: Path) -> Any:
    return zarr.open_array(str(path), mode="r")[...]


def test_the_packages_are_hidden_in_the_child(light: Path) -> None:
    code = (
        "import importlib\n"
        f"for name in {GPU_PACKAGES!r} + ('numba.cuda', 'cuda.bindings', 'nvidia.nvcomp'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise SystemExit(f'{name} imported')\n"
    )
    done, attempts = run_light(light, code=code)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(attempts) == set(GPU_PACKAGES)  # each refused at its top-level package


def test_multiply_verify_and_gram_run_on_the_cpu(
    light: Path, inputs: dict[str, Path], tmp_path: Path
) -> None:
    c, g = tmp_path / "c.zarr", tmp_path / "g.zarr"
    done, attempts = run_light(
        light, "multiply", str(inputs["a"]), str(inputs["b"]), str(c), "--verify"
    )
    assert done.returncode == 0, done.stderr
    assert "backend cpu" in done.stdout and "verify passed" in done.stdout, done.stdout
    assert not tried(attempts, NUMBA), attempts  # auto found no GPU without importing numba
    assert_product(read(c), read(inputs["a"]), read(inputs["b"]))

    done, attempts = run_light(light, "gram", str(inputs["x"]), str(g))
    assert done.returncode == 0, done.stderr
    x = read(inputs["x"])
    assert_product(read(g), x.T.copy(), x)
    assert not tried(attempts, NUMBA), attempts

    done, _ = run_light(light, "verify", str(inputs["a"]), str(inputs["b"]), str(c))
    assert done.returncode == 0, done.stderr
    wrong = zarr.open_array(str(c), mode="r+")
    wrong[3, 5] += 1.0
    done, _ = run_light(light, "verify", str(inputs["a"]), str(inputs["b"]), str(c))
    assert done.returncode == 1, done.stderr


def test_dry_run_needs_no_cluster_and_no_gpu_package(
    light: Path, inputs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "c.zarr"
    done, attempts = run_light(
        light, "multiply", str(inputs["a"]), str(inputs["b"]), str(out), "--dry-run"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("bound by:"), done.stdout
    assert not tried(attempts, (*NUMBA, "dask_cuda")) and not out.exists(), attempts


def test_doctor_names_the_extras_and_passes(light: Path) -> None:
    done, _ = run_light(light, "doctor", "--json")
    assert done.returncode == 0, done.stderr
    found = {c["check"]: c for c in json.loads(done.stdout)}
    assert found["versions"]["status"] == "pass" and found["cpu"]["status"] == "pass"
    detail = found["versions"]["detail"]
    assert f"numba, numba-cuda, dask-cuda not installed ({CUDA_INSTALL})" in detail, detail
    assert f"cupy-cuda13x not installed ({CUBLAS_INSTALL})" in detail, detail
    assert found["toolkit"]["status"] == "skip" and found["toolkit"]["fix"] == CUDA_INSTALL


@pytest.mark.parametrize(
    ("backend", "needs"),
    [
        ("cuda", f"--backend cuda needs the CUDA packages: {CUDA_INSTALL}"),
        ("cublas", f"--backend cublas needs CuPy with cuBLAS: {CUBLAS_INSTALL}"),
    ],
)
def test_a_gpu_backend_names_its_extra(
    light: Path, inputs: dict[str, Path], tmp_path: Path, backend: str, needs: str
) -> None:
    out = tmp_path / "c.zarr"
    done, _ = run_light(
        light, "multiply", str(inputs["a"]), str(inputs["b"]), str(out), "--backend", backend
    )
    assert done.returncode == 2, done.stderr
    assert error_line(done).startswith(f"error: {needs} (missing on 1 of 1 worker(s)")
    assert not out.exists()


def test_gpu_decode_names_the_cuda_extra(
    light: Path, inputs: dict[str, Path], tmp_path: Path
) -> None:
    done, _ = run_light(
        light, "multiply", str(inputs["a"]), str(inputs["b"]), str(tmp_path / "c.zarr"),
        "--gpu-decode",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert error_line(done).endswith(f"which needs the CUDA packages: {CUDA_INSTALL}")


def test_kernels_inspect_names_the_cuda_extra(light: Path) -> None:
    done, _ = run_light(light, "inspect", module="kernels")
    assert done.returncode == 2
    line = error_line(done)
    assert "the CUDA packages (No module named 'numba" in line
    assert line.endswith(f"): {CUDA_INSTALL}"), line


API_JOB = """
import json
import sys
import pipeline
result = pipeline.multiply({a!r}, {b!r}, {out!r})
print(json.dumps([result.backend, [m for m in {heavy!r} if m in sys.modules]]))
"""


@pytest.mark.parametrize("hidden", [True, False], ids=["plain-install", "full-install"])
def test_the_python_api_multiplies_on_the_cpu_without_numba(
    light: Path, inputs: dict[str, Path], tmp_path: Path, hidden: bool
) -> None:
    out = tmp_path / "c.zarr"
    code = API_JOB.format(a=str(inputs["a"]), b=str(inputs["b"]), out=str(out), heavy=NUMBA)
    if hidden:
        done, attempts = run_light(light, code=code)
        assert not tried(attempts, NUMBA), attempts
    else:  # the packages are there: the CPU job still never loads numba (seconds to import)
        env = child_env()
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["cpu", []], done.stdout
    assert_product(read(out), read(inputs["a"]), read(inputs["b"]))


# --- the same decisions in-process, for a host with GPUs but without the packages ----------


class FakeClient:
    """client.run(probe_devices, ...) as each worker would answer it."""

    def __init__(self, devices: dict[str, dict[str, bool]]) -> None:
        self.devices = devices

    def run(self, fn: Any, *args: Any) -> dict[str, dict[str, bool]]:
        return self.devices


def test_a_gpu_host_without_the_packages_probes_nothing_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def must_not_run() -> bool:
        raise AssertionError("the cuda probe imported numba without its packages")

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(backends, "driver_gpus", lambda: 2)
    monkeypatch.setattr(backends, "importable", lambda module: False)
    monkeypatch.setitem(BACKENDS, "cuda", dataclasses.replace(BACKENDS["cuda"], probe=must_not_run))
    found = probe_devices()
    assert found["seen"] and not found["gpu"] and found["cuda installed"] is False
    with caplog.at_level(logging.INFO, logger="pipeline"):
        chosen = resolve_backend(FakeClient({"tcp://w0": found}), "auto", "float32")  # type: ignore[arg-type]
    assert chosen == "cpu"
    assert f"1 worker(s) see a GPU but lack the CUDA packages: {CUDA_INSTALL}" in caplog.text


def test_count_gpus_without_dask_cuda_runs_on_the_cpu_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from cluster import lifecycle

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "dask_cuda.utils", None)  # import raises ImportError
    monkeypatch.setattr(lifecycle, "driver_gpus", lambda: 4)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        assert lifecycle.count_gpus() == 0
    assert "4 GPU(s) here, but dask-cuda is not installed" in caplog.text
    assert CUDA_INSTALL in caplog.text


def test_doctor_on_a_gpu_host_without_the_packages_fails_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "find_driver", lambda: "580.95")
    monkeypatch.setattr(doctor, "missing_packages", lambda backend: ("numba", "numba_cuda"))
    monkeypatch.setattr(doctor, "cpu_backend", lambda: doctor.Check("cpu", "pass", "stub"))
    assert doctor.run_doctor(True, False) == 1
    found = {c["check"]: c for c in json.loads(capsys.readouterr().out)}
    assert found["devices"]["status"] == "fail" and found["devices"]["fix"] == CUDA_INSTALL
    assert found["versions"]["status"] == "warn" and found["cluster"]["status"] == "skip"
    assert all(found[name]["status"] == "skip" for name in doctor.PROBE_CHECKS[1:])

"""`python -m pipeline doctor [--json] [--require-gpu]`: what works here, what does not, the fix.

One line per check, in order, going on past failures. CPU checks run here; every GPU probe runs
in a child process with a timeout (kernels.device.doctor_probe), so this process never makes a CUDA
context. Without an NVIDIA driver every GPU check is reported as skipped and the exit is 0; with
one (or under --require-gpu), any failed check exits 1.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from kernels.backends import importable, missing_packages
from kernels.constants import CUBLAS_INSTALL, CUDA_INSTALL

PROBE_CHECKS = ("devices", "kernels", "pinned", "bandwidth", "speed", "cublas", "figures", "nvcomp")
"""What the GPU probe reports (kernels.device.doctor_probe), in order."""
GPU_CHECKS = (*PROBE_CHECKS, "cluster")
"""Every GPU check: the probe's, then the LocalCUDACluster job (pipeline.doctor.cluster_check)."""
PROBE_TIMEOUT_S = 600
PACKAGES = ("numpy", "dask", "distributed", "zarr")
"""What the CPU path needs: every install has them."""
GPU_PACKAGES = (
    ("numba", "numba", CUDA_INSTALL),
    ("numba-cuda", "numba_cuda", CUDA_INSTALL),
    ("dask-cuda", "dask_cuda", CUDA_INSTALL),
    ("cupy-cuda13x", "cupy", CUBLAS_INSTALL),
)
"""(distribution, module, the command that installs it) of the GPU backends' packages, which
a plain install lacks: the cuda extra's, then the cublas extra's CuPy."""


@dataclass(frozen=True)
class Check:
    check: str
    status: str
    """"pass", "warn", "fail" or "skip"."""
    detail: str
    fix: str = ""


def run_doctor(as_json: bool, require_gpu: bool) -> int:
    driver = find_driver()
    checks = [versions(driver is not None or require_gpu), cuda_family(), toolkit(), cpu_backend()]
    if driver is None:
        status = "fail" if require_gpu else "skip"
        why = "no NVIDIA driver (no /dev/nvidia0, no libcuda)"
        fix = "run on a GPU machine, or expose its GPUs (docker run --gpus all)"
        checks.append(Check("driver", status, f"{why}: GPU checks skipped", fix))
        checks += [Check(name, "skip", "no GPU") for name in GPU_CHECKS]
    else:
        checks.append(Check("driver", "pass", driver))
        checks += gpu_probe()
        checks += cluster_check(checks)
    print(json.dumps([asdict(c) for c in checks], indent=1) if as_json else report(checks))
    failed = any(c.status == "fail" for c in checks)
    return 1 if failed and (driver is not None or require_gpu) else 0


def report(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{c.status}] {c.check:<11} {c.detail}")
        if c.fix and c.status != "pass":
            lines.append(f"{'':<19}fix: {c.fix}")
    failed = sum(c.status == "fail" for c in checks)
    gpu = any(c.check == "devices" and c.status == "pass" for c in checks)
    ready = "GPU path ready" if gpu and not failed else "CPU path ready (--backend cpu)"
    lines.append(f"doctor: {ready}. {failed} failed.")
    return "\n".join(lines)


def versions(gpu_wanted: bool = False) -> Check:
    """The CPU path's packages (fail when one is missing) and the GPU backends' (a plain
    install lacks them: a warning only where a GPU is here or asked for)."""
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} missing")
    missing = [f for f in found if f.endswith(" missing")]
    detail = f"python {sys.version.split()[0]} · " + ", ".join(found) + " · " + gpu_packages()
    if missing:
        return Check("versions", "fail", detail, "pip install -c requirements/constraints.txt -e .")
    if gpu_wanted and missing_packages("cuda"):
        return Check("versions", "warn", detail, CUDA_INSTALL)
    return Check("versions", "pass", detail)


def gpu_packages() -> str:
    """The GPU backends' packages: versions, or what installs the missing ones (found
    without importing them)."""
    shown: list[str] = []
    lacking: dict[str, list[str]] = {}
    for dist, module, install in GPU_PACKAGES:
        if not importable(module):
            lacking.setdefault(install, []).append(dist)
            continue
        try:
            shown.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:  # another CuPy wheel (cupy-cuda12x, cupy)
            shown.append(f"{module} (installed)")
    shown += [f"{', '.join(names)} not installed ({cmd})" for cmd, names in lacking.items()]
    return ", ".join(shown)


def cuda_majors(names: list[str], version: Any) -> dict[str, int]:
    """The CUDA major of each installed CUDA package, from its name (cupy-cuda12x,
    nvidia-*-cu12) or, for the unsuffixed CUDA 13 wheels, its version."""
    majors = {}
    for name in names:
        low = name.lower()
        for major in (11, 12, 13):
            if low.endswith((f"-cu{major}", f"-cuda{major}x")):
                majors[name] = major
        unsuffixed = low.startswith(("nvidia-", "cuda-bindings", "cuda-toolkit"))
        if name not in majors and unsuffixed and low != "nvidia-ml-py":
            try:
                majors[name] = int(str(version(name)).split(".")[0])
            except ValueError:
                continue
    return {n: m for n, m in majors.items() if m >= 11}


def cuda_family() -> Check:
    names = sorted({d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"]})
    majors = cuda_majors(names, metadata.version)
    seen = sorted(set(majors.values()))
    detail = ", ".join(f"{n} (CUDA {m})" for n, m in sorted(majors.items())) or "none installed"
    if len(seen) > 1:
        odd = [n for n, m in majors.items() if m != max(seen)]
        return Check(
            "cuda-family",
            "fail",
            f"CUDA majors {seen} mixed: {detail}",
            f"pip uninstall {' '.join(sorted(odd))}; keep one CUDA major in the environment",
        )
    if not seen:
        return Check("cuda-family", "pass", "no CUDA packages installed")
    return Check("cuda-family", "pass", f"one CUDA major {seen}: {len(majors)} packages")


def toolkit() -> Check:
    from kernels.cuda.toolkit import link_problem, nvjitlink_version, nvvm_version

    if missing_packages("cuda"):
        return Check("toolkit", "skip", "no CUDA packages: nothing compiles kernels", CUDA_INSTALL)
    nvvm, link = nvvm_version(), nvjitlink_version()
    problem = link_problem(nvvm, link, None)
    shown = ", ".join(
        f"{name} {'.'.join(map(str, v)) if v else 'missing'}"
        for name, v in (("NVVM", nvvm), ("nvJitLink", link))
    )
    if problem:
        text, _, fix = problem.partition("; fix: ")
        return Check("toolkit", "fail", f"{shown}: {text}", fix)
    return Check("toolkit", "pass", f"{shown}: kernels link to a cubin (any 13.x driver loads it)")


def cpu_backend() -> Check:
    """The CPU backend against float64 numpy on odd shapes, each dtype."""
    from kernels.backends import make_accumulator

    rng = np.random.default_rng(0)
    m, k, n = 257, 271, 263
    worst = []
    for dtype, tol in (("float32", 1e-5), ("float64", 1e-13), ("int64", 0.0)):
        a, b = (rng.integers(-50, 50, shape).astype(dtype) for shape in ((m, k), (k, n)))
        if dtype != "int64":
            a, b = a + rng.random((m, k)).astype(dtype), b + rng.random((k, n)).astype(dtype)
        acc = make_accumulator("cpu", (m, n), dtype)
        acc.add(a[:, :130], b[:130])
        acc.add(a[:, 130:], b[130:])
        want = a.astype("float64") @ b.astype("float64")
        error = float(np.max(np.abs(acc.result() - want)) / max(np.max(np.abs(want)), 1e-300))
        worst.append((dtype, error, tol))
    bad = [f"{d} {e:.1e} > {t:.0e}" for d, e, t in worst if e > t]
    detail = ", ".join(f"{d} {e:.1e}" for d, e, _ in worst)
    if bad:
        return Check("cpu", "fail", f"{m}x{k}x{n} vs numpy: {', '.join(bad)}", "reinstall numpy")
    return Check("cpu", "pass", f"{m}x{k}x{n} in 2 panels vs float64 numpy: {detail}")


def find_driver() -> str | None:
    """What shows an NVIDIA driver here (without touching CUDA), or None."""
    proc = Path("/proc/driver/nvidia/version")
    if proc.exists():
        return proc.read_text().splitlines()[0].strip()
    if Path("/dev/nvidia0").exists() or ctypes.util.find_library("cuda"):
        return "libcuda or /dev/nvidia0 present"
    return None


def gpu_probe() -> list[Check]:
    """kernels.device.doctor_probe in a child process: its JSON checks, or one failure saying
    why (without the CUDA packages, the probe is not started)."""
    if missing := missing_packages("cuda"):
        why = f"a driver but no CUDA packages ({', '.join(missing)} not installed)"
        rest = [Check(name, "skip", "no CUDA packages") for name in PROBE_CHECKS[1:]]
        return [Check("devices", "fail", why, CUDA_INSTALL), *rest]
    return run_child("kernels.device.doctor_probe", "devices")


def cluster_check(found: list[Check]) -> list[Check]:
    """The LocalCUDACluster job in a child process, once the probe found a working GPU."""
    if not any(c.check == "devices" and c.status in ("pass", "warn") for c in found):
        return [Check("cluster", "skip", "no working GPU (see devices)")]
    return run_child("pipeline.doctor.cluster_check", "cluster")


def run_child(module: str, name: str) -> list[Check]:
    """``python -m module`` with a timeout, outside the simulator: the JSON checks it prints,
    or one failed check ``name`` saying why."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", module],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env,
        )  # fmt: skip
        return [Check(**c) for c in json.loads(done.stdout)]
    except subprocess.TimeoutExpired:
        return [Check(name, "fail", f"{module} ran past {PROBE_TIMEOUT_S} s", "")]
    except (ValueError, TypeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [Check(name, "fail", f"{module} failed: {tail}", f"run python -m {module}")]

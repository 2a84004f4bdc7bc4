"""This host's cost model: the calibration's constants (pipeline.plan.fitted_costs, fitted on
one machine) scaled by three quick figures measured here (pipeline.plan.costs.HostProbe).

A BLAS thread, zstd and the interpreter run at different speeds on different CPUs (one CPU's
sgemm thread can be half another's), so constants fitted on one machine plan another's jobs
far off. ``benchmarks.calibrate`` records the same figures for the calibration host; here
they are measured once per host (under a second) and saved with the other machine figures in
``$XDG_CACHE_HOME/tilegemm/hosts.json`` (kernels.device.figures: atomic, mode 0600, a file
others may write is ignored), keyed by the CPU, the usable cores, numpy's BLAS and the Python.
A figure more than 1.5x from the calibration host's is measured a second time and the better
kept (a transient load can halve one call's BLAS rate); measured on a machine that stays busy
they are kept all the same: delete the file to measure again.

The figures are this process's host's: a job on an existing scheduler is planned with them
too, which is right when its workers run on machines like this one.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
from dask.system import CPU_COUNT

from pipeline import settings
from pipeline.plan.costs import CostModel, HostProbe, for_host
from pipeline.plan.fitted_costs import COSTS

FILE_NAME = "hosts.json"
UNSAVED: dict[tuple[str, str], HostProbe] = {}
"""Figures this process measured but could not save (a read-only home): measured once."""
GEMM_SIDE = 1024
ZSTD_SIDE = 1024


def host_costs(fitted: CostModel = COSTS) -> CostModel:
    """The cost model to plan with on this host: ``fitted`` (the calibration's constants)
    scaled by this host's figures, or as it is when ``tilegemm.host-probe`` is false."""
    if not settings.get("host-probe"):
        return fitted
    return for_host(fitted, host_figures(fitted.probe))


def host_figures(reference: HostProbe | None, path: Path | None = None) -> HostProbe:
    """This host's figures: saved ones for its key, else measured now and saved (twice when
    far from ``reference``, the calibration host's)."""
    from kernels.device.figures import lookup, save, store_path

    path = path or store_path(FILE_NAME)
    key = host_key()
    record = lookup(key, path)
    saved = _valid(record.get("figures")) if record is not None else None
    if saved is not None:
        return saved
    unsaved = (str(path), json.dumps(key, sort_keys=True))
    if unsaved in UNSAVED:
        return UNSAVED[unsaved]
    probe = measure()
    if reference is not None and not _near(probe, reference):
        # A transient load can halve one call's BLAS rate: a figure far from the calibration
        # host's is measured again, and the better of the two kept.
        probe = best_figures([probe, measure()])
    try:
        save(key, vars(probe), path, identity=None)
    except OSError:  # a read-only home: kept for this process only
        UNSAVED[unsaved] = probe
    return probe


NEAR = 1.5
"""A figure within this factor of the calibration host's is taken from one call."""


def _near(probe: HostProbe, reference: HostProbe) -> bool:
    return all(
        1 / NEAR <= getattr(probe, f.name) / getattr(reference, f.name) <= NEAR
        for f in fields(HostProbe)
    )


def best_figures(runs: list[HostProbe]) -> HostProbe:
    """The best of each figure over several calls (the fastest: other work only slows)."""
    return HostProbe(
        flops_per_second=max(r.flops_per_second for r in runs),
        decode_per_byte=min(r.decode_per_byte for r in runs),
        python_seconds=min(r.python_seconds for r in runs),
    )


def _valid(figures: Any) -> HostProbe | None:
    """Saved figures as a HostProbe, or None when they are not three positive numbers (an
    older record's fields, a file edited by hand): measured again."""
    try:
        values = {f.name: float(figures[f.name]) for f in fields(HostProbe)}
    except (TypeError, ValueError, KeyError):
        return None
    if not all(math.isfinite(v) and v > 0 for v in values.values()):
        return None
    return HostProbe(**values)


def host_key() -> dict[str, Any]:
    """What the figures depend on: the CPU, the cores this process may use, numpy's own BLAS
    (not whatever else the process loaded: scipy's or torch's would change the key), the
    interpreter."""
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        blas_id = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError, TypeError):
        blas_id = "unknown"
    return {
        "host": cpu_name(),
        "cores": usable_cores(),
        "blas": blas_id,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def usable_cores() -> int:
    """The cores this process may use: its affinity and its cgroup's CPU quota (a container's
    limits), as dask counts them for a local cluster."""
    return CPU_COUNT


def usable_memory_bytes() -> int:
    """The memory this process may use: the least of the host's, its cgroup's limit and its
    RLIMIT_RSS (a container's limits), as distributed sizes a worker's "auto" limit."""
    from distributed.system import MEMORY_LIMIT

    return MEMORY_LIMIT


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def measure(repeats: int = 20) -> HostProbe:
    """The three figures, each the best of ``repeats`` (half that for the gemm) in CPU
    seconds, after a first run: the best of a few still varies widely between calls on a
    shared machine, the best of 20 far less."""
    interpreter_work()
    return HostProbe(
        flops_per_second=gemm_rate(max(repeats // 2, 1)),
        decode_per_byte=zstd_decode_per_byte(repeats),
        python_seconds=best_cpu_seconds(interpreter_work, repeats, time.thread_time),
    )


def best_cpu_seconds(
    run: Callable[[], Any], repeats: int, clock: Callable[[], float] = time.process_time
) -> float:
    """The least of ``repeats`` runs on ``clock`` (default: this process's CPU seconds)."""
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
    return max(min(times), 1e-9)


def gemm_rate(repeats: int, side: int = GEMM_SIDE) -> float:
    """One BLAS thread's sgemm rate on ``side``² float32 while every core runs one (as a
    job's tasks do); benchmarks.calibrate times job-sized 2048² blocks with it."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(1)
    a = rng.random((side, side), dtype=np.float32)
    b = rng.random((side, side), dtype=np.float32)
    cores = usable_cores()
    with threadpool_limits(1, "blas"), ThreadPoolExecutor(cores) as pool:

        def all_cores() -> None:
            list(pool.map(lambda _: a @ b, range(cores)))

        all_cores()  # threads started, pages touched
        seconds = best_cpu_seconds(all_cores, repeats)
    return cores * 2 * side**3 / seconds


def zstd_decode_per_byte(repeats: int) -> float:
    """One thread's seconds per byte decoding a zstd frame of float32 noise (the inputs'
    usual codec, as zarr writes it)."""
    from numcodecs import Zstd

    data = np.random.default_rng(2).uniform(-1, 1, (ZSTD_SIDE, ZSTD_SIDE)).astype(np.float32)
    codec = Zstd(level=0)
    frame = codec.encode(data)
    out = np.empty(data.nbytes, dtype=np.uint8)
    seconds = best_cpu_seconds(lambda: codec.decode(frame, out), repeats, time.thread_time)
    return seconds / data.nbytes


def interpreter_work() -> int:
    """A fixed piece of Python: calls, tuples, dicts and strings, as a chunk's bookkeeping."""
    table: dict[tuple[int, str], list[int]] = {}
    for i in range(20_000):
        table[(i, f"c/{i}")] = [i, i + 1]
    return sum(len(v) for v in table.values())

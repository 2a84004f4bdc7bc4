"""Client side: resolve the backend on the workers, submit one task per tile (and K group),
collect their stats with a progress line. Nothing but small stats passes through here."""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dask.base import tokenize
from distributed import Client, Future, wait

from kernels import exact
from kernels.backends import (
    AUTO,
    AUTO_GPU,
    BACKENDS,
    CPU,
    BackendSpec,
    get_backend,
    missing_packages,
    probe_devices,
)
from pipeline.cputime import account
from pipeline.errors import (
    BackendUnavailableError,
    ClusterError,
    DeviceFaultError,
    InputNotFoundError,
    InputUnreachableError,
    JobError,
    PipelineError,
    UsageError,
)
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.standardize import Standardize
from pipeline.run import events, worker
from pipeline.run.faults import restart_faulted
from pipeline.run.progress import ProgressLine
from pipeline.run.spec import TaskSpec, TileStats
from pipeline.run.stopping import stop_running
from pipeline.run.timing import add_phases, process_usage
from pipeline.store.fs import local_path

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class RunStats:
    tiles_computed: int
    bytes_read: int
    stats: tuple[TileStats, ...]

    @property
    def phases(self) -> dict[str, float]:
        """Thread-seconds per phase over every tile (see pipeline.run.timing)."""
        total: dict[str, float] = {}
        for tile in self.stats:
            total = add_phases(total, tile.phases)
        return total


def resolve_backend(
    client: Client, requested: str, compute_dtype: str, panel_dtype: str = ""
) -> str:
    """ "auto" becomes "cuda" when every worker sees a real GPU and the dtype suits it (an
    integer one: its panels read as a float, ``panel_dtype``, the plan's); a backend asked for
    by name must run on every worker, or the job is refused."""
    devices = client.run(probe_devices, requested)
    if not devices:
        raise BackendUnavailableError("the cluster has no workers to run on")
    if requested != AUTO:
        return _check_named(get_backend(requested), devices, compute_dtype, panel_dtype)
    gpu = BACKENDS[AUTO_GPU]
    all_gpu = all(d.get("gpu") for d in devices.values())
    chosen = AUTO_GPU if all_gpu and gpu.takes(compute_dtype, panel_dtype) else CPU
    reason = "a GPU on every worker" if chosen == AUTO_GPU else "no GPU visible to the workers"
    if all_gpu and chosen == CPU:
        reason = f"{compute_dtype} is not a GPU dtype"
    elif chosen == CPU and (unusable := _lacking_packages(gpu, devices, seen=True)):
        reason = (
            f"{len(unusable)} worker(s) see a GPU but lack {gpu.packages_name}: "
            f"{gpu.install} to use it"
        )
    log.info("backend: %s (%s)", chosen, reason)
    return chosen


def check_gpu_decode(client: Client, backend: str) -> None:
    """--gpu-decode needs a staged GPU backend and, on a real GPU, nvCOMP on every worker (the
    simulator decodes on the host in its place; the emulated device models it)."""
    if not get_backend(backend).make_device:
        gpu = BACKENDS[AUTO_GPU]
        lacking = [w for w, missing in client.run(missing_packages, AUTO_GPU).items() if missing]
        needs = f", which needs {gpu.packages_name}: {gpu.install}" if lacking else ""
        raise UsageError(
            f"--gpu-decode decodes on the GPU, but the job runs on the {backend} backend (auto "
            "found no GPU on every worker, or a dtype no GPU backend takes); drop --gpu-decode "
            f"or ask for --backend cuda{needs}"
        )
    from kernels.device.decode import can_decode_on_device

    if get_backend(backend).modelled:
        return
    lacking = sorted(w for w, ok in client.run(can_decode_on_device).items() if not ok)
    if lacking:
        raise BackendUnavailableError(
            f"--gpu-decode needs nvCOMP's Python package on every worker; {len(lacking)} lack "
            f"it (e.g. {lacking[0]}): pip install nvidia-nvcomp-cu13 there, or drop --gpu-decode"
        )


def check_tensor_simulator(client: Client, backend: str, precision: str) -> None:
    """Our tensor-core kernels run inline PTX, which numba's CUDA simulator cannot run: a
    tf32/3xtf32 job on the cuda backend is refused before any work where a worker simulates."""
    if precision == "fp32" or backend != AUTO_GPU:
        return
    simulating = sorted(w for w, on in client.run(_simulating).items() if on)
    if simulating:
        raise BackendUnavailableError(
            f"--precision {precision} runs our tensor-core kernel (inline PTX), which numba's "
            f"CUDA simulator cannot run; {len(simulating)} worker(s) simulate CUDA "
            f"(NUMBA_ENABLE_CUDASIM=1, e.g. {simulating[0]}): use --precision fp32 there, or "
            "workers with a GPU"
        )


def _simulating() -> bool:
    """Runs on a worker: numba's CUDA simulator is on."""
    import os

    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _lacking_packages(
    spec: BackendSpec, devices: dict[str, dict[str, bool]], seen: bool = False
) -> list[str]:
    """The workers (``seen``: those that see a GPU) that reported ``spec``'s packages missing."""
    installed = f"{spec.name} installed"
    return sorted(
        w for w, d in devices.items() if not d.get(installed, True) and (d.get("seen") or not seen)
    )


def _check_named(
    spec: BackendSpec, devices: dict[str, dict[str, bool]], compute_dtype: str, panel_dtype: str
) -> str:
    if lacking := _lacking_packages(spec, devices):
        raise BackendUnavailableError(
            f"--backend {spec.name} needs {spec.packages_name}: {spec.install} (missing on "
            f"{len(lacking)} of {len(devices)} worker(s): {', '.join(lacking)})"
        )
    missing = sorted(w for w, d in devices.items() if not d.get(spec.name))
    if missing:
        raise BackendUnavailableError(
            f"--backend {spec.name} needs {spec.needs} on every worker, but {len(missing)} of "
            f"{len(devices)} worker(s) lack it ({', '.join(missing)}); {spec.fix}"
        )
    if not spec.takes(compute_dtype, panel_dtype):
        read = f" from {panel_dtype} panels" if panel_dtype else ""
        if spec.exact_integers and exact.is_integer(compute_dtype):
            read += " (integers: from inputs of up to 32 bits, which a float holds)"
        raise BackendUnavailableError(
            f"the {spec.name} backend computes {' and '.join(spec.dtypes or ())} only, not "
            f"{compute_dtype}{read}; use --backend cpu or convert the inputs"
        )
    return spec.name


def submit_plan(
    client: Client,
    plan: MatmulPlan,
    spec: TaskSpec,
    skip: set[tuple[int, int]],
    resume: dict[tuple[int, int], tuple[int, int]] | None = None,
    standardize: Standardize | None = None,
) -> dict[tuple[int, int], Future[Any]]:
    """Submit every unfinished tile; returns one future per tile, resolving to TileStats.
    ``resume``: tiles that wrote some bands (see journal.written_rows) compute the rest.
    ``standardize`` (its shifts and scales, up to one per variant) goes to each worker once,
    not with every task."""
    run = uuid.uuid4().hex[:8]  # fresh keys: never reuse a result from an earlier run
    groups = plan.k_groups()
    futures = {}
    given: dict[str, Any] = {}
    if standardize is not None:
        given["standardize"] = client.scatter(standardize, broadcast=True, hash=False)
    for order, tile in enumerate(plan.tiles()):
        if tile.index in skip:
            continue
        token = tokenize(spec, tile, plan.k_panels, run)
        # Plan order (column by column) lets concurrent tiles share decoded panels.
        submit = functools.partial(client.submit, priority=-order)
        if plan.split_k == 1:
            futures[tile.index] = submit(
                worker.tile_product_write, spec, tile, groups[0], (resume or {}).get(tile.index),
                key=f"matmul-tile-{token}", **given,
            )  # fmt: skip
            continue
        partials = [
            submit(
                worker.tile_product, spec, tile, group, key=f"matmul-partial-{token}-{g}", **given
            )
            for g, group in enumerate(groups)
        ]
        total = _tree_sum(submit, partials, token)
        futures[tile.index] = submit(
            worker.tile_write, spec, tile, total, key=f"matmul-write-{token}", **given
        )
    return futures


def _tree_sum(
    submit: Callable[..., Future[Any]], parts: list[Future[Any]], token: str
) -> Future[Any]:
    """Pairwise sums in a fixed order, so the result is the same on any number of workers."""
    level = 0
    while len(parts) > 1:
        nxt = [
            submit(
                worker.sum_partials,
                parts[i],
                parts[i + 1],
                key=f"matmul-reduce-{token}-{level}-{i}",
            )
            for i in range(0, len(parts) - 1, 2)
        ]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts, level = nxt, level + 1
    return parts[0]


KEPT_FOR_RESUME = "tiles already written are kept: rerun with --resume"
"""A failed job's way on (an accumulation rolled back says otherwise: pipeline/run/rollback.py)."""


def collect(
    client: Client,
    futures: dict[tuple[int, int], Future[Any]],
    plan: MatmulPlan,
    progress: bool,
    run_id: str = "",
) -> RunStats:
    """Wait for the tiles, drawing the progress line (with progress on, the tasks of job
    ``run_id`` report their panels); on the first failure cancel the rest."""
    flops = {t.index: 2 * t.shape[0] * t.shape[1] * plan.a.shape[1] for t in plan.tiles()}
    todo = sum(flops[i] for i in futures)
    estimate = plan.estimated_seconds * todo / max(plan.flops, 1)
    panels = len(plan.k_panels)  # per tile, whatever its split
    line = ProgressLine(len(futures), todo, progress, None, estimate, len(futures) * panels)
    pending, stats = set(futures.values()), []

    def stop(why: str, way_out: str) -> None:
        stop_running(client, futures, pending, line, 2 * estimate + 30, why, way_out)

    try:
        with events.subscribe(client, run_id if progress else "", line.task_progress):
            while pending:
                done, pending = wait_some(pending)
                for future in done:
                    if future.status == "error":
                        stop("a tile task failed", "Ctrl-C to leave them running")
                        error = _job_error(future, len(futures))
                        if isinstance(error, DeviceFaultError):
                            restart_faulted(client, error)
                        raise error
                    tile: TileStats = future.result()
                    stats.append(tile)
                    line.add(flops[tile.index], tile.bytes_read, tile.index, panels)
                line.draw()
    except KeyboardInterrupt:
        stop("interrupted", "Ctrl-C again to leave them running")
        raise
    finally:
        line.close()
    stats.sort(key=lambda s: s.index)
    return RunStats(len(stats), sum(s.bytes_read for s in stats), tuple(stats))


def wait_some(pending: set[Future[Any]]) -> tuple[set[Future[Any]], set[Future[Any]]]:
    """Futures done within half a second (distributed's wait raises at its timeout)."""
    try:
        done, rest = wait(pending, timeout=0.5, return_when="FIRST_COMPLETED")
    except TimeoutError:
        return set(), pending
    return set(done), set(rest)


def _job_error(future: Future[Any], total: int) -> PipelineError:
    error = future.exception()
    if (unreachable := input_error(error)) is not None:
        return unreachable
    if isinstance(error, PipelineError):  # the task named the problem (e.g. a corrupt chunk)
        return error
    return JobError(
        f"a tile task failed ({type(error).__name__}: {error}); the other tasks of {total} "
        f"were cancelled; {KEPT_FOR_RESUME}"
    )


def input_error(error: BaseException | None) -> PipelineError | None:
    """A task's ``error`` when it says a worker cannot read an input (bad input: exit 2): as
    it is while this machine still sees the input, else that the input is gone; None for any
    other error."""
    if not isinstance(error, InputUnreachableError):
        return None
    local = local_path(error.url)
    if local is None or os.path.lexists(local):
        return error
    who = f"{error.name} ({error.url})" if error.name else error.url
    return InputNotFoundError(
        f"{who} no longer exists on this machine either (removed or moved while the job ran); "
        "put it back, then run the command again"
    )


def describe_workers(client: Client) -> dict[str, Any]:
    """Worker count, threads and memory limit (the smallest, which the plan must fit)."""
    # Asked of the scheduler directly: client.scheduler_info() returns a cached identity that
    # the client's periodic refresh (which asks for 0 workers) can overwrite in between.
    scheduler = client.scheduler
    if scheduler is None:
        raise ClusterError("the client is not connected to a scheduler")
    workers = client.sync(scheduler.identity, n_workers=-1)["workers"]
    if not workers:
        raise ClusterError("the cluster has no workers; start some with `dask worker ADDRESS`")
    return {
        "workers": len(workers),
        "threads": min(w["nthreads"] for w in workers.values()),
        "memory_limit": min(w.get("memory_limit") or 0 for w in workers.values()),
    }


def release_panels(client: Client, run_id: str) -> None:
    """Free the job's cached panels on every worker (best effort: a lost worker has none)."""
    from pipeline.run.panel_cache import release_panels as release

    try:
        client.run(release, run_id)
    except Exception as e:  # noqa: BLE001 - never hide the job's own result or error
        log.debug("could not release cached panels: %s", e)


def worker_usage(client: Client) -> dict[int, dict[str, float]]:
    """Each worker process's counters (pipeline.run.timing.process_usage), by pid; an
    in-process worker is the client's own process."""
    return dict(client.run(process_usage).values())


def usage_since(client: Client, before: dict[int, dict[str, float]]) -> dict[str, float]:
    """What the worker processes used since ``before``: user and system seconds, page faults,
    and their CPU-seconds by kind as ``cpu_<row>`` (pipeline.cputime.ROWS; they sum to user +
    system)."""
    total: dict[str, float] = {}
    for pid, now in worker_usage(client).items():
        was = before.get(pid, {})
        for key, value in now.items():
            total[key] = total.get(key, 0.0) + value - was.get(key, 0.0)
    user, system = total.get("user_seconds", 0.0), total.get("system_seconds", 0.0)
    zarr_user, gemm_user = (total.get(f"{k}_user_seconds", 0.0) for k in ("zarr", "gemm"))
    rows = account(user, system, total, zarr_user, gemm_user)
    usage = {k: total.get(k, 0.0) for k in ("user_seconds", "system_seconds", "page_faults")}
    return {**usage, **{f"cpu_{row}": seconds for row, seconds in rows.items()}}

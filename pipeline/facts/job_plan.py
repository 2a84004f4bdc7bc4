"""A job's plan from its options (before a cluster, or for the live one) and the fingerprint
that ties OUT's journal to it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from typing import Any

from cluster.memory import local_limit, worker_limit
from kernels.backends import AUTO, AUTO_GPU, BACKENDS, CPU, PRECISIONS, check_precision
from pipeline import settings
from pipeline.errors import PipelineError, UsageError
from pipeline.facts.devices import device_model
from pipeline.facts.host import host_costs, usable_cores, usable_memory_bytes
from pipeline.options.job_options import JobOptions
from pipeline.plan.costs import CostModel, with_read_rate, with_write_rate
from pipeline.plan.device_model import DEVICE_CLASSES, VENDOR, default_decode_threads
from pipeline.plan.limits import PlanLimits
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.operands import attributes
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec


def planning_backend(requested: str, device_class: str | None = None) -> str:
    """The backend to plan for before the workers are asked: the one named; for "auto" the
    GPU's when a device class is named (workers with that GPU would run it), else the CPU."""
    if requested == AUTO:
        return AUTO_GPU if device_class else CPU
    return requested


def plan_for(
    a: ArraySpec,
    b: ArraySpec,
    options: JobOptions,
    state: dict[str, Any] | None,
    live: dict[str, Any] | None,
    backend: str = CPU,
    *,
    transposed: tuple[bool, bool] = (False, False),
    symmetric: bool = False,
    costs: CostModel | None = None,
) -> MatmulPlan:
    """``live``: describe_workers() of a running cluster, or None before one is started.
    ``backend``: a resolved one, or the one asked for (GPU backends plan for their device);
    ``a`` and ``b`` are op(A) and op(B) (``transposed``, ``symmetric``: see plan_matmul);
    ``costs``: the cost model to plan with (None: this host's, host_costs()). The host's
    cores and memory are what this process may use (a container's limits), as a local
    cluster is sized."""
    gpu = backend in BACKENDS and BACKENDS[backend].device == "gpu"
    workers, threads, decode_threads = _workers(options, live, gpu)
    limit, memory_source = worker_memory(options, live, workers, threads, gpu)
    costs = storage_rates(
        host_costs() if costs is None else costs, options, decode_threads if gpu else threads
    )
    forced = state.get("tile_shape") if options.resume and state else None  # keep OUT's tiling
    plan = plan_matmul(
        a,
        b,
        cache_fraction=settings.get("cache-fraction"),
        limits=PlanLimits(max_tasks=settings.get("max-tasks")),
        backend=backend,
        workers=workers,
        threads_per_worker=threads,
        memory_limit_bytes=limit,
        tile_shape=(int(forced[0]), int(forced[1])) if forced else None,
        device=device_model(options, live, backend) if gpu else None,
        decode_threads=decode_threads,
        output=options.output,
        transposed=transposed,
        symmetric=symmetric,
        costs=costs,
    )
    return replace(plan, precision=options.precision, memory_source=memory_source)


def storage_rates(costs: CostModel, options: JobOptions, threads: int) -> CostModel:
    """``costs`` with the storage rates asked for, each worker's ``threads`` sharing them:
    --storage-gbps both ways, --write-gbps the writes alone (one not asked for keeps the
    calibrated local cost)."""
    if options.storage_gbps:
        costs = with_read_rate(costs, options.storage_gbps * 1e9, threads)
    if options.write_gbps or options.storage_gbps:
        flag = "--write-gbps" if options.write_gbps else "--storage-gbps"
        rate = options.write_gbps or options.storage_gbps or 0.0
        costs = with_write_rate(costs, rate * 1e9, threads, flag)
    return costs


def backend_times(
    a: ArraySpec,
    b: ArraySpec,
    options: JobOptions,
    state: dict[str, Any] | None,
    live: dict[str, Any] | None,
    plan: MatmulPlan,
    *,
    transposed: tuple[bool, bool] = (False, False),
    symmetric: bool = False,
) -> tuple[tuple[str, float], ...]:
    """Each GPU backend's modelled seconds for the job (its own plan on the same workers),
    when ``plan`` is a GPU plan on vendor figures; none otherwise: a device's measured rate is
    our kernel's, and cuBLAS's is not measured."""
    if plan.device is None or plan.device.source != VENDOR:
        return ()
    times = []
    for name, spec in BACKENDS.items():
        takes = spec.takes(plan.compute_dtype, plan.panel_dtype)
        if spec.device != "gpu" or spec.modelled or not takes:
            continue
        try:
            check_precision(name, plan.compute_dtype, options.precision)
            other = plan_for(
                a, b, options, state, live, name,
                transposed=transposed, symmetric=symmetric, costs=plan.costs,
            )  # fmt: skip
        except (ValueError, PipelineError):  # a backend that can't compute it, or fit it
            continue
        times.append((name, other.estimated_seconds + other.costs.setup_seconds))
    return tuple(times)


def _workers(options: JobOptions, live: dict[str, Any] | None, gpu: bool) -> tuple[int, int, int]:
    """Workers, threads per worker and host threads decoding a GPU worker's panels: the live
    cluster's, else those asked for (a local cluster's defaults; for a device class, its
    reference servers' cores per GPU decoding)."""
    cores = usable_cores()
    if live is not None:
        return live["workers"], live["threads"], default_decode_threads(cores, live["workers"])
    workers = options.cluster.workers or 1
    # A GPU worker runs one task thread (as LocalCUDACluster starts it), a CPU one a core each.
    threads = options.cluster.threads_per_worker or (1 if gpu else max(cores // workers, 1))
    decode_threads = default_decode_threads(cores, workers)
    if gpu and options.device_class:  # a cluster not at hand: its hosts' cores per GPU
        decode_threads = DEVICE_CLASSES[options.device_class].host_cores or decode_threads
    return workers, threads, decode_threads


def worker_memory(
    options: JobOptions, live: dict[str, Any] | None, workers: int, threads: int, gpu: bool
) -> tuple[int, str]:
    """A worker's memory limit in bytes, and where it comes from (the dry run says): the live
    workers' own, capped by --memory-limit; else a size asked for as given (the workers may
    be elsewhere), a fraction or "auto" of this host's; else for a device class (a cluster
    not at hand) its reference server's host memory per GPU; else this host's, shared."""
    total, asked = usable_memory_bytes(), options.memory_limit
    if live is not None:
        own, capped = live["memory_limit"], worker_limit(asked, live["memory_limit"])
        limit = min(x for x in (capped, own or total) if x)
        if limit == own:
            return limit, "the workers' own limit"
        return limit, "--memory-limit" if limit == capped else "this host's (workers set none)"
    if isinstance(asked, int):
        return asked, "--memory-limit"
    if asked is not None:
        limit = local_limit(asked, threads) or total // workers
        return limit, f"--memory-limit {asked} of this host's"
    model = DEVICE_CLASSES.get(options.device_class or "")
    if gpu and model is not None and model.server is not None:
        server = model.server
        return (
            server.memory_per_gpu_bytes,
            f"the {model.name}'s reference server, {server}; --memory-limit sets it",
        )
    shared = f" over {workers} workers" if workers > 1 else ""
    return total // workers, f"this host's memory{shared}; --memory-limit sets it"


def check_job_precision(requested: str, resolved: str | None, dtype: str, precision: str) -> None:
    """UsageError (one line: what, the fix) unless the job's backend computes ``dtype`` at
    ``precision``. ``resolved``: None before the workers are asked, when "auto" is checked
    for what the GPU backend it may become needs."""
    if requested == AUTO and resolved == CPU and precision in PRECISIONS[1:]:
        raise UsageError(
            f"--precision {precision} runs on tensor cores, but --backend auto chose cpu (not "
            "a GPU on every worker, or not float32 data); use --precision fp32, or workers "
            f"with GPUs and --backend {AUTO_GPU}"
        )
    backend = resolved or (AUTO_GPU if requested == AUTO else requested)
    try:
        check_precision(backend, dtype, precision)
    except ValueError as e:
        raise UsageError(str(e)) from None


def fingerprint(
    plan: MatmulPlan, inputs_digest: str = "", factors: dict[str, Any] | None = None
) -> str:
    """Digest of what decides the output's bytes: the inputs (shapes, chunks, dtypes, metadata)
    and the tiling, and OUT's layout (dtype, chunks, shards): --resume refuses another one.
    Unset fields are left out, so the digests of plans without them did not change."""
    key = {
        "inputs": inputs_digest,
        "a": _key(plan.a, inputs=True),
        "b": _key(plan.b, inputs=True),
        "out": _key(plan.out),
        "tile": plan.tile_shape,
        "panels": list(plan.k_panels),  # the old digest's list (at most MAX_PANELS)
        **(factors or {}),  # --alpha, --beta, --accumulate: only when set
        **attributes(plan.transposed, plan.symmetric),  # transposes, gram: only when set
        # fp32 left out, so the digests of plans before --precision did not change
        **({"precision": plan.precision} if plan.precision != "fp32" else {}),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _key(spec: ArraySpec, inputs: bool = False) -> dict[str, Any]:
    """An ArraySpec for the fingerprint: an input's shards are in the metadata digest already."""
    skip = ("shards",) if inputs else ()
    return {k: v for k, v in asdict(spec).items() if v is not None and k not in skip}

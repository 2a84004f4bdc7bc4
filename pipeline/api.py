"""``pipeline.multiply``: the job the CLI runs, on a given Client or a local cluster."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import dask
import psutil
from distributed import Client

from cluster import ClusterSpec, start
from kernels import BACKENDS
from pipeline import io
from pipeline.errors import UsageError
from pipeline.execute import collect, describe_workers, resolve_backend, submit_plan
from pipeline.lock import check_lock, hold_lock
from pipeline.plan import MIN_GEMM_BLOCK, MatmulPlan, plan_matmul
from pipeline.spec import ArraySpec, StoreSpec
from pipeline.tasks import TaskSpec
from pipeline.units import parse_size

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class MultiplyResult:
    shape: tuple[int, int]
    dtype: str
    seconds: float
    """Wall time of the whole call, cluster start-up included."""
    tiles_computed: int
    tiles_skipped: int
    """Tiles a --resume found already written."""
    bytes_read: int
    """Bytes of input elements the tasks read from storage."""
    backend: str
    plan: MatmulPlan
    verified: bool | None = None
    """None when not asked to verify."""


def multiply(
    a: str,
    b: str,
    out: str,
    *,
    client: Client | None = None,
    backend: str = "auto",
    memory_limit: int | str | None = None,
    overwrite: bool = False,
    resume: bool = False,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    cluster: ClusterSpec | None = None,
    dry_run: bool = False,
    report: str | None = None,
) -> MultiplyResult:
    """Compute ``out = a @ b`` for Zarr arrays at paths or fsspec URLs; see the README."""
    started = time.perf_counter()
    options = dict(storage_options or {})
    budget = parse_size(memory_limit) if isinstance(memory_limit, str) else memory_limit
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other; pick one")
    arrays = _open_inputs(a, b, options)
    a_spec, b_spec = io.array_spec(arrays[0], "A"), io.array_spec(arrays[1], "B")
    io.check_output_path(out, [a, b], options)
    state = io.output_state(out, options)
    forced = tuple(state["tile_shape"]) if resume and state and "tile_shape" in state else None
    # Refuse a plan that cannot fit before starting anything.
    plan = _plan(a_spec, b_spec, budget, cluster, None, forced)
    if dry_run:
        if client is not None or (cluster is not None and cluster.scheduler):
            with _client(client, cluster, budget) as c:  # plan for the cluster at hand
                plan = _plan(a_spec, b_spec, budget, cluster, describe_workers(c), forced)
        return MultiplyResult(plan.out.shape, plan.out.dtype, 0.0, 0, 0, 0, "none", plan)
    if state is not None:
        io.refuse_existing(out, overwrite, resume)
        check_lock(out, options)
    with _client(client, cluster, budget) as c, _report(report):
        chosen = resolve_backend(c, backend, plan.compute_dtype)
        plan = _plan(a_spec, b_spec, budget, cluster, describe_workers(c), forced, chosen)
        store = StoreSpec(a, b, out, options)
        fp = fingerprint(plan, _metadata_digest(arrays))
        spec = TaskSpec(
            store,
            chosen,
            plan.compute_dtype,
            plan.out.dtype,
            fp,
            cache_bytes=plan.cache_bytes,
            block_shape=plan.block_shape,
            run_id=uuid.uuid4().hex,
        )
        skip = _prepare_output(store, plan, fp, state, resume)
        with hold_lock(out, options):
            try:
                run = collect(c, submit_plan(c, plan, spec, skip), plan, progress)
            finally:
                _release_panels(c, spec.run_id)
            _mark(store, fp, complete=True)
            verified = None
            if verify:
                from pipeline.verify import verify_product

                verified = verify_product(c, a, b, out, options, progress=progress).passed
                _mark(store, fp, verified=verified)
    return MultiplyResult(
        plan.out.shape,
        plan.out.dtype,
        time.perf_counter() - started,
        run.tiles_computed,
        len(skip),
        run.bytes_read,
        chosen,
        plan,
        verified,
    )


def fingerprint(plan: MatmulPlan, inputs_digest: str = "") -> str:
    """Digest of what decides the output's bytes: the inputs (shapes, chunks, dtypes, metadata)
    and the tiling."""
    key = {
        "inputs": inputs_digest,
        "a": asdict(plan.a),
        "b": asdict(plan.b),
        "out": asdict(plan.out),
        "tile": plan.tile_shape,
        "panels": plan.k_panels,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _open_inputs(a: str, b: str, options: dict[str, Any]) -> tuple[Any, Any]:
    return io.open_input(a, options, "A"), io.open_input(b, options, "B")


def _metadata_digest(arrays: tuple[Any, Any]) -> str:
    """Digest of both inputs' Zarr metadata (codecs, fill value, attributes...)."""
    meta = [json.dumps(x.metadata.to_dict(), sort_keys=True, default=str) for x in arrays]
    return hashlib.sha256("\n".join(meta).encode()).hexdigest()[:16]


def _plan(
    a: ArraySpec,
    b: ArraySpec,
    budget: int | None,
    cluster: ClusterSpec | None,
    live: dict[str, Any] | None,
    tile_shape: tuple[int, ...] | None,
    backend: str = "cpu",
) -> MatmulPlan:
    """Plan for the live workers when known, else for the cluster the spec will start."""
    total = psutil.virtual_memory().total
    if live is None:
        spec = cluster or ClusterSpec()
        workers = spec.workers or 1
        threads = spec.threads_per_worker or max((psutil.cpu_count() or 1) // workers, 1)
        limit = budget or total // workers
    else:
        workers, threads = live["workers"], live["threads"]
        limit = min(x for x in (budget, live["memory_limit"] or total) if x)
    return plan_matmul(
        a,
        b,
        cache_fraction=float(dask.config.get("tilegemm.cache-fraction", 0.5)),
        # Our CUDA kernels sum each element in K order whatever the launch: no fixed blocks.
        min_block=1 if backend == "cuda" else MIN_GEMM_BLOCK,
        workers=workers,
        threads_per_worker=threads,
        memory_limit_bytes=limit,
        tile_shape=(tile_shape[0], tile_shape[1]) if tile_shape else None,
    )


@contextlib.contextmanager
def _client(
    client: Client | None, cluster: ClusterSpec | None, budget: int | None
) -> Iterator[Client]:
    if client is not None:
        yield client
        return
    spec = cluster or ClusterSpec()
    if budget and not spec.memory_limit_bytes and not spec.scheduler:
        from dataclasses import replace

        spec = replace(spec, memory_limit_bytes=budget)
    with start(spec) as c:
        yield c


def _release_panels(client: Client, run_id: str) -> None:
    """Free the job's cached panels on every worker (best effort: a lost worker has none)."""
    from pipeline.panels import release_panels

    try:
        client.run(release_panels, run_id)
    except Exception as e:  # noqa: BLE001 - never hide the job's own result or error
        log.debug("could not release cached panels: %s", e)


def _report(path: str | None) -> Any:
    """distributed's performance report of the run, saved as HTML when asked for."""
    if not path:
        return contextlib.nullcontext()
    from distributed import performance_report

    return performance_report(filename=path)


def _prepare_output(
    store: StoreSpec, plan: MatmulPlan, fp: str, state: dict[str, Any] | None, resume: bool
) -> set[tuple[int, int]]:
    """Create OUT (or keep it for --resume) and return the tiles already done."""
    if resume and state is not None:
        from pipeline.journal import finished_tiles

        return finished_tiles(store, plan, fp, state)
    io.create_output(
        store.out_url,
        plan.out.shape,
        plan.out.chunks,
        plan.out.dtype,
        {"complete": False, "fingerprint": fp, "tile_shape": list(plan.tile_shape)},
        store.storage_options,
        overwrite=True,
    )
    return set()


def _mark(store: StoreSpec, fp: str, **attrs: Any) -> None:
    array = io.open_output(store.out_url, store.storage_options)
    current = dict(array.attrs).get(io.ATTRS_KEY, {})
    array.attrs[io.ATTRS_KEY] = {**current, "fingerprint": fp, **attrs}

"""The Python API: ``prepare`` (validate and plan, no side effects) and ``multiply`` (run)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from distributed import Client

from cluster import ClusterSpec
from kernels.backends import CHOICES
from pipeline.errors import UsageError
from pipeline.job import JobOptions, MatmulJob, MultiplyResult, plan_for, planning_backend
from pipeline.plan import StoreSpec, parse_size
from pipeline.store import inputs
from pipeline.store.output import Output


def prepare(
    a: str,
    b: str,
    out: str,
    *,
    backend: str = "auto",
    memory_limit: int | str | None = None,
    device_memory_limit: int | str | None = None,
    overwrite: bool = False,
    resume: bool = False,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    cluster: ClusterSpec | None = None,
    report: str | None = None,
) -> MatmulJob:
    """Validate ``out = a @ b`` and plan it: inputs opened read-only, bad input refused, no
    cluster started and nothing written. ``print(job)`` shows the plan; ``job.execute()``
    runs it."""
    if backend not in CHOICES:
        raise UsageError(f"unknown backend {backend!r}; choose {', '.join(CHOICES)}")
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other; pick one")
    options = JobOptions(
        backend=backend,
        memory_limit_bytes=_bytes(memory_limit),
        device_memory_limit_bytes=_bytes(device_memory_limit),
        overwrite=overwrite,
        resume=resume,
        verify=verify,
        storage_options=dict(storage_options or {}),
        progress=progress,
        cluster=cluster or ClusterSpec(),
        report=report,
    )
    arrays = (
        inputs.open_input(a, options.storage_options, "A"),
        inputs.open_input(b, options.storage_options, "B"),
    )
    a_spec, b_spec = inputs.array_spec(arrays[0], "A"), inputs.array_spec(arrays[1], "B")
    output = Output(out, options.storage_options)
    output.check_path([a, b])
    state = output.state()
    # Refuse a plan that cannot fit before starting anything.
    plan = plan_for(a_spec, b_spec, options, state, None, planning_backend(backend))
    store = StoreSpec(a, b, out, options.storage_options)
    return MatmulJob(store, a_spec, b_spec, options, _metadata_digest(arrays), state, plan)


def multiply(
    a: str,
    b: str,
    out: str,
    *,
    client: Client | None = None,
    backend: str = "auto",
    memory_limit: int | str | None = None,
    device_memory_limit: int | str | None = None,
    overwrite: bool = False,
    resume: bool = False,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    cluster: ClusterSpec | None = None,
    report: str | None = None,
) -> MultiplyResult:
    """Compute ``out = a @ b`` for Zarr arrays at paths or fsspec URLs; see the README."""
    job = prepare(
        a, b, out, backend=backend, memory_limit=memory_limit,
        device_memory_limit=device_memory_limit, overwrite=overwrite,
        resume=resume, verify=verify, storage_options=storage_options, progress=progress,
        cluster=cluster, report=report,
    )  # fmt: skip
    return job.execute(client)


def _bytes(size: int | str | None) -> int | None:
    return parse_size(size) if isinstance(size, str) else size


def _metadata_digest(arrays: tuple[Any, Any]) -> str:
    """Digest of both inputs' Zarr metadata (codecs, fill value, attributes...)."""
    meta = [json.dumps(x.metadata.to_dict(), sort_keys=True, default=str) for x in arrays]
    return hashlib.sha256("\n".join(meta).encode()).hexdigest()[:16]

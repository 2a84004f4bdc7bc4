"""The Python API: ``prepare`` (validate and plan, no side effects) and ``multiply`` (run).

A, B and OUT may be paths (``str`` or ``os.PathLike``), fsspec URLs or ``zarr.Array`` objects
(see pipeline.store.locate); an array given as OUT must be one this tool wrote, replaced with
``overwrite=True`` or finished with ``resume=True``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import zarr
from distributed import Client
from numpy.typing import DTypeLike

from cluster import ClusterSpec
from kernels.backends import CHOICES
from pipeline.errors import UnsafeOutputError, UsageError
from pipeline.job import JobOptions, MatmulJob, MultiplyResult, plan_for
from pipeline.plan import OutputSpec, StoreSpec, parse_pair, parse_size
from pipeline.plan.dtypes import parse_dtype
from pipeline.plan.layout import dimension_names
from pipeline.store import inputs
from pipeline.store.locate import locate, merge_options
from pipeline.store.output import Output

Pair = str | Sequence[int]
"""``"RxC"`` or ``(rows, columns)``."""


def prepare(
    a: Any,
    b: Any,
    out: Any,
    *,
    backend: str = "auto",
    memory_limit: int | str | None = None,
    dtype: DTypeLike | None = None,
    chunks: Pair | None = None,
    shards: Pair | None = None,
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
    runs it. ``dtype``, ``chunks`` and ``shards`` choose OUT's layout (default: follow the
    inputs; see the README)."""
    if backend not in CHOICES:
        raise UsageError(f"unknown backend {backend!r}; choose {', '.join(CHOICES)}")
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other; pick one")
    (a_url, a_opts), (b_url, b_opts) = locate(a, "A"), locate(b, "B")
    out_url, out_opts = locate(out, "OUT")
    given = dict(storage_options or {})
    sources = [("storage_options=", given), ("A", a_opts), ("B", b_opts), ("OUT", out_opts)]
    request = OutputSpec(
        None if dtype is None else parse_dtype(dtype),
        parse_pair(chunks, "--chunks"),
        parse_pair(shards, "--shards"),
    )
    options = JobOptions(
        backend=backend,
        memory_limit_bytes=parse_size(memory_limit)
        if isinstance(memory_limit, str)
        else memory_limit,
        overwrite=overwrite,
        resume=resume,
        verify=verify,
        storage_options=merge_options(sources),
        output=request,
        progress=progress,
        cluster=cluster or ClusterSpec(),
        report=report,
    )
    arrays = (
        inputs.open_input(a_url, options.storage_options, "A"),
        inputs.open_input(b_url, options.storage_options, "B"),
    )
    for array, url, name in ((arrays[0], a_url, "A"), (arrays[1], b_url, "B")):
        inputs.check_encoding(array, name, url)
    a_spec, b_spec = inputs.array_spec(arrays[0], "A"), inputs.array_spec(arrays[1], "B")
    output = Output(out_url, options.storage_options)
    output.check_path([a_url, b_url])
    state = _state(output, out)
    options = replace(options, output=_output_request(output, request, state, resume))
    # Refuse a plan that cannot fit (or an unsafe dtype, a bad layout) before starting anything.
    plan = plan_for(a_spec, b_spec, options, state, live=None)
    store = StoreSpec(a_url, b_url, out_url, options.storage_options)
    names = dimension_names(inputs.dimension_names(arrays[0]), inputs.dimension_names(arrays[1]))
    digest = _metadata_digest(arrays)
    return MatmulJob(store, a_spec, b_spec, options, digest, state, plan, names)


def multiply(
    a: Any,
    b: Any,
    out: Any,
    *,
    client: Client | None = None,
    backend: str = "auto",
    memory_limit: int | str | None = None,
    dtype: DTypeLike | None = None,
    chunks: Pair | None = None,
    shards: Pair | None = None,
    overwrite: bool = False,
    resume: bool = False,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    cluster: ClusterSpec | None = None,
    report: str | None = None,
) -> MultiplyResult:
    """Compute ``out = a @ b`` for Zarr arrays (paths, fsspec URLs or zarr.Array objects);
    see the README."""
    job = prepare(
        a, b, out, backend=backend, memory_limit=memory_limit, dtype=dtype, chunks=chunks,
        shards=shards, overwrite=overwrite, resume=resume, verify=verify,
        storage_options=storage_options, progress=progress, cluster=cluster, report=report,
    )  # fmt: skip
    return job.execute(client)


def _state(output: Output, given: object) -> dict[str, Any] | None:
    """OUT's state; an array object given as OUT gets its own refusal when it isn't ours."""
    try:
        return output.state()
    except UnsafeOutputError as e:
        if not isinstance(given, zarr.Array):
            raise
        raise UnsafeOutputError(
            f"OUT is a zarr.Array ({output.url}) that this tool did not write; an array object "
            "is taken as OUT only to replace (overwrite=True) or finish (resume=True) a product "
            "this tool wrote. Pass a new path or URL instead, with dtype=, chunks= and shards= "
            "for its layout"
        ) from e


def _output_request(
    output: Output, request: OutputSpec, state: dict[str, Any] | None, resume: bool
) -> OutputSpec:
    """The Zarr format OUT will have, and for --resume the layout it already has (asking for
    another one is refused: the tiles written so far have this one)."""
    if not (resume and state is not None):
        return replace(request, zarr_format=output.zarr_format())
    have = output.layout()
    for flag, key in (("--dtype", "dtype"), ("--chunks", "chunks"), ("--shards", "shards")):
        asked = getattr(request, key)
        if asked is not None and asked != have[key]:
            raise UsageError(
                f"--resume keeps OUT's layout, but OUT ({output.url}) has {key} "
                f"{_text(have[key])} and {flag} {_text(asked)} was given; drop {flag}, or pass "
                "--overwrite to start over"
            )
    return OutputSpec(have["dtype"], have["chunks"], have["shards"], have["zarr_format"])


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


def _metadata_digest(arrays: tuple[Any, Any]) -> str:
    """Digest of both inputs' Zarr metadata (codecs, fill value, attributes...)."""
    meta = [json.dumps(x.metadata.to_dict(), sort_keys=True, default=str) for x in arrays]
    return hashlib.sha256("\n".join(meta).encode()).hexdigest()[:16]

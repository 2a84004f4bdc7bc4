"""The Python API: ``prepare`` (validate and plan, no side effects), ``multiply`` (run) and
``verify_product``; their errors name keywords, not the command line's flags.

A, B and OUT may be paths (``str`` or ``os.PathLike``), fsspec URLs or ``zarr.Array`` objects
(see pipeline.store.locate); an array given as OUT must be one this tool wrote, replaced with
``overwrite=True`` or finished with ``resume=True``. A and B may also be numpy or dask arrays,
copied to a temporary Zarr array for the job (pipeline.store.in_memory).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any, Unpack

import zarr
from distributed import Client

from cluster.scratch_dirs import check_scratch_dirs
from kernels.backends import AUTO, get_backend, staged_backends
from pipeline import settings
from pipeline.accumulate import flags as accumulation
from pipeline.errors import UnsafeOutputError, UsageError
from pipeline.facts.job_plan import check_job_precision, plan_for, planning_backend
from pipeline.job import MatmulJob
from pipeline.options.declaration import MULTIPLY, PREPARE
from pipeline.options.job_options import JobOptions, MultiplyResult
from pipeline.options.product import (
    PrepareOptions,
    ProductOptions,
    carried,
    checked,
    for_python,
    takes_options,
)
from pipeline.plan import dimensions, standardize
from pipeline.plan.genotypes import check_kinship_orientation
from pipeline.plan.layout import DEFAULT_DIMENSIONS, dimension_names, fit_dimensions
from pipeline.plan.operands import check_gram, operands
from pipeline.plan.spec import OutputSpec, StoreSpec
from pipeline.store import coordinates, groups, in_memory, inputs
from pipeline.store.chunks.raw import device_decodable
from pipeline.store.fields import as_matrix
from pipeline.store.fs import absolute, check_protocol, refuse_linked, resolve_url
from pipeline.store.locate import locate, merge_options
from pipeline.store.orient import orientation
from pipeline.store.output import Output, check_chunk_count
from pipeline.store.owned import check_finished
from pipeline.store.report_file import check_report
from pipeline.store.signature import key_encoding, metadata_digest
from pipeline.verify import check

verify_product = for_python(check.verify_product)
"""``pipeline.verify_product``: pipeline.verify.check's, its errors in keywords."""

log = logging.getLogger("pipeline")


@takes_options(PREPARE)
def prepare(a: Any, b: Any, out: Any, **options: Unpack[PrepareOptions]) -> MatmulJob:
    """Validate ``out = a @ b`` and plan it: inputs opened read-only, bad input refused, no
    cluster started and nothing written but the temporary copy of a numpy or dask array given
    as ``a`` or ``b`` (pipeline.store.in_memory). ``print(job)`` shows the plan;
    ``job.execute()`` runs it. ``dtype``, ``chunks`` and ``shards`` choose OUT's layout
    (default: follow the inputs; see the README). ``transpose_a``/``transpose_b`` multiply
    op(A) = Aᵀ / op(B) = Bᵀ, read in place; ``symmetric`` is set by ``pipeline.gram`` only
    (op(B) = op(A)ᵀ). ``precision``: "fp32" (the dtype's own arithmetic), "tf32" or "3xtf32"
    (tensor cores: float32 data, a GPU backend that lists it; refused before any work
    otherwise)."""
    settings.check_all()  # every tilegemm.* setting, before any work
    values = checked(options)
    _check_gpu_decode_backend(values["gpu_decode"], values["backend"])
    layout = OutputSpec(values["dtype"], values["chunks"], values["shards"])
    beta = accumulation.check_flags(
        accumulate=values["accumulate"],
        alpha=values["alpha"],
        beta=values["beta"],
        overwrite=values["overwrite"],
        verify=values["verify"],
        layout=layout,
    )
    in_memory.refuse_as_out(out)
    names = ("X", "X") if values["symmetric"] else ("A", "B")
    (a, b), copies = in_memory.stage((a, b), names)  # arrays in memory: temporary Zarr copies
    if copies is None:
        return _prepare_stored(a, b, out, values, layout, beta)
    with copies.removed_on_error():
        return replace(_prepare_stored(a, b, out, values, layout, beta), operands=copies)


def _prepare_stored(
    a: Any, b: Any, out: Any, values: dict[str, Any], layout: OutputSpec, beta: float
) -> MatmulJob:
    """``prepare`` once A and B are stored (an array in memory as its temporary copy)."""
    urls, storage = _locate((a, b, out), values["storage_options"])  # an overlap first
    changes = {f"--{k}": values[k] for k in ("overwrite", "resume", "accumulate")}
    for flag in (f for f, on in changes.items() if on and isinstance(out, str | os.PathLike)):
        refuse_linked(os.fspath(out), "C" if values["accumulate"] else "OUT", flag)
    report = values["report"] and check_report(
        values["report"], dict(zip(("A", "B", "OUT"), urls, strict=True)), storage
    )
    oriented = orientation((urls[0], urls[1]), storage, values)  # --over, gram's --stack
    values = values | dict(zip(("transpose_a", "transpose_b"), oriented.transposed, strict=True))
    asked = {"beta": beta, "storage_options": storage, "output": layout, "report": report}
    std = standardize.requested(
        values["center"], values["scale"], values["kinship"], values["ddof"],
        rows=values["transpose_b"], missing=values["missing"],
        missing_code=values["missing_code"],
    ) if values["symmetric"] else None  # fmt: skip
    if std is not None and values["gpu_decode"]:
        raise UsageError(
            f"--gpu-decode decodes X on the GPU, where --{std.mode} cannot standardize it (X is "
            "standardized on the host as it is read); drop --gpu-decode"
        )
    asked["standardize"] = std
    job_options = JobOptions(**carried(values) | asked)
    symmetric, transposed = values["symmetric"], (values["transpose_a"], values["transpose_b"])
    names = ("X", "X", "G") if symmetric else ("A", "B", "OUT")
    check_scratch_dirs(urls, job_options.cluster, names)
    if symmetric:
        check_gram(urls, transposed)
    store = StoreSpec(*urls, storage, transposed, symmetric, oriented.splits)
    return _validated(store, job_options, out, values["ignore_coordinates"])


def _check_gpu_decode_backend(gpu_decode: bool, backend: str) -> None:
    if gpu_decode and backend != AUTO and not get_backend(backend).make_device:
        raise UsageError(
            f"--gpu-decode decodes the inputs on the GPU: it needs --backend "
            f"{' or '.join(staged_backends())}, not {backend}"
        )


def _locate(
    given: tuple[Any, Any, Any], storage_options: dict[str, Any] | None
) -> tuple[tuple[str, str, str], dict[str, Any]]:
    """A, B and OUT's URLs, and one set of fsspec options: the caller's and the arrays' own."""
    located = [locate(x, name) for x, name in zip(given, ("A", "B", "OUT"), strict=True)]
    sources = [("storage_options=", dict(storage_options or {}))]
    sources += [(name, opts) for (_, opts), name in zip(located, ("A", "B", "OUT"), strict=True)]
    options = merge_options(sources)
    a, b, out = (url for url, _ in located)
    check_protocol(a, "A")
    check_protocol(b, "B")
    # Overlaps are refused in the caller's spelling (the check resolves links itself) ...
    Output(out, options).check_path([a, b], readable=True)
    # ... then OUT is one resolved location for every check and write; inputs are made
    # absolute (workers may run elsewhere), their links left for the file system to follow.
    return (absolute(a), absolute(b), resolve_url(out, "OUT")), options


def _validated(
    store: StoreSpec, options: JobOptions, out_given: object, ignore_coordinates: bool = False
) -> MatmulJob:
    """Open the inputs read-only, refuse bad input and plan (no cluster, nothing written)."""
    names = (
        (("X", store.a_url),) * 2 if store.symmetric else (("A", store.a_url), ("B", store.b_url))
    )
    arrays = [  # an N-D field as the matrix it is read as (pipeline.store.fields)
        as_matrix(inputs.open_input(url, store.storage_options, name), split)
        for (name, url), split in zip(names, store.splits, strict=True)
    ]
    for array, (name, url) in zip(arrays, names, strict=True):
        check_finished(array, name, url)
    if not store.symmetric and store.a_url != store.b_url:  # a name shared but not summed
        dimensions.check_shared(
            (inputs.dimension_names(arrays[0]), inputs.dimension_names(arrays[1])),
            store.transposed,
        )
    std = options.standardize
    if std is not None and std.mode == "kinship":
        check_kinship_orientation(inputs.dimension_names(arrays[0]), rows=std.axis == 1)
    if std is not None and std.missing is not None and std.code is None:
        marker = inputs.missing_marker(arrays[0])  # xarray's _FillValue of X: a missing call
        dosage = std.mode == "kinship" and marker is not None and 0 <= marker <= 2
        if marker is not None and not dosage:
            std = replace(std, code=marker)
            options = replace(options, standardize=std)
    for array, (name, url) in zip(arrays, names, strict=True):
        inputs.check_encoding(array, name, url, None if std is None else std.code)
    if options.gpu_decode:
        _check_device_decodable(arrays, names, store.transposed)
    a_spec, b_spec = (
        inputs.array_spec(x, name) for x, (name, _) in zip(arrays, names, strict=True)
    )
    a_spec, b_spec = operands(a_spec, b_spec, store.transposed)  # the planner sees op(A), op(B)
    if not (store.symmetric or ignore_coordinates):
        coordinates.check_contracted(
            arrays, (store.a_url, store.b_url), store.transposed, store.storage_options
        )
    output = Output(store.out_url, store.storage_options)
    output.check_path([store.a_url, store.b_url])
    state: dict[str, Any] | None
    if options.accumulate:
        state, request = accumulation.target(output, a_spec, b_spec, options.alpha, options.beta)
    else:
        state = _state(output, out_given)
        request = _output_request(output, options.output, state, options.resume)
    if options.standardize is not None:  # a covariance, correlation or kinship is float
        dtype = standardize.output_dtype(options.standardize, a_spec.dtype, request.dtype)
        request = replace(request, dtype=dtype, standardized=True)
    options = replace(options, output=request)
    # Refuse a plan that cannot fit (or an unsafe dtype, a bad layout) before starting anything.
    backend = planning_backend(options.backend, options.device_class)
    t, sym = store.transposed, store.symmetric
    plan = plan_for(a_spec, b_spec, options, state, None, backend, transposed=t, symmetric=sym)
    (m, n), name = plan.out.shape, "G" if sym else "OUT"
    check_chunk_count(plan.out.shape, plan.out.chunks, f"{name} ({m}x{n})")
    check_job_precision(options.backend, None, plan.compute_dtype, options.precision)
    a_names, b_names = (_names(x, t) for x, t in zip(arrays, store.transposed, strict=True))
    unnamed = groups.group_dimensions(store.out_url, store.storage_options)
    dims = dimension_names(a_names, b_names, unnamed=unnamed or DEFAULT_DIMENSIONS)
    taken = groups.dimension_lengths(store.out_url, store.storage_options)
    dims = fit_dimensions(dims, plan.out.shape, taken)
    digest = metadata_digest((arrays[0], arrays[1]))
    encodings = (key_encoding(arrays[0]), key_encoding(arrays[1]))
    return MatmulJob(store, a_spec, b_spec, options, digest, state, plan, dims, encodings)


@takes_options(MULTIPLY)
def multiply(
    a: Any, b: Any, out: Any, *, client: Client | None = None, **options: Unpack[ProductOptions]
) -> MultiplyResult:
    """Compute ``out = a @ b`` for Zarr arrays (paths, fsspec URLs or zarr.Array objects; ``a``
    and ``b`` also numpy or dask arrays); see the README. The result reads OUT back:
    ``open()``, ``to_dask()``, ``to_xarray()``."""
    return prepare(a, b, out, **options).execute(client)


def _check_device_decodable(
    arrays: list[Any], names: tuple[tuple[str, str], ...], transposed: tuple[bool, bool]
) -> None:
    """--gpu-decode needs chunks stored as plain zstd frames, read as stored: refused when
    neither input has them (nothing would be decoded on the GPU), a warning when one lacks
    them. An operand read transposed is decoded on the host and placed transposed there."""
    chunks = "chunks that are not plain zstd frames (sharded, Blosc, LZ4, filters or a checksum)"
    host = {
        name: "is read transposed" if t else f"has {chunks}"
        for a, (name, _), t in zip(arrays, names, transposed, strict=True)
        if t or not device_decodable(a)
    }
    if len(host) == len(set(n for n, _ in names)) and len(host) and not any(transposed):
        raise UsageError(
            f"--gpu-decode: A and B both have {chunks}, so nothing would be decoded on the GPU; "
            "drop --gpu-decode, or rewrite them with zarr's default zstd codec and no sharding"
        )
    if len(host) == len(set(n for n, _ in names)):
        raise UsageError(
            "--gpu-decode: nothing would be decoded on the GPU ("
            + "; ".join(f"{n} {why}" for n, why in host.items())
            + "): an operand read transposed is decoded on the host; drop --gpu-decode"
        )
    for name, why in host.items():
        log.warning("--gpu-decode: %s %s; it is decoded on the host", name, why)


def _names(array: Any, transposed: bool) -> tuple[str | None, str | None]:
    """An operand's dimension names as used (reversed when read transposed)."""
    first, second = inputs.dimension_names(array)
    return (second, first) if transposed else (first, second)


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

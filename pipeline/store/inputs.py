"""The inputs: Zarr arrays opened read-only (v2 or v3, any fsspec URL) and read by block."""

from __future__ import annotations

import base64
import cmath
import contextlib
import json
import math
import os
import struct
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
import zarr.errors
from numpy.typing import NDArray
from zarr.core.buffer.cpu import NDBuffer

from pipeline.errors import (
    ChunkSizeError,
    InputError,
    InputNotFoundError,
    InputUnreachableError,
    PipelineError,
    StoredObjectError,
    UsageError,
    storage_problem,
)
from pipeline.plan.spec import ArraySpec
from pipeline.store.chunks import sharded as shard_read
from pipeline.store.chunks import unsharded as chunk_read
from pipeline.store.chunks.archive_store import archive_path
from pipeline.store.chunks.bounded import bounded, open_input_array, stored_codec
from pipeline.store.chunks.input_store import named
from pipeline.store.chunks.raw import stored_chunks
from pipeline.store.chunks.sizes import check_declared
from pipeline.store.fields import FieldMatrix, stored_names
from pipeline.store.fs import (
    check_protocol,
    check_shared,
    fsspec_options,
    local_path,
    url_to_fs,
)
from pipeline.store.handles import cached_array
from pipeline.store.input_groups import not_an_array


def open_input(url: str, storage_options: dict[str, Any] | None = None, name: str = "A") -> Any:
    """Open a Zarr array read-only, or raise a PipelineError that names the problem."""
    check_protocol(url, name)
    check_shared(url, name)
    local = local_path(url)
    if local is not None and os.path.islink(local) and not os.path.exists(local):
        raise InputNotFoundError(
            f"{name} ({url}) is a symbolic link that leads nowhere (a loop, or a missing "
            "target); point it at a Zarr array"
        )
    if local is not None and os.path.isfile(local) and zipfile.is_zipfile(local):
        raise InputError(
            f"{name} ({url}) is a zip archive; address the array inside it as "
            f"zip://PATH-IN-ARCHIVE::{os.path.abspath(local)} (e.g. zip://A::...; "
            "zip://::... when the array is the archive's root)"
        )
    if local is None and archive_path(url) is None:  # a local archive: opened by us alone
        _probe(url, storage_options, name)
    try:
        array = open_input_array(url, fsspec_options(url, storage_options))
    except StoredObjectError as e:  # before ValueError: its message says what is there
        raise named(e, name, url) from e
    except InputError as e:  # a codec nothing bounds, named
        raise InputError(f"{name} ({url}): {e}") from e
    except (zarr.errors.NodeTypeValidationError, zarr.errors.NodeNotFoundError) as e:
        raise not_an_array(url, storage_options, name, e) from e
    except FileNotFoundError as e:  # after NodeNotFoundError, which subclasses it
        raise InputNotFoundError(f"{name} ({url}) does not exist; check the path") from e
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise InputError(f"{name} ({url}) cannot be opened as a Zarr array: {e}") from e
    except RecursionError:  # no Zarr metadata nests that deep; the traceback would be huge
        raise InputError(
            f"{name} ({url}) cannot be opened as a Zarr array: its metadata JSON is nested "
            "deeper than Python's parser goes, which no Zarr metadata needs; check the file"
        ) from None
    try:
        return bounded(array)  # every decode capped (its stored objects: open_input_array)
    except InputError as e:  # a codec nothing bounds, named
        raise InputError(f"{name} ({url}): {e}") from e


def array_spec(array: Any, name: str) -> ArraySpec:
    """Shape, chunks and dtype of an opened array, refusing what cannot be multiplied."""
    if array.ndim != 2:
        field = (
            ", or an N-D field read as one: name the dimensions summed over with --over "
            "(multiply and gram; verify takes no N-D field yet)"
        )
        raise InputError(
            f"{name} has {array.ndim} dimension(s) {tuple(array.shape)}; only 2-D matrices can "
            f"be multiplied{field if array.ndim > 2 else ''}"
        )
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biufc":
        raise InputError(
            f"{name} has dtype {dtype}, which is not numeric; store it as float32 or float64"
        )
    if min(array.chunks) < 1:
        raise InputError(
            f"{name} has chunks {array.chunks[0]}x{array.chunks[1]} in its metadata; a chunk "
            "must be at least 1x1: rewrite the array with chunks such as 1024x1024"
        )
    shards = getattr(array, "shards", None)
    return ArraySpec(
        (int(array.shape[0]), int(array.shape[1])),
        (int(array.chunks[0]), int(array.chunks[1])),
        str(dtype),
        (int(shards[0]), int(shards[1])) if shards else None,
    )


PACKING = ("scale_factor", "add_offset")
"""CF attributes of packed data: the stored integers are not the values (xarray decodes them)."""
MISSING = ("_FillValue", "missing_value")
"""CF attributes naming a value that means "missing"."""


def check_encoding(array: Any, name: str, url: str, missing: float | None = None) -> None:
    """Refuse CF-packed inputs and inputs with missing-value markers: both would be multiplied
    as raw numbers. (A NaN marker is fine: NaN elements give NaN products, visibly; so is
    ``missing``, a value the product takes as missing.)"""
    attrs = dict(array.attrs)
    packed = {k: attrs[k] for k in PACKING if k in attrs}
    if packed:
        listed = ", ".join(f"{k}={v}" for k, v in packed.items())
        raise InputError(
            f"{name} ({url}) is CF-packed ({listed}): its stored {array.dtype} values are not "
            "its values and would be multiplied raw; unpack it first, e.g. "
            "xr.open_zarr(STORE).drop_encoding().to_zarr(NEW_STORE) writes the decoded floats"
        )
    for key, marker in _missing_markers(array, attrs):
        if missing is not None and not _is_nan(marker) and marker != missing:
            raise InputError(
                f"{name} ({url}) marks missing elements with {key}={marker}, and --missing-code "
                f"{missing:g} names another value; pass --missing-code {marker} (or drop "
                f"--missing-code: {key} is taken), after filling one kind with the other if "
                "both occur"
            )
        if not (_is_nan(marker) or (missing is not None and marker == missing)):
            raise InputError(
                f"{name} ({url}) marks missing elements with {key}={marker}, which would be "
                "multiplied as a number; fill them first (e.g. xarray's .fillna(0)) and write "
                "the array without that attribute, or delete it if nothing is missing"
            )


def missing_marker(array: Any) -> float | None:
    """The one real number the array's CF attributes mark missing elements with (None: none,
    NaN, or markers that disagree)."""
    found = {m for _, m in _missing_markers(array, dict(array.attrs)) if not _is_nan(m)}
    if len(found) != 1:
        return None
    (marker,) = found
    ok = isinstance(marker, int | float) and not isinstance(marker, bool)
    return float(marker) if ok and math.isfinite(marker) else None


def _missing_markers(array: Any, attrs: dict[str, Any]) -> list[tuple[str, Any]]:
    """CF missing-value markers: the attributes (xarray writes a float's as base64 of its
    float64 bytes in v3); for a v2 array xarray wrote (it has _ARRAY_DIMENSIONS), zarr's
    fill_value is its _FillValue."""
    found = [(k, _decode_marker(attrs[k])) for k in MISSING if k in attrs]
    v2 = array.metadata.zarr_format == 2
    if v2 and "_ARRAY_DIMENSIONS" in attrs and array.fill_value is not None:
        found.append(("_FillValue", _decode_marker(array.fill_value)))
    return found


def _decode_marker(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return complex(_b64_float(value[0]), _b64_float(value[1]))  # xarray's complex
    if isinstance(value, list) and len(value) == 1:  # CF allows a one-element list
        value = value[0]
    if isinstance(value, str):
        with contextlib.suppress(ValueError, struct.error):
            return _b64_float(value)
        with contextlib.suppress(ValueError):
            return float(value)  # "NaN", "Infinity"
    return value.item() if isinstance(value, np.generic) else value


def _b64_float(text: str) -> float:
    return float(struct.unpack("<d", base64.b64decode(text, validate=True))[0])


def _is_nan(value: Any) -> bool:
    return isinstance(value, (float, complex)) and cmath.isnan(value)


def dimension_names(array: Any) -> tuple[str | None, str | None]:
    """The array's dimension names: Zarr v3 ``dimension_names``, or xarray's v2
    ``_ARRAY_DIMENSIONS`` attribute; None where unnamed. An N-D field read as a matrix:
    its sides' names (stacked ones joined, pipeline.store.fields)."""
    if isinstance(array, FieldMatrix):
        return array.dimension_names
    names = stored_names(array)
    return (names[0], names[1]) if len(names) == 2 else (None, None)


def worker_array(url: str, storage_options: dict[str, Any], token: str) -> Any:
    """Worker side: an input's read-only handle, cached per process and job ``token``, its
    decodes and stored objects bounded as ``open_input``'s; one the worker cannot find or may
    not read is an InputUnreachableError."""
    opened = _on_worker(lambda: cached_array(url, storage_options, token), OSError, url)
    return bounded(opened)


def open_on_worker(url: str, storage_options: dict[str, Any] | None, name: str) -> Any:
    """``open_input`` in a task: an input the worker cannot find or may not read (this
    machine opened it before the job) is an InputUnreachableError naming the worker."""
    return _on_worker(lambda: open_input(url, storage_options, name), PipelineError, url, name)


def _on_worker(
    opening: Callable[[], Any], errors: type[Exception], url: str, name: str = ""
) -> Any:
    """``opening()``, its ``errors`` that say the worker cannot reach ``url`` raised as an
    InputUnreachableError."""
    try:
        return opening()
    except errors as e:
        found = unreachable(e, url, name)
        if found is None:
            raise
    raise found  # outside the handler: zarr's errors, in its chain, would not unpickle


def unreachable(error: BaseException, url: str, name: str = "") -> InputUnreachableError | None:
    """``error``, met opening input ``url`` in a task, as an InputUnreachableError when a
    missing file or a refused permission is behind it; None for any other error, and outside
    a worker (this machine's own read: its error says it)."""
    if isinstance(error, InputUnreachableError):
        return error
    worker = worker_address()
    if not worker:
        return None
    reason, cause = None, error
    while True:  # the innermost cause says it best
        if isinstance(cause, PermissionError):
            reason = f"permission denied on {cause.filename or url}"
        elif isinstance(cause, zarr.errors.NodeNotFoundError):
            reason = "no Zarr array is there"
        elif isinstance(cause, FileNotFoundError):
            reason = "it does not exist there"
        if cause.__cause__ is None:
            break
        cause = cause.__cause__
    return None if reason is None else InputUnreachableError(url, worker, reason, name)


def worker_address() -> str:
    """The address of the Dask worker running this task ("" outside one)."""
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return ""


def read_block(
    array: Any,
    rows: tuple[int, int],
    cols: tuple[int, int],
    dtype: str,
    name: str = "input",
    url: str = "",
    out: NDArray[Any] | None = None,
    retry: str = ", then rerun with --resume",
) -> NDArray[Any]:
    """A C-contiguous block in ``dtype``, read by slice (no rechunk of the store); with
    ``out`` (C-contiguous, of the block's shape and ``dtype``) decoded straight into it, each
    chunk cast by numpy as ``ascontiguousarray`` would, so the values are the same.

    A stored chunk that cannot be read or decoded (corrupt, truncated, unreadable) becomes an
    InputError naming it; one refused unread (a FIFO, a device, a folder, a file larger than a
    chunk can take: StoredObjectError) is named without another read; a connection error stays
    as it is (the storage, not the input).
    """
    if isinstance(array, FieldMatrix):
        return _read_field(array, rows, cols, dtype, name, url, out, retry)
    selection = (slice(rows[0], rows[1]), slice(cols[0], cols[1]))
    try:
        direct = (
            chunk_read  # small chunks, or decoded in place
            if chunk_read.readable(array, rows, cols)
            else shard_read  # small chunks in shards
            if shard_read.readable(array)
            else None
        )
        if direct is not None:
            into = out if out is not None else np.empty(_span(rows, cols), dtype=dtype)
            if direct.read_into(array, rows, cols, into):
                return into
        if out is not None:
            array.get_basic_selection(selection, out=NDBuffer.from_numpy_array(out))
            return out
        block = array[selection]
    except StoredObjectError as e:  # refused unread: named as it is, not read again
        raise named(e, name, url, retry) from e
    except Exception as e:
        bad = None if storage_problem(e, None) else _bad_chunk(array, rows, cols, e)
        if bad is None:
            raise
        (index, span, error) = bad
        if isinstance(error, StoredObjectError):  # another chunk of the block, refused unread
            raise named(error, name, url, retry) from e
        key = f"{url.rstrip('/')}/{array.metadata.encode_chunk_key(index)}"
        where = f": {key} (rows {span[0]}:{span[1]}, columns {span[2]}:{span[3]})"
        raise _unreadable(error, f"{name} ({url})", where, f"{name}{retry}") from e
    return np.ascontiguousarray(block, dtype=dtype)


def _unreadable(error: Exception, which: str, where: str, rewrite: str) -> InputError:
    """A chunk that cannot be read or has the wrong size, named ``where`` it lies."""
    fix = f"restore that chunk from a good copy or rewrite {rewrite}"
    if isinstance(error, ChunkSizeError):
        return ChunkSizeError(
            f"{which} has a chunk of the wrong size{where}: {error}; {fix}",
            error.declared,
            error.expected,
        )
    return InputError(
        f"{which} has a chunk that cannot be read{where} fails with "
        f"{type(error).__name__}: {error}; {fix}"
    )


Span = tuple[int, int, int, int]


def _read_field(
    array: FieldMatrix,
    rows: tuple[int, int],
    cols: tuple[int, int],
    dtype: str,
    name: str,
    url: str,
    out: NDArray[Any] | None,
    retry: str,
) -> NDArray[Any]:
    """``read_block`` of an N-D field read as a matrix: the stored box through zarr, a chunk
    that fails named by the box it lies in."""
    try:
        return np.asarray(array.read(rows, cols, dtype, out))
    except StoredObjectError as e:
        raise named(e, name, url, retry) from e
    except Exception as e:
        if storage_problem(e, None):
            raise
        box = ", ".join(f"{s.start}:{s.stop}" for s in array.box(rows, cols)[0])
        where = (
            f" in its box [{box}] (rows {rows[0]}:{rows[1]}, columns {cols[0]}:{cols[1]} of it "
            "as a matrix)"
        )
        raise _unreadable(e, f"{name} ({url})", where, f"{name}{retry}") from e


def _span(rows: tuple[int, int], cols: tuple[int, int]) -> tuple[int, int]:
    return (max(rows[1] - rows[0], 0), max(cols[1] - cols[0], 0))


def _bad_chunk(
    array: Any, rows: tuple[int, int], cols: tuple[int, int], error: Exception
) -> tuple[tuple[int, int], Span, Exception] | None:
    """The first stored chunk (or shard) of the block that fails, with its span: for a chunk
    refused for its declared size, found from the stored frames' headers (nothing decoded
    again); else the first that fails when read alone."""
    (m, n), (cm, cn) = array.shape, getattr(array, "shards", None) or array.chunks
    spans = [
        ((i, j), (i * cm, min((i + 1) * cm, m), j * cn, min((j + 1) * cn, n)))
        for i in range(rows[0] // cm, -(-rows[1] // cm))
        for j in range(cols[0] // cn, -(-cols[1] // cn))
    ]
    codec = stored_codec(array)
    if isinstance(error, ChunkSizeError) and codec and error.declared is not None:
        what = f"{cm}x{cn} {np.dtype(array.dtype)} elements"
        stored = stored_chunks(array, [index for index, _ in spans])
        for (index, span), data in zip(spans, stored, strict=True):
            try:
                check_declared(codec, data if data is not None else b"", error.expected, what)
            except ChunkSizeError as e:
                return index, span, e
    for index, span in spans:
        try:
            array[span[0] : span[1], span[2] : span[3]]
        except Exception as e:  # noqa: BLE001 - whatever the codec or the store raised
            return index, span, e
    return None


def _probe(url: str, storage_options: dict[str, Any] | None, name: str) -> None:
    """One request alone before zarr's concurrent ones: a dead endpoint or missing credentials
    fail here, cleanly (zarr's abandoned requests print tracebacks at exit)."""
    fs, path = url_to_fs(url, storage_options)
    try:
        fs.exists(path)
    except TypeError as e:  # the file system's session refused an option
        raise UsageError(f"{name} ({url}): {e}; check the --storage-option names") from e
    except Exception as e:  # noqa: BLE001 - other errors: zarr's open reports them
        problem = storage_problem(e, storage_options)
        if problem is not None:
            raise InputError(f"{name} ({url}) cannot be read: {problem}") from e

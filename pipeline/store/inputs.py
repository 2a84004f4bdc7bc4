"""The inputs: Zarr arrays opened read-only (v2 or v3, any fsspec URL) and read by block."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import zarr
import zarr.errors
from numpy.typing import NDArray
from zarr.core.buffer.cpu import NDBuffer

from pipeline.errors import InputError, InputNotFoundError, UsageError, storage_problem
from pipeline.plan.spec import ArraySpec
from pipeline.store.fs import check_protocol, fsspec_options, local_path, url_to_fs
from pipeline.store.handles import cached_array


def open_input(url: str, storage_options: dict[str, Any] | None = None, name: str = "A") -> Any:
    """Open a Zarr array read-only, or raise a PipelineError that names the problem."""
    check_protocol(url, name)
    local = local_path(url)
    if local is not None and os.path.islink(local) and not os.path.exists(local):
        raise InputNotFoundError(
            f"{name} ({url}) is a symbolic link that leads nowhere (a loop, or a missing "
            "target); point it at a Zarr array"
        )
    if local is None:
        _probe(url, storage_options, name)
    try:
        array = zarr.open_array(url, mode="r", storage_options=fsspec_options(url, storage_options))
    except zarr.errors.NodeTypeValidationError as e:
        raise InputError(
            f"{name} ({url}) is a Zarr group, not an array; give the path of an array inside it"
        ) from e
    except zarr.errors.NodeNotFoundError as e:
        raise InputNotFoundError(
            f"{name} ({url}) holds no Zarr array (no .zarray or zarr.json found); "
            "give the path of a Zarr array"
        ) from e
    except FileNotFoundError as e:  # after NodeNotFoundError, which subclasses it
        raise InputNotFoundError(f"{name} ({url}) does not exist; check the path") from e
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise InputError(f"{name} ({url}) cannot be opened as a Zarr array: {e}") from e
    return array


def array_spec(array: Any, name: str) -> ArraySpec:
    """Shape, chunks and dtype of an opened array, refusing what cannot be multiplied."""
    if array.ndim != 2:
        raise InputError(
            f"{name} has {array.ndim} dimension(s) {tuple(array.shape)}; "
            "only 2-D matrices can be multiplied"
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
    return ArraySpec(
        (int(array.shape[0]), int(array.shape[1])),
        (int(array.chunks[0]), int(array.chunks[1])),
        str(dtype),
    )


def worker_array(url: str, storage_options: dict[str, Any], token: str) -> Any:
    """Worker side: an input's read-only handle, cached per process and job ``token``."""
    return cached_array(url, storage_options, token)


def read_block(
    array: Any,
    rows: tuple[int, int],
    cols: tuple[int, int],
    dtype: str,
    name: str = "input",
    url: str = "",
    out: NDArray[Any] | None = None,
) -> NDArray[Any]:
    """A C-contiguous block in ``dtype``, read by slice (no rechunk of the store); with
    ``out`` (C-contiguous, of the block's shape and ``dtype``) decoded straight into it, each
    chunk cast by numpy as ``ascontiguousarray`` would, so the values are the same.

    A stored chunk that cannot be read or decoded (corrupt, truncated, unreadable) becomes an
    InputError naming it; a connection error stays as it is (the storage, not the input).
    """
    selection = (slice(rows[0], rows[1]), slice(cols[0], cols[1]))
    try:
        if out is not None:
            array.get_basic_selection(selection, out=NDBuffer.from_numpy_array(out))
            return out
        block = array[selection]
    except Exception as e:
        bad = None if storage_problem(e, None) else _bad_chunk(array, rows, cols)
        if bad is None:
            raise
        (index, span, error) = bad
        key = f"{url.rstrip('/')}/{array.metadata.encode_chunk_key(index)}"
        raise InputError(
            f"{name} ({url}) has a chunk that cannot be read: {key} (rows {span[0]}:{span[1]}, "
            f"columns {span[2]}:{span[3]}) fails with {type(error).__name__}: {error}; restore "
            f"that chunk from a good copy or rewrite {name}, then rerun with --resume"
        ) from e
    return np.ascontiguousarray(block, dtype=dtype)


def _bad_chunk(
    array: Any, rows: tuple[int, int], cols: tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int, int, int], Exception] | None:
    """The first stored chunk of the block that fails when read alone, with its span."""
    (m, n), (cm, cn) = array.shape, getattr(array, "shards", None) or array.chunks
    for i in range(rows[0] // cm, -(-rows[1] // cm)):
        for j in range(cols[0] // cn, -(-cols[1] // cn)):
            span = (i * cm, min((i + 1) * cm, m), j * cn, min((j + 1) * cn, n))
            try:
                array[span[0] : span[1], span[2] : span[3]]
            except Exception as e:  # noqa: BLE001 - whatever the codec or the store raised
                return (i, j), span, e
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

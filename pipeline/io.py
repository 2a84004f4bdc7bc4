"""Zarr I/O: inputs opened read-only (v2 or v3, any fsspec URL), the output created as v3."""

from __future__ import annotations

import functools
import json
import os
import uuid
from typing import Any

import dask
import fsspec
import numpy as np
import zarr
import zarr.errors
from numpy.typing import NDArray
from zarr.codecs import BloscCodec

from pipeline.errors import (
    InputError,
    InputNotFoundError,
    OutputExistsError,
    UnsafeOutputError,
    UsageError,
    storage_problem,
)
from pipeline.spec import ArraySpec

ATTRS_KEY = "tilegemm"
"""Attribute namespace this tool writes into OUT; its presence marks OUT as ours."""


def open_input(url: str, storage_options: dict[str, Any] | None = None, name: str = "A") -> Any:
    """Open a Zarr array read-only, or raise a PipelineError that names the problem."""
    _check_protocol(url, name)
    local = _local_path(url)
    if local is not None and os.path.islink(local) and not os.path.exists(local):
        raise InputNotFoundError(
            f"{name} ({url}) is a symbolic link that leads nowhere (a loop, or a missing "
            "target); point it at a Zarr array"
        )
    if local is None:
        _probe(url, storage_options, name)
    try:
        array = zarr.open_array(url, mode="r", storage_options=_options(url, storage_options))
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


@functools.lru_cache(maxsize=32)
def _cached_array(url: str, options_json: str, mode: str, token: str) -> Any:
    return zarr.open_array(url, mode=mode, storage_options=_options(url, json.loads(options_json)))


def worker_array(
    url: str, storage_options: dict[str, Any], token: str, writable: bool = False
) -> Any:
    """An array handle cached per worker process and job ``token`` (a store may be replaced
    between jobs on a long-lived cluster), so tasks don't re-read metadata."""
    options = json.dumps(storage_options, sort_keys=True)
    return _cached_array(url, options, "r+" if writable else "r", token)


def read_block(
    array: Any,
    rows: tuple[int, int],
    cols: tuple[int, int],
    dtype: str,
    name: str = "input",
    url: str = "",
) -> NDArray[Any]:
    """A C-contiguous block in ``dtype``, read by slice (no rechunk of the store).

    A stored chunk that cannot be read or decoded (corrupt, truncated, unreadable) becomes an
    InputError naming it; a connection error stays as it is (the storage, not the input).
    """
    try:
        block = array[rows[0] : rows[1], cols[0] : cols[1]]
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


def create_output(
    url: str,
    shape: tuple[int, int],
    chunks: tuple[int, int],
    dtype: str,
    attributes: dict[str, Any],
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Any:
    """Create OUT as a Zarr v3 array. Floats are filled with NaN so unwritten tiles show."""
    fill = np.nan if np.dtype(dtype).kind in "fc" else 0
    compressors = output_compressors(dtype)
    return zarr.create_array(
        url,
        shape=shape,
        chunks=tuple(max(c, 1) for c in chunks),
        dtype=dtype,
        fill_value=fill,
        compressors=compressors,
        zarr_format=3,
        attributes={ATTRS_KEY: attributes},
        storage_options=_options(url, storage_options),
        overwrite=overwrite,
    )


def output_compressors(dtype: str) -> Any:
    """The output codec: config ``tilegemm.output-compressor`` = auto | none | lz4 | zstd.

    auto: none for float and complex products — their mantissas are noise (Blosc-LZ4 stored
    a 12288² float32 product at ratio 1.07 for 3x the write CPU of no compression, zstd 1.09
    at 3x), and writing is on the critical path; Blosc-LZ4 for integers, which compress.
    """
    choice = str(dask.config.get("tilegemm.output-compressor", "auto"))
    if choice == "auto":
        choice = "none" if np.dtype(dtype).kind in "fc" else "lz4"
    if choice == "none":
        return None
    if choice == "lz4":
        return [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]
    if choice == "zstd":
        return "auto"  # zarr's default (zstd)
    raise UsageError(f"tilegemm.output-compressor is {choice!r}; use auto, none, lz4 or zstd")


def output_state(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """None when OUT does not exist; our attributes when it is one of our arrays; else refuse."""
    fs, path = url_to_fs(url, storage_options)
    try:
        exists = fs.exists(path)
    except Exception as e:
        problem = storage_problem(e, storage_options)
        if problem is None:
            raise
        raise UsageError(f"OUT ({url}) cannot be reached: {problem}") from e
    if not exists:
        return None
    try:
        array = zarr.open_array(url, mode="r", storage_options=_options(url, storage_options))
        attrs = dict(array.attrs).get(ATTRS_KEY)
    except Exception:  # noqa: BLE001 - anything unreadable is "not ours"
        attrs = None
    if not isinstance(attrs, dict):
        raise UnsafeOutputError(
            f"OUT ({url}) exists and is not a Zarr array written by this tool; "
            "it will not be replaced: choose another OUT path or remove it yourself"
        )
    return attrs


def check_output_path(out: str, inputs: list[str], storage_options: dict[str, Any] | None) -> None:
    """Refuse OUT equal to, inside, or containing an input (overwrite could destroy it)."""
    _check_protocol(out, "OUT")
    out_key = _location(out, storage_options)
    for name, url in zip(("A", "B", "C"), inputs, strict=False):
        key = _location(url, storage_options)
        if out_key == key or _inside(out_key, key) or _inside(key, out_key):
            raise UnsafeOutputError(
                f"OUT ({out}) overlaps input {name} ({url}); inputs are never written: "
                "choose an OUT path outside every input"
            )


def refuse_existing(out: str, overwrite: bool, resume: bool) -> None:
    if not (overwrite or resume):
        raise OutputExistsError(
            f"OUT ({out}) already exists; pass --overwrite to replace it or --resume to "
            "finish an interrupted run"
        )


def url_to_fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    try:
        fs, path = fsspec.core.url_to_fs(url, **(_options(url, storage_options) or {}))
    except (ImportError, ValueError) as e:
        raise UsageError(f"cannot open {url}: {e}") from e
    return fs, str(path)


def write_bytes(url: str, relpath: str, data: bytes, storage_options: dict[str, Any]) -> None:
    fs, path = url_to_fs(url, storage_options)
    target = f"{path.rstrip('/')}/{relpath}"
    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)  # a no-op on object stores
    if _local_path(url) is None:
        fs.pipe_file(target, data)  # an object store's put is atomic
        return
    # Local files: write aside, then rename, so a job killed mid-write leaves no torn file.
    partial = f"{target}.{uuid.uuid4().hex}.partial"
    fs.pipe_file(partial, data)
    os.replace(partial, target)


def list_json(url: str, relpath: str, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    fs, path = url_to_fs(url, storage_options)
    folder = f"{path.rstrip('/')}/{relpath}"
    if not fs.exists(folder):
        return []
    entries = []
    for p in sorted(fs.ls(folder, detail=False)):
        if not str(p).endswith(".json"):
            continue  # e.g. a ".partial" file of a job killed mid-write
        try:
            entries.append(json.loads(fs.cat_file(p)))
        except ValueError:  # torn by a crash (stores without atomic writes): not an entry
            continue
    return entries


def _location(url: str, storage_options: dict[str, Any] | None) -> tuple[str, str]:
    fs, path = url_to_fs(url, storage_options)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        path = os.path.realpath(path)
    return (protocol, path.rstrip("/"))


def _inside(child: tuple[str, str], parent: tuple[str, str]) -> bool:
    return child[0] == parent[0] and child[1].startswith(parent[1] + "/")


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


def _check_protocol(url: str, name: str) -> None:
    protocol, _ = fsspec.core.split_protocol(url)
    if protocol is None:
        return
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError as e:
        raise UsageError(
            f"{name} ({url}) has the unknown protocol '{protocol}://'; give a local path or an "
            "fsspec URL such as s3://bucket/a.zarr"
        ) from e
    except ImportError as e:
        raise UsageError(f"{name} ({url}) needs a package that is not installed: {e}") from e


def _local_path(url: str) -> str | None:
    """The file system path of a local path or file:// URL; None for other URLs."""
    if url.startswith("file://"):
        return url.removeprefix("file://")
    return None if "://" in url else url


def open_output(url: str, storage_options: dict[str, Any] | None) -> Any:
    return zarr.open_array(url, mode="r+", storage_options=_options(url, storage_options))


def _options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """fsspec options apply only to URLs; zarr refuses them for local paths."""
    if not storage_options or "://" not in url or url.startswith("file://"):
        return None
    return storage_options

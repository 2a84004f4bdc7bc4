"""What the API accepts for A, B and OUT, as a URL and fsspec options the workers can open.

A path (``str`` or ``os.PathLike``), an fsspec URL, or a ``zarr.Array`` whose store the workers
can reach: a local store, an fsspec store (its file system's options come along) or a zip
store. A zarr.Array in a memory store lives in this process only, so it is refused; numpy and
dask arrays as A and B are copied before they get here (pipeline.store.in_memory), and as OUT
are refused.
"""

from __future__ import annotations

import os
from typing import Any

import zarr
from zarr.storage import FsspecStore, LocalStore, MemoryStore, ZipStore

from pipeline.errors import ArgumentTypeError, UsageError
from pipeline.sensitive.text import is_sensitive
from pipeline.sensitive.values import redact
from pipeline.store.fs import normalize_url
from pipeline.store.in_memory import refuse_as_out

ACCEPTED = "a path (str or os.PathLike), an fsspec URL such as s3://bucket/a.zarr, or a zarr.Array"


def locate(obj: object, name: str) -> tuple[str, dict[str, Any]]:
    """(URL, fsspec options) of ``obj``; the options are empty unless ``obj`` is an array
    opened through fsspec with options of its own."""
    if isinstance(obj, os.PathLike):
        obj = os.fspath(obj)
    if isinstance(obj, str):
        return normalize_url(obj), {}
    if isinstance(obj, zarr.Array):
        return _array_location(obj, name)
    if name == "OUT":
        refuse_as_out(obj)
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    also = "" if name == "OUT" else ", or a numpy or dask array (copied to a temporary Zarr array)"
    raise ArgumentTypeError(f"{name} is a {kind}; give {ACCEPTED}{also}")


def merge_options(name_options: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One set of fsspec options for every array (the job passes one to all URLs): the union,
    refused when two sources give one key different values."""
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name, options in name_options:
        for key, value in options.items():
            if key in merged and merged[key] != value:
                values = (
                    "two values, hidden"
                    if is_sensitive(key)
                    else f"{redact(merged[key])!r} vs {redact(value)!r}"
                )
                raise UsageError(
                    f"{source[key]} and {name} disagree on the storage option {key!r} "
                    f"({values}); the job opens every array with one set "
                    "of options: give arrays on the same storage, or paths and storage_options="
                )
            merged[key], source[key] = value, name
    return merged


def _array_location(array: Any, name: str) -> tuple[str, dict[str, Any]]:
    store, path = array.store, array.path
    if isinstance(store, LocalStore):
        return os.path.join(str(store.root), path) if path else str(store.root), {}
    if isinstance(store, ZipStore):
        return f"zip://{path}::{store.path}", {}
    if isinstance(store, FsspecStore):
        return _fsspec_location(store, path, name)
    if isinstance(store, MemoryStore):
        raise UsageError(
            f"{name} is a zarr.Array in memory (a {type(store).__name__}), which the Dask "
            "workers (other processes) can't see; save it first, e.g. "
            "zarr.create_array('a.zarr', data=array[:]), and pass that path"
        )
    raise UsageError(
        f"{name} is a zarr.Array in a {type(store).__name__}, which this tool can't hand to "
        "the workers; pass the array's path or URL instead"
    )


def _fsspec_location(store: FsspecStore, path: str, name: str) -> tuple[str, dict[str, Any]]:
    fs = getattr(store.fs, "sync_fs", store.fs)  # zarr wraps synchronous file systems
    full = "/".join(p.strip("/") for p in (store.path, path) if p.strip("/"))
    options = {k: v for k, v in fs.storage_options.items() if k != "asynchronous"}
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        return "/" + full if store.path.startswith("/") else full, {}
    if protocol == "zip":
        if options.get("target_options"):
            raise UsageError(
                f"{name} is a zarr.Array in a zip archive opened with options of its own; "
                "pass its URL (zip://PATH::ARCHIVE) and storage_options= instead"
            )
        target = str(options.get("fo", ""))
        if "://" not in target and options.get("target_protocol") not in (None, "file"):
            target = f"{options['target_protocol']}://{target}"
        return f"zip://{full}::{target}", {}
    return fs.unstrip_protocol(full), options

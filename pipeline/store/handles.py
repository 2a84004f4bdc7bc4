"""Zarr array handles cached per worker process, so tasks don't re-read metadata."""

from __future__ import annotations

import functools
import json
from typing import Any

import zarr

from pipeline.store.chunks.bounded import open_input_array
from pipeline.store.direct import OutStore
from pipeline.store.fs import fsspec_options


@functools.lru_cache(maxsize=32)
def _open(url: str, options_json: str, mode: str, token: str) -> Any:
    options = json.loads(options_json)
    if mode == "r":  # local files read within bounds (pipeline.store.chunks.input_store)
        return open_input_array(url, fsspec_options(url, options))
    array = open_output(url, options, mode)  # a local OUT: through its door
    # Every chunk we compute is stored, even one equal to the fill value: zarr would otherwise
    # compare each with it first (isnan and equal over the whole chunk for a NaN fill: a
    # measurable share of a job's CPU time) and delete the stored chunk of a result that
    # happens to be NaN.
    return array.with_config({"write_empty_chunks": True})


def open_output(url: str, storage_options: dict[str, Any] | None, mode: str = "r") -> Any:
    """OUT (or C) opened as its owner opens it: a local one through an OutStore (every read
    and write by its door, reads bounded), else by URL."""
    if "://" in url:
        return zarr.open_array(url, mode=mode, storage_options=fsspec_options(url, storage_options))
    store = OutStore(url, read_only=mode == "r")
    return store.bound(zarr.open_array(store=store, mode=mode))


def cached_array(
    url: str, storage_options: dict[str, Any], token: str, writable: bool = False
) -> Any:
    """The array at ``url``, cached per process and job ``token`` (a store may be replaced
    between jobs on a long-lived cluster)."""
    options = json.dumps(storage_options, sort_keys=True)
    return _open(url, options, "r+" if writable else "r", token)

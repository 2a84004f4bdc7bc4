"""Zarr array handles cached per worker process, so tasks don't re-read metadata."""

from __future__ import annotations

import functools
import json
from typing import Any

import zarr

from pipeline.store.direct import DirectLocalStore
from pipeline.store.fs import fsspec_options


@functools.lru_cache(maxsize=32)
def _open(url: str, options_json: str, mode: str, token: str) -> Any:
    options = fsspec_options(url, json.loads(options_json))
    if mode != "r" and "://" not in url and not options:  # a local OUT: large chunks O_DIRECT
        return zarr.open_array(store=DirectLocalStore(url), mode=mode)
    return zarr.open_array(url, mode=mode, storage_options=options)


def cached_array(
    url: str, storage_options: dict[str, Any], token: str, writable: bool = False
) -> Any:
    """The array at ``url``, cached per process and job ``token`` (a store may be replaced
    between jobs on a long-lived cluster)."""
    options = json.dumps(storage_options, sort_keys=True)
    return _open(url, options, "r+" if writable else "r", token)

"""An input path that opens as no array: a group (AnnData's sparse matrix, whose refusal says
how to write it dense, or a store holding arrays that could be named instead) or nothing Zarr
at all. Every document read bounded, as an input's."""

from __future__ import annotations

import collections
import contextlib
import warnings
from typing import Any

import numpy as np
import zarr
import zarr.errors
from zarr.core.sync import sync

from pipeline.errors import InputError, InputNotFoundError, PipelineError, StoredObjectError
from pipeline.store.chunks.archive_store import archive_store
from pipeline.store.chunks.input_store import METADATA_KEYS, InputStore, named
from pipeline.store.fs import fsspec_options, local_path

SPARSE = {"csr_matrix": "rows", "csc_matrix": "columns"}
"""AnnData's sparse encodings, each with the axis a dense copy is written along."""
MEMBERS_LISTED = 5
"""Arrays a group given as an input names as the ones to give instead."""
NODES_LOOKED_AT = 64
"""Entries of such a group (and of the groups inside it) looked at to find them."""


def not_an_array(
    url: str, storage_options: dict[str, Any] | None, name: str, error: Exception
) -> PipelineError:
    """Why ``url`` opens as no array: a group (AnnData's sparse matrix, or the arrays inside it
    that could be given instead), or nothing Zarr at all."""
    group = _open_group(url, storage_options, name)
    if group is not None:
        return _group_refusal(group, url, name)
    if isinstance(error, zarr.errors.NodeTypeValidationError):
        return InputError(
            f"{name} ({url}) is a Zarr group, not an array; give the path of an array inside it"
        )
    return InputNotFoundError(
        f"{name} ({url}) holds no Zarr array (no .zarray or zarr.json found); "
        "give the path of a Zarr array"
    )


def _open_group(url: str, storage_options: dict[str, Any] | None, name: str) -> Any | None:
    """The group at ``url``, read-only (local or in an archive: every document read bounded,
    as an input's); None when there is none."""
    local = local_path(url)
    try:
        with warnings.catch_warnings():  # AnnData's consolidated metadata, not yet in v3's spec
            warnings.simplefilter("ignore")
            if local is not None:
                return zarr.open_group(store=InputStore(local), mode="r")
            options = fsspec_options(url, storage_options)
            archive = archive_store(url, options)
            if archive is not None:
                return zarr.open_group(store=archive, mode="r")
            return zarr.open_group(url, mode="r", storage_options=options)
    except StoredObjectError as e:
        raise named(e, name, url) from e
    except Exception:  # noqa: BLE001 - no group there either: the caller says what is not
        return None


def _group_refusal(group: Any, url: str, name: str) -> InputError:
    encoding = group.attrs.get("encoding-type")
    if _sparse(group):
        return _sparse_refusal(group, url, name, str(encoding))
    what = "a Zarr group"
    if isinstance(encoding, str):
        what += " (an AnnData store)" if encoding == "anndata" else f" (AnnData {encoding})"
    found, complete = _usable_arrays(group, url)
    if found:
        return InputError(
            f"{name} ({url}) is {what}, not an array; arrays inside it that can be "
            f"multiplied: {', '.join(found)}; give the path of one of them"
        )
    among = "" if complete else f" among the first {NODES_LOOKED_AT} entries looked at"
    return InputError(
        f"{name} ({url}) is {what}, not an array, and holds no 2-D numeric array{among}; "
        "give the path of a 2-D Zarr array"
    )


def _sparse(group: Any) -> bool:
    """AnnData's sparse matrix (its attribute is anyone's: a list or a number is not one)."""
    encoding = group.attrs.get("encoding-type")
    return isinstance(encoding, str) and encoding in SPARSE


def _sparse_refusal(group: Any, url: str, name: str, encoding: str) -> InputError:
    """AnnData's sparse matrix (a group of data, indices and indptr), with a way to write it
    dense that never holds all of it in memory."""
    facts = [f"AnnData {encoding}"]
    shape = group.attrs.get("shape")
    if isinstance(shape, list) and len(shape) == 2 and all(isinstance(s, int) for s in shape):
        facts.append(f"{shape[0]}x{shape[1]}")
    with contextlib.suppress(Exception):  # a fact of the message only
        facts.append(f"{int(group['data'].shape[0])} stored values")
    parts = url.rstrip("/").split("/")
    mapping = len(parts) > 1 and parts[-2] in ("layers", "obsm", "varm", "obsp", "varp")
    attribute = f"adata.{parts[-2]}[{parts[-1]!r}]" if mapping else "adata.X"
    dense = f"{parts[-1]}_dense.zarr"
    block = "[i:i+1024]" if SPARSE[encoding] == "rows" else "[:, i:i+1024]"
    axis = 0 if SPARSE[encoding] == "rows" else 1
    return InputError(
        f"{name} ({url}) is a sparse matrix ({', '.join(facts)}): sparse input is not "
        f"supported; write it dense, e.g. {attribute} = {attribute}.toarray() before "
        "write_zarr, or chunk by chunk, never all of it in memory: "
        f"`x = anndata.io.sparse_dataset(zarr.open_group({url!r}, mode='r'))`, "
        f"`d = zarr.create_array({dense!r}, shape=x.shape, dtype=x.dtype, chunks=(1024, 1024))`, "
        f"then `for i in range(0, x.shape[{axis}], 1024): d{block} = x{block}.toarray()`; "
        f"give {dense} as {name}"
    )


def _usable_arrays(group: Any, url: str) -> tuple[list[str], bool]:
    """Up to MEMBERS_LISTED 2-D numeric arrays inside ``group``, breadth first, as "URL (MxN
    dtype)"; and whether every entry was looked at (at most NODES_LOOKED_AT are)."""
    found: list[str] = []
    queue, looked = collections.deque([(group, "")]), 0
    while queue and len(found) < MEMBERS_LISTED:
        parent, prefix = queue.popleft()
        for child in _child_names(parent):
            if looked == NODES_LOOKED_AT:
                return found, False
            looked += 1
            node, path = _member(parent, child), f"{prefix}{child}"
            if isinstance(node, zarr.Group) and not _sparse(node):
                queue.append((node, f"{path}/"))
            elif isinstance(node, zarr.Array) and _multipliable(node):
                shape = "x".join(str(s) for s in node.shape)
                found.append(f"{url.rstrip('/')}/{path} ({shape} {np.dtype(node.dtype)})")
                if len(found) == MEMBERS_LISTED:
                    break
    return found, True


def _child_names(group: Any) -> list[str]:
    """The names of a group's entries, sorted: of the first NODES_LOOKED_AT + 1 listed."""

    async def first() -> list[str]:
        names: list[str] = []
        async for key in group.store.list_dir(group.path):
            if len(names) > NODES_LOOKED_AT:
                break
            if key not in METADATA_KEYS:
                names.append(key)
        return names

    return sorted(sync(first()))


def _member(group: Any, name: str) -> Any:
    """The array or group ``name`` of ``group``; None for anything else (a file, a folder
    without metadata, a document refused or unreadable): only a hint is lost."""
    try:
        return group[name]
    except Exception:  # noqa: BLE001 - not a node: not listed
        return None


def _multipliable(array: Any) -> bool:
    try:
        return array.ndim == 2 and np.dtype(array.dtype).kind in "biufc"
    except TypeError:  # a dtype numpy does not know
        return False

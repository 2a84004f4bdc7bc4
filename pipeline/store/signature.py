"""What an input's stored data looked like: each stored object's name with its size and change
marks, so --resume can tell which chunks of an input changed since OUT's tiles were written
(and recompute just the tiles that read them), and a job, that one changed while it ran.

Cost: one listing per input (no data read): a local walk with one ``stat`` per chunk file, or
one LIST request per 1,000 objects on S3. Local files count their size, mtime, ctime (which
no user can set back) and inode; objects their size, ETag and date. Blind spots (DESIGN.md):
a rewrite of the same size within the file system's timestamp granularity (ns on ext4 and
xfs, 1-2 s on some network and FAT file systems), and a zip member rewritten within its 2 s
date step.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pipeline.store.chunks.archive_store import archive_path, archive_store
from pipeline.store.fs import local_path, url_to_fs
from pipeline.store.reach import reach

MARKS = ("size", "mtime", "created", "ino", "ETag", "etag", "LastModified", "last_modified",
         "generation", "md5Hash", "crc32c", "crc", "date_time")  # fmt: skip
"""Fields of fsspec's ``info`` that change when an object is rewritten, by file system."""
LISTING_NAME = "inputs.json"
"""Inside OUT: the inputs' listings as of the last run's start."""

Listing = dict[str, str]
"""Stored object (relative to the array) -> its size and change marks."""


def data_listing(url: str, storage_options: dict[str, Any] | None) -> Listing:
    """The input at ``url`` as stored now: every object's name and change marks (a local
    input's links followed, as its reads follow them, each folder once; a local archive
    opened as its reads open it)."""
    local = local_path(url)
    if local is not None:
        return reach(local).files
    archive = archive_store(url, storage_options) if archive_path(url) else None
    fs, root = (archive.fs, archive.root) if archive else url_to_fs(url, storage_options)
    root = root.rstrip("/")
    found = fs.find(root, detail=True) if fs.isdir(root) else {root: fs.info(root)}
    listing = {}
    for name, info in found.items():
        marks = [str(info.get(k)) for k in MARKS if info.get(k) is not None]
        listing[str(name)[len(root) :].lstrip("/")] = "|".join(marks)
    return listing


def key_encoding(array: Any) -> tuple[str, str]:
    """(zarr's chunk key encoding name, separator) of an input, to read its chunk keys."""
    meta = array.metadata
    if meta.zarr_format == 2:
        return "v2", meta.dimension_separator or "."
    encoding = meta.chunk_key_encoding
    return str(encoding.name), str(encoding.separator)


def chunk_index(
    key: str, encoding: tuple[str, str], split: int | None = None
) -> tuple[int, int] | None:
    """(row, column) of a 2-D chunk key (``c/1/0``, ``c.1.0``, ``1.0``, ``1/0``), else None.
    (zarr 3.1's own ``decode_chunk_key`` mis-reads ``c/1/0``.) ``split``: an N-D field read
    as a matrix (pipeline.store.fields), whose chunk ``c/i/.../j/...`` is in the matrix's
    chunk (i, j): its first dimension's index and its ``split``-th's."""
    name, separator = encoding
    prefix = "c" + separator if name == "default" else ""
    parts = key.removeprefix(prefix).split(separator) if key.startswith(prefix) else []
    if split is not None and len(parts) > split and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[split])
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def changed_chunks(
    then: Listing, now: Listing, encoding: tuple[str, str], split: int | None = None
) -> set[tuple[int, int]]:
    """The (row, column) indices of stored objects (chunks, or shards) added, removed or
    rewritten between two listings; files that are no chunk key (metadata, strays) are left
    out: a metadata change is the fingerprint's to catch. ``split``: ``chunk_index``'s."""
    changed = set()
    for key in then.keys() | now.keys():
        if then.get(key) != now.get(key):
            index = chunk_index(key, encoding, split)
            if index is not None:
                changed.add(index)
    return changed


def encode(listings: dict[str, Listing]) -> bytes:
    return json.dumps(listings, sort_keys=True).encode()


def metadata_digest(arrays: tuple[Any, Any]) -> str:
    """Digest of both inputs' Zarr metadata (codecs, fill value, attributes...)."""
    meta = [json.dumps(x.metadata.to_dict(), sort_keys=True, default=str) for x in arrays]
    return hashlib.sha256("\n".join(meta).encode()).hexdigest()[:16]

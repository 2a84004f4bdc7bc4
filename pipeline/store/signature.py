"""What an input's stored data looked like: a listing of its objects with their sizes and
modification marks, digested, so --resume can tell that an input changed since OUT's tiles
were written (and a job, that one changed while it ran).

Cost: one listing per input (no data read): a local walk with one ``stat`` per chunk file, or
one LIST request per 1,000 objects on S3. Local files count their size, mtime, ctime (which
no user can set back) and inode; objects their size, ETag and date. Blind spots (DESIGN.md):
a rewrite of the same size within the file system's timestamp granularity (ns on ext4 and
xfs, 1-2 s on some network and FAT file systems), and a zip member rewritten within its 2 s
date step.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pipeline.store.fs import url_to_fs

MARKS = ("size", "mtime", "created", "ino", "ETag", "etag", "LastModified", "last_modified",
         "generation", "md5Hash", "crc32c", "crc", "date_time")  # fmt: skip
"""Fields of fsspec's ``info`` that change when an object is rewritten, by file system."""


def data_signature(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """{"objects": count, "bytes": stored bytes, "digest": hex} of the input at ``url``."""
    fs, root = url_to_fs(url, storage_options)
    root = root.rstrip("/")
    listing = fs.find(root, detail=True) if fs.isdir(root) else {root: fs.info(root)}
    digest = hashlib.sha256()
    total = 0
    for name in sorted(listing):
        info = listing[name]
        size = int(info.get("size") or 0)
        total += size
        marks = [str(info.get(k)) for k in MARKS if info.get(k) is not None]
        digest.update(f"{str(name)[len(root) :]}\t{size}\t{'|'.join(marks)}\n".encode())
    return {"objects": len(listing), "bytes": total, "digest": digest.hexdigest()[:16]}


def describe_change(name: str, then: dict[str, Any], now: dict[str, Any]) -> str:
    """``A's stored data changed (36 objects, 1.2e+09 bytes then; 36, 1.2e+09 now)``."""
    return (
        f"{name}'s stored data changed ({then.get('objects')} objects, {then.get('bytes')} bytes "
        f"then; {now['objects']} objects, {now['bytes']} bytes now"
        + (": same count and size, rewritten in place)" if _same_size(then, now) else ")")
    )


def _same_size(then: dict[str, Any], now: dict[str, Any]) -> bool:
    return bool(then.get("objects") == now["objects"] and then.get("bytes") == now["bytes"])

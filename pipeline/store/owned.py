"""What inside OUT this tool writes, so --overwrite removes exactly that and nothing else.

An array of ours holds its metadata, chunk keys, the journal, the lock and the ``.partial``
files of interrupted atomic writes. Anything else (a notes file, a child array, a symlink) means
OUT is more than our array: it is refused, never deleted.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pipeline.store.fs import local_path, url_to_fs
from pipeline.store.lock import LOCK_NAME

PARTIAL = r"(\.[0-9a-f]+\.partial)?"
"""zarr's and our own atomic writes leave ``NAME.<uuid hex>.partial`` when killed mid-write."""
OWNED = re.compile(
    r"(zarr\.json|\.zarray|\.zattrs|lock\.json|inputs\.json"  # metadata, the lock, listings
    r"|c/\d+/\d+|\d+[./]\d+"  # chunk keys: v3 ("c/i/j"), v2 ("i.j" or "i/j")
    r"|journal/tile-\d+-\d+\.json"  # the journal
    r"|journal/band-\d+-\d+-\d+\.json"  # its entries of tiles in flight
    rf"){PARTIAL}"
    r"|(c/\d+/|journal/|)[^/]*\.[0-9a-f]+\.partial"  # zarr's partials: suffix replaced
    r"|\.tilegemm-accumulate/.+"  # an unfinished accumulation's state and originals
)
OWNED_DIRS = re.compile(r"c|c/\d+|\d+|journal|\.tilegemm-accumulate(/.+)?")


def entries(url: str, storage_options: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(ours, foreign): OUT's files as paths relative to OUT; symlinks are always foreign."""
    local = local_path(url)
    if local is not None:
        return _local_entries(local)
    fs, root = url_to_fs(url, storage_options)
    root = root.rstrip("/")
    names = [p[len(root) + 1 :] for p in fs.find(root) if str(p).startswith(root + "/")]
    ours = [n for n in names if OWNED.fullmatch(n)]
    return ours, [n for n in names if not OWNED.fullmatch(n)]


def remove_ours(url: str, storage_options: dict[str, Any], keep: tuple[str, ...] = ()) -> int:
    """Delete our files inside OUT (not ``keep``) after checking there is nothing foreign;
    returns how many were deleted."""
    ours, foreign = entries(url, storage_options)
    if foreign:
        raise ValueError(foreign)  # callers check first; this is the last line of defence
    doomed = [n for n in ours if n not in keep]
    local = local_path(url)
    if local is None:
        fs, root = url_to_fs(url, storage_options)
        if doomed:
            fs.rm([f"{root.rstrip('/')}/{n}" for n in doomed])
        return len(doomed)
    for name in doomed:
        os.unlink(os.path.join(local, name))
    for folder, _, _ in os.walk(local, topdown=False):
        if folder != local and not os.listdir(folder):
            os.rmdir(folder)
    return len(doomed)


def only_lock(url: str, storage_options: dict[str, Any]) -> bool:
    """OUT holds nothing but (at most) a lock: a new OUT, or an empty folder."""
    ours, foreign = entries(url, storage_options)
    return not foreign and all(n == LOCK_NAME for n in ours)


def _local_entries(root: str) -> tuple[list[str], list[str]]:
    ours: list[str] = []
    foreign: list[str] = []
    for folder, subdirs, files in os.walk(root):
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if rel == "." else rel + "/"
        for name in list(subdirs):
            if os.path.islink(os.path.join(folder, name)) or not OWNED_DIRS.fullmatch(
                prefix + name
            ):
                foreign.append(prefix + name + "/")
                subdirs.remove(name)  # never walked, never deleted
        for name in files:
            path = prefix + name
            link = os.path.islink(os.path.join(folder, name))
            (ours if OWNED.fullmatch(path) and not link else foreign).append(path)
    return ours, foreign

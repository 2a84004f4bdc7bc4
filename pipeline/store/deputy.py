"""No confused deputy: a link another user made leads only where that user could go.

Run by root, or by a service account for others, this tool can read and write more than the
owner of a link it meets. Followed blindly, such a link hands its owner the caller's rights:
a chunk of an input linked to a file only root can read puts that file's bytes in OUT; OUT's
folder linked into one only root can write makes root write there. So a link owned by anyone
but the caller (or root) is followed only to a file its owner could read (for a read) or into
a folder its owner could write (for a write), judged by mode bits, owner and groups, with the
right to search every folder above. A name with a second hard link counts as made by its
folder's owner. The caller's own links, and root's, are followed as the file system does.
"""

from __future__ import annotations

import functools
import os
import stat

R, W, X = 4, 2, 1
"""The permission bits of one class (owner, group, others)."""


@functools.lru_cache(maxsize=256)
def groups_of(uid: int) -> frozenset[int]:
    """Every group ``uid`` is in; none known for a uid without a name (then only its own
    files and the others' bits decide)."""
    import pwd

    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    try:
        return frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        return frozenset({entry.pw_gid})


def can(uid: int, st: os.stat_result, want: int) -> bool:
    """Whether ``uid`` may ``want`` (R, W, X, or'd) the file of ``st`` by its mode bits."""
    if uid == 0:
        return True
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == uid:
        bits = mode >> 6
    elif st.st_gid in groups_of(uid):
        bits = mode >> 3
    else:
        bits = mode
    return bits & want == want


def reaches(uid: int, path: str) -> bool:
    """Whether ``uid`` may search every folder above ``path`` (``path`` resolved)."""
    folder = os.path.dirname(path)
    while True:
        try:
            if not can(uid, os.stat(folder), X):
                return False
        except OSError:
            return False
        if folder == os.path.dirname(folder):
            return True
        folder = os.path.dirname(folder)


def trusted(uid: int) -> bool:
    """Links of the caller, and of root, are followed as the file system follows them."""
    return uid in (0, os.geteuid())


def planters_on(path: str) -> tuple[set[int], str]:
    """The owners of the links met resolving ``path`` whom ``trusted`` does not cover, and
    the path resolved. Looks at each component with ``lstat``, as the kernel resolves it."""
    owners: set[int] = set()
    parts = [p for p in os.path.abspath(path).split("/") if p]
    where, followed = "/", 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            where = os.path.dirname(where)
            continue
        here = os.path.join(where, part)
        try:
            st = os.lstat(here)
        except OSError:
            return owners, os.path.join(here, *parts)
        if not stat.S_ISLNK(st.st_mode):
            where = here
            continue
        followed += 1
        if followed > 40:
            return owners, here  # a loop: the open says so
        if not trusted(st.st_uid):
            owners.add(st.st_uid)
        target = os.readlink(here)
        parts[:0] = [p for p in target.split("/") if p]
        if target.startswith("/"):
            where = "/"
    return owners, where


def unreadable_by(path: str, opened: os.stat_result) -> int | None:
    """The uid of a planter of ``path`` (a link's owner; a hard-linked file's folder owner)
    who could not read the file ``opened`` there; None when every planter could."""
    owners, resolved = planters_on(path)
    if opened.st_nlink > 1:
        try:
            folder = os.stat(os.path.dirname(resolved))
        except OSError:
            folder = None
        if folder is not None and not trusted(folder.st_uid):
            owners.add(folder.st_uid)
    for uid in sorted(owners):
        if not can(uid, opened, R) or not reaches(uid, resolved):
            return uid
    return None

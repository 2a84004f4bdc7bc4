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


def unreadable_by(path: str, opened: os.stat_result) -> tuple[int, str] | None:
    """(uid, how) of a planter of ``path`` who could not read the file ``opened`` there:
    ``symbolic link`` (its owner) or ``hard link`` (the owner of the folder holding a file
    with two names); None when every planter could. (-1, ``moved``) when the path leads
    elsewhere now: a link swapped after the open, whose maker is unknown."""
    owners, resolved = planters_on(path)
    try:
        if not os.path.samestat(os.stat(resolved), opened):
            return -1, "moved"
    except OSError:
        return -1, "moved"
    found = {uid: "symbolic link" for uid in owners}
    if opened.st_nlink > 1:
        try:
            folder = os.stat(os.path.dirname(resolved))
        except OSError:
            folder = None
        if folder is not None and not trusted(folder.st_uid):
            found.setdefault(folder.st_uid, "hard link")
    for uid, how in sorted(found.items()):
        if not can(uid, opened, R) or not reaches(uid, resolved):
            return uid, how
    return None


def refusal(path: str, opened: os.stat_result) -> str | None:
    """Why the file ``opened`` at ``path`` must not be read, in words that follow "is"; None
    when it may be."""
    found = unreadable_by(path, opened)
    if found is None:
        return None
    uid, how = found
    if how == "moved":
        return "reached through a path that changed as it was opened (a link swapped meanwhile)"
    made = "made by" if how == "symbolic link" else "in a folder of"
    return (
        f"reached through a {how} {made} {owner_name(uid)}, who cannot read the file it "
        f"leads to ({os.path.realpath(path)}: mode {stat.S_IMODE(opened.st_mode):04o}, owner "
        f"{owner_name(opened.st_uid)}); a link inside an input is followed only to what its "
        "maker could read"
    )


def owner_name(uid: int) -> str:
    """``alice (uid 1001)``, or ``uid 1001`` for a uid without a name."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"

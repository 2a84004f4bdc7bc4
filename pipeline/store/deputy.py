"""No confused deputy: what another user could have put on a path leads only where they
could go.

Run by root, or by a service account for others, this tool can read and write more than the
people who shape the paths it follows. A name in a folder was put there by someone who can
reach and write that folder (its owner, its group, anyone: a sticky folder keeps others from
renaming a folder in it, not from moving a link or a file of someone else's in), and a link's
target by the link's owner. Owners count as able to do anything with what they own: they can
chmod it back. Any of them but the caller and root is a *placer*. Followed blindly, a
placer's name hands them the caller's rights: a chunk of their input linked to (or moved
from) a file only root can read puts its bytes in OUT; OUT's folder linked into one only root
can write makes root write there. So a file is read only when every placer on its path could
read it, and a link is written through only into a folder every placer could write, judged
by mode bits, owner and groups, with the right to search every folder above. A group whose
members are all the caller (or root) places nothing: a user's private group is theirs.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass, field

R, W, X = 4, 2, 1
"""The permission bits of one class (owner, group, others)."""
ANYONE = ("anyone", -1)
MAX_LINKS = 40
"""Links followed on one path before it is taken for a loop (Linux's own limit)."""


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


@functools.lru_cache(maxsize=256)
def group_trusted(gid: int) -> bool:
    """Whether every member of ``gid`` (named, or by primary group) is trusted."""
    import grp
    import pwd

    try:
        names = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    members = {p.pw_uid for p in pwd.getpwall() if p.pw_gid == gid or p.pw_name in names}
    return bool(members) and all(trusted(uid) for uid in members)


@functools.lru_cache(maxsize=64)
def trusted(uid: int) -> bool:
    """The caller and root place nothing that could steer the caller."""
    return uid in (0, os.geteuid())


def can(uid: int, st: os.stat_result, want: int) -> bool:
    """Whether ``uid`` may ``want`` (R, W, X, or'd) the file of ``st`` by its mode bits."""
    if uid == 0 or st.st_uid == uid:  # an owner can chmod what they own at will
        return True
    mode = stat.S_IMODE(st.st_mode)
    bits = mode >> 3 if st.st_gid in groups_of(uid) else mode
    return bits & want == want


Placer = tuple[str, int]
"""``("user", uid)``, ``("group", gid)`` (any member) or ANYONE."""


def may(placer: Placer, st: os.stat_result, want: int) -> bool:
    """Whether ``placer`` may ``want`` the file of ``st``: a group's every member (by the
    group's or the others' bits), anyone (by the others' bits)."""
    kind, number = placer
    if kind == "user":
        return can(number, st, want)
    mode = stat.S_IMODE(st.st_mode)
    if kind == "group" and st.st_gid == number and (mode >> 3) & want == want:
        return True
    return mode & want == want


def shut_folder(
    placer: Placer, path: str, looks: dict[str, os.stat_result] | None = None
) -> str | None:
    """The first folder above ``path`` (resolved) that ``placer`` may not search; None when
    they reach it. ``looks`` keeps the folders' status for the next call."""
    looks = {} if looks is None else looks
    folder = os.path.dirname(path)
    while True:
        try:
            found = looks.get(folder)
            if found is None:
                found = looks[folder] = os.stat(folder)
        except OSError:
            return folder
        if not may(placer, found, X):
            return folder
        if folder == os.path.dirname(folder):
            return None
        folder = os.path.dirname(folder)


def reaches(placer: Placer, path: str, looks: dict[str, os.stat_result] | None = None) -> bool:
    """Whether ``placer`` may search every folder above ``path`` (``path`` resolved)."""
    return shut_folder(placer, path, looks) is None


def placers(folder: os.stat_result, entry: os.stat_result) -> set[Placer]:
    """Who besides the caller and root could have put ``entry`` in ``folder``: its owner, and
    whoever else may write it. A sticky folder holds that back only for a folder entry
    (renamed by its owner alone, moved in only by whoever may write it, to update its
    ``..``); a link or a file of anyone's can be moved in by any writer."""
    found: set[Placer] = set()
    if not trusted(folder.st_uid):
        found.add(("user", folder.st_uid))
    writers = folder
    if folder.st_mode & stat.S_ISVTX and stat.S_ISDIR(entry.st_mode):
        if not trusted(entry.st_uid):
            found.add(("user", entry.st_uid))
        writers = entry
    if writers.st_mode & stat.S_IWGRP and not group_trusted(writers.st_gid):
        found.add(("group", writers.st_gid))
    if writers.st_mode & stat.S_IWOTH:
        found.add(ANYONE)
    return found


def note(
    placed: dict[Placer, tuple[str, bool]],
    folder: os.stat_result,
    entry: os.stat_result,
    at: str,
    looks: dict[str, os.stat_result] | None = None,
) -> None:
    """Add to ``placed`` who could have put ``entry`` at ``at`` (in ``folder``): those who may
    write the folder and reach it (a 0777 folder inside a 0700 one is its owner's alone), and
    a link's owner; each with the first name of theirs and whether it is their link."""
    for placer in placers(folder, entry):
        if placer not in placed and reaches(placer, at, looks):
            placed[placer] = (at, False)
    if stat.S_ISLNK(entry.st_mode) and not trusted(entry.st_uid):
        link_owner = ("user", entry.st_uid)
        if not placed.get(link_owner, ("", False))[1]:  # their link says more than a name
            placed[link_owner] = (at, True)


def words(placer: Placer, how: tuple[str, bool]) -> str:
    """``/x/y, a symbolic link made by bob (uid 1001)`` or ``/x/y, which anyone could have
    put there``."""
    at, link = how
    if link:
        return f"{at}, a symbolic link made by {describe(placer)}"
    return f"{at}, which {describe(placer)} could have put there"


def describe(placer: Placer) -> str:
    kind, number = placer
    if kind == "user":
        return owner_name(number)
    if kind == "group":
        return f"the members of {group_name(number)}"
    return "anyone"


@dataclass
class Resolved:
    """A path resolved as the kernel resolves it, with who placed what on the way."""

    path: str
    placed: dict[Placer, tuple[str, bool]] = field(default_factory=dict)
    """Each placer -> the first name on the path they could have placed, and whether it is
    their link (see ``words``)."""


def resolve(path: str, seen: dict[str, os.stat_result] | None = None) -> Resolved:
    """Resolve ``path`` component by component with ``lstat`` (``..`` after a link goes to the
    link target's parent, as the kernel goes), noting every placer. ``seen`` keeps the looks
    at folders on the way for the next path (many files of one input share them)."""
    seen = {} if seen is None else seen  # folders only: a physical path's folders are real
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    parts = [p for p in path.split("/") if p]
    found = Resolved("/")
    where, folder, followed = "/", os.stat("/"), 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            where = os.path.dirname(where)
            folder = os.stat(where)
            continue
        here = os.path.join(where, part)
        try:
            entry = seen.get(here) if parts else None
            if entry is None:
                entry = os.lstat(here)
                if parts:
                    seen[here] = entry
        except OSError:
            found.path = os.path.join(here, *parts)
            return found
        note(found.placed, folder, entry, here, seen)
        if not stat.S_ISLNK(entry.st_mode):
            where, folder = here, entry
            continue
        followed += 1
        if followed > MAX_LINKS:
            found.path = here  # a loop: the open says so
            return found
        target = os.readlink(here)
        parts[:0] = [p for p in target.split("/") if p]
        if target.startswith("/"):
            where, folder = "/", os.stat("/")
    found.path = where
    return found


def refusal(
    path: str, opened: os.stat_result, seen: dict[str, os.stat_result] | None = None
) -> str | None:
    """Why the file ``opened`` at ``path`` must not be read, in words that follow "is"; None
    when every placer on its path could have read it themselves."""
    seen = {} if seen is None else seen
    found = resolve(path, seen)
    try:
        moved = not os.path.samestat(os.stat(found.path), opened)
    except OSError:
        moved = True
    if moved:
        return "reached through a path that changed as it was opened (a link swapped meanwhile)"
    for placer, how in sorted(found.placed.items(), key=lambda item: (not item[1][1], item)):
        shut = shut_folder(placer, found.path, seen)  # their links first: the clearest cause
        if may(placer, opened, R) and shut is None:
            continue
        why = (
            f"the folder {shut} is shut to them" if shut is not None
            else f"mode {stat.S_IMODE(opened.st_mode):04o}, owner {owner_name(opened.st_uid)}"
        )  # fmt: skip
        return (
            f"reached through {words(placer, how)}, and {describe(placer)} cannot read the file "
            f"it leads to ({found.path}: {why}); a file is read only when whoever shaped its "
            "path could read it themselves"
        )
    return None


@functools.lru_cache(maxsize=256)
def owner_name(uid: int) -> str:
    """``alice (uid 1001)``, or ``uid 1001`` for a uid without a name."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


@functools.lru_cache(maxsize=256)
def group_name(gid: int) -> str:
    """``group lab (gid 1001)``, or ``group 1001``."""
    import grp

    try:
        return f"group {grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"group {gid}"

"""No confused deputy: what another user could have put on a path leads only where they
could go.

Run by root, or by a service account for others, this tool can read and write more than the
people who shape the paths it follows. A name in a folder was put there by someone who can
write that folder (its owner; its group or anyone, unless the folder is sticky, where only
the name's owner and the folder's can place or move it), and a link's target by the link's
owner. Any of them but the caller and root is a *placer*. Followed blindly, a placer's name
hands them the caller's rights: a chunk of their input linked to (or moved from) a file only
root can read puts its bytes in OUT; OUT's folder linked into one only root can write makes
root write there. So a file is read only when every placer on its path could read it, and a
link is written through only into a folder every placer could write, judged by mode bits,
owner and groups, with the right to search every folder above. A group whose members are all
the caller (or root) places nothing: a user's private group is theirs.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass, field

R, W, X = 4, 2, 1
"""The permission bits of one class (owner, group, others)."""
ANYONE = ("anyone", -1)
LINK_WORDS = "a symbolic link made by"
MAX_LINKS = 40


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


def trusted(uid: int) -> bool:
    """The caller and root place nothing that could steer the caller."""
    return uid in (0, os.geteuid())


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


def reaches(placer: Placer, path: str, looks: dict[str, os.stat_result] | None = None) -> bool:
    """Whether ``placer`` may search every folder above ``path`` (``path`` resolved);
    ``looks`` keeps the folders' status for the next call."""
    looks = {} if looks is None else looks
    folder = os.path.dirname(path)
    while True:
        try:
            found = looks.get(folder)
            if found is None:
                found = looks[folder] = os.stat(folder)
        except OSError:
            return False
        if not may(placer, found, X):
            return False
        if folder == os.path.dirname(folder):
            return True
        folder = os.path.dirname(folder)


def placers(folder: os.stat_result, entry: os.stat_result) -> set[Placer]:
    """Who besides the caller and root could have put ``entry`` in ``folder`` (a link's
    target is its owner's doing too: see ``link_placer``)."""
    found: set[Placer] = set()
    if not trusted(folder.st_uid):
        found.add(("user", folder.st_uid))
    mode = folder.st_mode
    if mode & stat.S_ISVTX and mode & (stat.S_IWGRP | stat.S_IWOTH):
        if not trusted(entry.st_uid):  # a sticky folder: only the entry's owner moves it
            found.add(("user", entry.st_uid))
        return found
    if mode & stat.S_IWGRP and not group_trusted(folder.st_gid):
        found.add(("group", folder.st_gid))
    if mode & stat.S_IWOTH:
        found.add(ANYONE)
    return found


def note(
    placed: dict[Placer, str],
    folder: os.stat_result,
    entry: os.stat_result,
    at: str,
    looks: dict[str, os.stat_result] | None = None,
) -> None:
    """Add to ``placed`` who could have put ``entry`` at ``at`` (in ``folder``), in words:
    those who may write the folder and reach it (a 0777 folder inside a 0700 one is its
    owner's alone), and a link's owner."""
    for placer in sorted(placers(folder, entry)):
        if reaches(placer, at, looks):
            placed.setdefault(placer, f"{at}, which {describe(placer)} could have put there")
    if stat.S_ISLNK(entry.st_mode) and not trusted(entry.st_uid):
        link_owner = ("user", entry.st_uid)
        if LINK_WORDS not in placed.get(link_owner, ""):  # their link says more than a name
            placed[link_owner] = f"{at}, {LINK_WORDS} {describe(link_owner)}"


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
    placed: dict[Placer, str] = field(default_factory=dict)
    """Each placer -> the name on the path they could have placed, in words (the first)."""


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
    for placer, how in sorted(found.placed.items()):
        if may(placer, opened, R) and reaches(placer, found.path, seen):
            continue
        who = describe(placer)
        return (
            f"reached through {how}, and {who} cannot read the file it leads to ({found.path}: "
            f"mode {stat.S_IMODE(opened.st_mode):04o}, owner {owner_name(opened.st_uid)}); a "
            "file is read only when whoever shaped its path could read it themselves"
        )
    return None


def owner_name(uid: int) -> str:
    """``alice (uid 1001)``, or ``uid 1001`` for a uid without a name."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def group_name(gid: int) -> str:
    """``group lab (gid 1001)``, or ``group 1001``."""
    import grp

    try:
        return f"group {grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"group {gid}"

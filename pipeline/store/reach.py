"""What a local store reaches: every folder and file where its chunk keys live, links followed
(a chunk folder on another disk is a normal layout), each known by its identity
``(st_dev, st_ino)``; any other folder is known by its own identity, not walked.

Two stores overlap when they reach one folder or file, however their paths are spelled: an
input whose ``c/`` is a link into OUT, a C whose chunk folder is an input's. Paths alone cannot
tell (``inside`` compares two top folders). A folder reached twice (a loop, or two links to
one place) is walked once.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from pipeline.errors import InputError, UnsafeOutputError
from pipeline.store import deputy
from pipeline.store.fs import local_path

Identity = tuple[int, int]


@dataclass
class Reach:
    """A local store as found: its files' change marks and every identity it reaches."""

    files: dict[str, str] = field(default_factory=dict)
    """Path relative to the store -> size and change marks (what a listing compares)."""
    ids: dict[Identity, str] = field(default_factory=dict)
    """Identity of every folder and file reached -> the first relative path reaching it."""
    links: list[str] = field(default_factory=list)
    """Relative paths that are links (followed when they lead somewhere)."""
    special: list[str] = field(default_factory=list)
    """Relative paths that are neither a folder nor a regular file (FIFOs, devices, sockets)."""


def reach(root: str) -> Reach:
    """Walk ``root`` following links, each folder once; a missing root reaches nothing."""
    found = Reach()
    try:
        top = os.stat(root)
    except OSError:  # missing, or a loop of links: reaches nothing (opening it says why)
        return found
    found.ids[(top.st_dev, top.st_ino)] = ""
    if not stat.S_ISDIR(top.st_mode):
        found.files[""] = _marks(top)
        return found
    walked = {(top.st_dev, top.st_ino)}  # apart from ids: a name met first may not be walked
    pending = [("", root)]
    while pending:
        rel, path = pending.pop()
        try:
            items = list(os.scandir(path))
        except OSError:  # removed meanwhile, unreadable: its reads will say so
            continue
        for item in items:
            name = f"{rel}/{item.name}" if rel else item.name
            if item.is_symlink():
                found.links.append(name)
            try:
                st = item.stat(follow_symlinks=True)
            except OSError:  # a dangling link or a loop of links: reaches nothing
                continue
            key = (st.st_dev, st.st_ino)
            if stat.S_ISDIR(st.st_mode):
                found.ids.setdefault(key, name)
                if key not in walked and chunk_folder(name):  # chunk keys only: never all of /
                    walked.add(key)
                    pending.append((name, item.path))
                continue
            found.ids.setdefault(key, name)
            if stat.S_ISREG(st.st_mode):
                found.files[name] = _marks(st)
            else:
                found.special.append(name)
    return found


def chunk_folder(path: str) -> bool:
    """A folder a chunk key can pass through: ``c``, ``c/1``, ``1`` (a v2 ``/`` key)... Any
    other (a link to ``/`` named ``x``) is known by its identity, never walked."""
    parts = path.split("/")
    if parts[0] == "c":
        parts = parts[1:]
    return all(p.isdigit() for p in parts)


def shared(one: Reach, other: Reach) -> tuple[str, str] | None:
    """A folder or file both reach, as (its path in ``one``, in ``other``), or None."""
    common = one.ids.keys() & other.ids.keys()
    if not common:
        return None
    key = min(common, key=lambda k: one.ids[k])
    return one.ids[key], other.ids[key]


def _marks(st: os.stat_result) -> str:
    """Size, mtime, ctime (which no user can set back) and inode."""
    return f"{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


def check_apart(what: str, url: str, inputs: list[tuple[str, str]], readable: bool = False) -> None:
    """Refuse a local ``what`` (OUT, or C) at ``url`` that reaches a folder or file one of
    ``inputs`` (name, URL) reaches, links followed: an input's ``c/`` linked into OUT, OUT's
    into an input. By identity, not by name; object stores have neither links nor inodes.
    ``readable``: each local input's files are checked too (``check_readable``), once per
    job, before any work."""
    local = local_path(url)
    out = None if local is None else reach(local)
    for name, other in inputs:
        path = local_path(other)
        if path is None:
            continue
        found = reach(path)
        if readable:
            check_readable(name, other, path, found)
        hit = None if out is None else shared(out, found)
        if hit is not None:
            raise UnsafeOutputError(
                f"{what} ({url}) and input {name} ({other}) reach the same folder or file "
                f"({what}'s {hit[0] or '.'} is {name}'s {hit[1] or '.'}, through a link); "
                f"inputs are never written: choose a {what} apart from every input, or remove "
                "the link"
            )


def check_readable(name: str, url: str, path: str, found: Reach | None = None) -> None:
    """Refuse input ``name`` (local, at ``path``) when a file it reaches is one that whoever
    shaped its path (pipeline.store.deputy: another user's link, a name in a folder others
    can write) could not read; the reads check each file again as they open it."""
    found = reach(path) if found is None else found
    seen: dict[str, os.stat_result] = {}
    for rel in found.files:
        full = os.path.join(path, rel) if rel else path
        try:
            st = os.stat(full)
        except OSError:
            continue  # gone meanwhile: its read says so
        problem = deputy.refusal(full, st, seen)
        if problem is not None:
            raise InputError(
                f"{name} ({url}): {rel or '.'} is {problem}: copy the data into the input, "
                "or remove the link"
            )

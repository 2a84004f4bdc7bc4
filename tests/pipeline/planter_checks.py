"""The invariants of tests/pipeline/fuzz_planter.py, each a function of what is on disk and what
the command printed, so that its own tests can feed it fabricated trees:

1. nothing the planter could not have changed itself is created, changed or removed, except
   root's own targets (OUT, G, C, the report) named through no planter link: snapshots of the
   whole sandbox with modes, owners and mtimes, links not followed, judged by the planter's
   rights as they were before the command;
2. no byte the planter could not read reaches anything outside the root-only folders: every
   file the command created or changed there (raw bytes: the secret's float64 bit patterns at
   every alignment, its text, root's marker), each array among them decoded without its links
   (exact secret values, or any |value| >= SECRET_FLOOR), stdout and stderr;
3. exit 0 with a planter link on the way to a target (or inside C), or with an input that
   reaches through a planter link what the planter cannot read, is a violation; a refusal of a
   link on a target's way names the link and its owner;
4. root writes no target into a folder (or file) the planter owns: the planter could rename,
   remove or swap whatever root put there (``written_into_planters``).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.pipeline.fuzz_tree import HASH_LIMIT_BYTES, Run, _describe, read_array
from tests.pipeline.planter import PLANTER_GROUPS, PLANTER_UID

SECRET = 7.77e77 * (1.0 + np.arange(1, 129) / 4096)
"""Root's secret values: 128 distinct float64s no product of the planter's data comes near."""
SECRET_FLOOR = 1e30
"""Every other value in a case is within ±10: one this large derives from the secret (a Gram of
it, 2·C_old + A@B)."""
MARKER = b"TOPSECRET"
"""In every root-only text and in the secret arrays' attributes."""
SECRET_TEXT = re.compile(rb"(?<![\d.])[78]\.\d+e\+?77")
ROOT_ONLY = ("private", "vault")
"""Top-level folders only root can read (private/ 0700; vault/ 0711, files 0600)."""


@dataclass(frozen=True)
class Seen:
    content: tuple[Any, ...]
    """fuzz_tree's description: a file's digest, a link's target, a folder, or a type."""
    mode: int
    uid: int
    gid: int
    mtime_ns: int

    @property
    def kind(self) -> str:
        return self.content[0] if isinstance(self.content[0], str) else "other"


Tree = dict[str, Seen]


def snapshot(root: Path) -> Tree:
    """Every path under ``root`` and ``root`` itself (as "."), links not followed."""
    tree = {".": _seen(str(root))}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            tree[os.path.relpath(path, root)] = _seen(path)
    return tree


def _seen(path: str) -> Seen:
    try:
        st = os.lstat(path)
    except OSError as e:
        return Seen(("unreadable", e.errno), 0, -1, -1, 0)
    return Seen(_describe(path), st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns)


# --- 1. what the planter could not have changed ------------------------------------------


def _may(mode: int, uid: int, gid: int, bits: int) -> bool:
    """The planter's rights ``bits`` (0o4 read, 0o2 write, 0o1 search) on one inode."""
    shift = 6 if uid == PLANTER_UID else 3 if gid in PLANTER_GROUPS else 0
    return bool(mode & (bits << shift))


def _writes(seen: Seen) -> bool:
    return seen.uid == PLANTER_UID or _may(seen.mode, seen.uid, seen.gid, 0o2)


def _parent(path: str) -> str:
    return os.path.dirname(path) or "."


def _reaches(tree: Tree, folder: str) -> bool:
    """Could the planter get into ``folder`` (it starts in the sandbox, through its cwd)?"""
    parts = [] if folder == "." else folder.split("/")
    for n in range(len(parts) + 1):
        seen = tree.get("/".join(parts[:n]) or ".")
        if seen is None or seen.kind != "dir" or not _may(seen.mode, seen.uid, seen.gid, 0o1):
            return False
    return True


def _replaceable(tree: Tree, path: str) -> bool:
    """Could the planter rename or remove ``path`` (the sticky bit's rule included)?"""
    folder = tree.get(_parent(path))
    if path == "." or folder is None or not _reaches(tree, _parent(path)) or not _writes(folder):
        return False
    sticky = folder.mode & stat.S_ISVTX
    return not sticky or PLANTER_UID in (tree[path].uid, folder.uid)


def _could_change(tree: Tree, path: str, new: Seen) -> bool:
    old = tree[path]
    if _replaceable(tree, path) or old.uid == PLANTER_UID and _reaches(tree, _parent(path)):
        return True
    same_inode = (old.kind, old.mode, old.uid, old.gid) == (new.kind, new.mode, new.uid, new.gid)
    return (
        same_inode
        and old.kind in ("file", "dir")
        and _writes(old)
        and _reaches(tree, _parent(path))
    )


def is_under(path: str, base: str) -> bool:
    return path == base or path.startswith(base + "/")


def root_only_changes(before: Tree, after: Tree, exempt: Sequence[str]) -> list[str]:
    """What changed that the planter could not have changed (``exempt``: root's own targets)."""
    found = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new or any(is_under(path, e) for e in exempt):
            continue
        if old is None:
            folder = _parent(path)
            if folder not in before:  # judged where the new subtree starts
                continue
            rights = (s for s in (before[folder], after.get(folder)) if s is not None)
            if not (_reaches(before, folder) and any(_writes(s) for s in rights)):
                found.append(f"created {path} ({_owner(new)}) where the planter cannot write")
        elif new is None:
            moved = [a for a in _self_and_above(path) if before[a] != after.get(a)]
            if not any(_replaceable(before, a) for a in moved):
                found.append(f"removed {path} ({_owner(old)}), which the planter could not")
        elif not _could_change(before, path, new):
            same = old.content == new.content and (old.mode, old.uid, old.gid) == (
                new.mode,
                new.uid,
                new.gid,
            )
            what = (
                "its mtime (an entry made or removed in it)"
                if same
                else f"{_owner(old)} -> {_owner(new)}"
            )
            found.append(f"changed {path}: {what}")
    return found[:8]


def _self_and_above(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _owner(seen: Seen | None) -> str:
    if seen is None:
        return "absent"
    return f"{seen.content[:2]}, uid {seen.uid} gid {seen.gid} mode {seen.mode & 0o7777:o}"


# --- 2. bytes the planter could not read --------------------------------------------------


def secret_in_bytes(data: bytes) -> str | None:
    """What of the secret ``data`` holds, or None."""
    if MARKER in data:
        return "root's marker text"
    if SECRET_TEXT.search(data):
        return "a secret value written as text"
    for offset in range(8):
        count = (len(data) - offset) // 8
        if count <= 0:
            break
        view = np.frombuffer(data, "<f8", count=count, offset=offset)
        hits = np.flatnonzero(np.isin(view, SECRET))
        if hits.size:
            return f"the secret float64 {view[hits[0]]:.6g} at byte {offset + 8 * hits[0]}"
    return None


def secret_in_values(values: Any) -> str | None:
    """Secret values (exact, or anything at least SECRET_FLOOR) among decoded ``values``."""
    data = np.abs(np.asarray(values, dtype=np.float64))
    hits = np.isin(data, SECRET) | (data >= SECRET_FLOOR)
    if not hits.any():
        return None
    first = np.unravel_index(np.flatnonzero(hits)[0], data.shape)
    return f"{int(hits.sum())} values derived from the secret ({data[first]:.4g} at {first})"


def secret_leaks(root: Path, before: Tree, after: Tree, texts: Mapping[str, str]) -> list[str]:
    """Secret bytes or values in ``texts`` (stdout, stderr) or in anything outside the
    root-only folders that changed."""
    found = [
        f"{name} holds {what}"
        for name, text in texts.items()
        if (what := secret_in_bytes(text.encode(errors="replace")))
    ]
    changed = sorted(p for p, seen in after.items() if seen != before.get(p) and not _root_only(p))
    for path in changed:
        if after[path].kind == "file" and (what := secret_in_bytes(_small(root / path))):
            found.append(f"{path} holds {what}")
    for array in sorted(_arrays(after, changed)):
        values = decode_without_links(root / array)
        if values is not None and (what := secret_in_values(values)):
            found.append(f"{array} decodes to {what}")
    return found


def _root_only(path: str) -> bool:
    return any(is_under(path, area) for area in ROOT_ONLY)


def _small(path: Path) -> bytes:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > HASH_LIMIT_BYTES:
            return b""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _arrays(tree: Tree, paths: Iterable[str]) -> set[str]:
    """The arrays (folders with a metadata document that is a file) holding ``paths``."""
    found = set()
    for path in paths:
        for folder in _self_and_above(path):
            documents = (tree.get(f"{folder}/zarr.json"), tree.get(f"{folder}/.zarray"))
            if any(d is not None and d.kind == "file" for d in documents):
                found.add(folder)
                break
    return found


def decode_without_links(path: Path) -> Any:
    """The array at ``path`` as zarr reads a copy of its plain files (links, FIFOs and big files
    left out: what is behind a planter's link is not this array's), or None."""
    with tempfile.TemporaryDirectory(prefix="planter-decode-") as copy:
        for folder, _, files in os.walk(path):
            into = Path(copy) / os.path.relpath(folder, path)
            into.mkdir(parents=True, exist_ok=True)
            for name in files:
                source = Path(folder) / name
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.lstat(source).st_mode):
                        (into / name).write_bytes(_small(source))
        return read_array(Path(copy))


# --- 3. links the planter planted ---------------------------------------------------------


def planter_links_on(root: Path, path: str) -> list[str]:
    """The planter's links among ``path``'s components, up to the first link."""
    parts = Path(path).parts
    for n in range(1, len(parts) + 1):
        prefix = "/".join(parts[:n])
        try:
            st = os.lstat(root / prefix)
        except OSError:
            return []
        if stat.S_ISLNK(st.st_mode):
            return [prefix] if st.st_uid == PLANTER_UID else []
    return []


def planter_links_in(root: Path, path: str) -> list[str]:
    """The planter's links inside the folder ``path`` (not followed)."""
    found = []
    for folder, dirs, files in os.walk(root / path):
        for name in dirs + files:
            full = os.path.join(folder, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode) and st.st_uid == PLANTER_UID:
                found.append(os.path.relpath(full, root))
    return sorted(found)


def unreadable_behind(root: Path, link: str) -> str | None:
    """Where ``link`` leads, if that exists and the planter may not read it; else None."""
    real = os.path.realpath(root / link)
    base = os.path.realpath(root)
    if not os.path.exists(real):
        return None
    inside = is_under(real, base)
    start = base if inside else "/"
    steps = os.path.relpath(real, start).split("/")
    for n in range(len(steps) + 1):
        st = os.stat(os.path.join(start, *steps[:n]))
        last = n == len(steps)
        bits = (0o4 | (0o1 if stat.S_ISDIR(st.st_mode) else 0)) if last else 0o1
        if not _may(st.st_mode, st.st_uid, st.st_gid, bits):
            return os.path.relpath(real, base) if inside else real
    return None


def link_verdicts(
    run: Run, on_the_way: Sequence[tuple[str, str]], unreadable: Sequence[tuple[str, str, str]]
) -> list[str]:
    """Invariant 3. ``on_the_way``: (target, planter link on its way or inside C);
    ``unreadable``: (input, planter link, what it leads to that the planter cannot read)."""
    found = []
    if run.rc == 0:
        found += [f"exit 0 though the planter's link {link} is on the way to {target}"
                  for target, link in on_the_way]  # fmt: skip
        found += [f"exit 0 though {operand} reaches through the planter's link {link} "
                  f"{real}, which the planter cannot read"
                  for operand, link, real in unreadable]  # fmt: skip
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    if run.rc == 2 and errors:
        for target, link in on_the_way:
            named = os.path.basename(link) in errors[-1]
            owner = str(PLANTER_UID) in errors[-1] or "nobody" in errors[-1]
            if is_under(target, link) and not (named and owner):
                found.append(f"refused, but not naming the planter's link {link} and its owner")
    return found


def written_into_planters(
    root: Path, before: Tree, after: Tree, writes: Sequence[str]
) -> list[str]:
    """Targets that are the planter's own folder or file and root wrote into: the planter may
    rename, remove or swap whatever root put there."""
    found = []
    for target in writes:
        seen = after.get(target)
        if seen is None or seen.uid != PLANTER_UID or planter_links_on(root, target):
            continue
        inside = [p for p in after if is_under(p, target) and p != target]
        new = [p for p in inside if after[p] != before.get(p) and after[p].uid != PLANTER_UID]
        if new or (
            seen.kind == "file" and seen.content != getattr(before.get(target), "content", None)
        ):
            found.append(f"root wrote into {target}, the planter's own {seen.kind}")
    return found

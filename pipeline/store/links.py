"""Which links this tool follows, whatever the kernel's ``fs.protected_symlinks`` says.

Writes (OUT, C, the report and every folder above them): Linux's rule for sticky folders, made
stricter. A link is followed only when the caller owns it, when its folder is writable by
nobody but its owner, or when the folder's owner made the link. Otherwise another user who can
write that folder (a shared 1777 or 2775 project folder) could have pointed it anywhere the
caller may write: refused, naming the link and its owner. Paths are walked from ``/`` one
component at a time with ``O_NOFOLLOW`` under the parent's descriptor, each link checked
before it is followed, so a link swapped in after a check is met by the next walk.

A link followed must also lead only into a folder whoever could have placed it could write
(pipeline.store.deputy, which also holds the rule for reads): in a folder others can write,
even a link of the caller's may have been moved there by them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from dataclasses import dataclass

from pipeline.errors import UnsafeOutputError
from pipeline.store import deputy
from pipeline.store.deputy import owner_name

O_PATH = getattr(os, "O_PATH", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
PATH_FLAGS = (O_PATH or os.O_RDONLY) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
"""A folder passed through: ``O_PATH`` needs only the right to search it, as a path does."""
OPEN_FLAGS = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
MAX_LINKS = deputy.MAX_LINKS
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def may_follow(link: os.stat_result, folder: os.stat_result, uid: int | None = None) -> bool:
    """The owner rule: the caller's link, a link in a folder only its owner can write, or a
    link the folder's owner made."""
    uid = os.geteuid() if uid is None else uid
    return link.st_uid == uid or not folder.st_mode & OTHERS_WRITE or link.st_uid == folder.st_uid


@dataclass
class Walked:
    """Where a walk of a path ended."""

    fd: int
    """The last component found (a folder unless ``kind`` says otherwise), open; the caller
    closes it."""
    path: str
    """Its location, links resolved."""
    missing: list[str]
    """The components below it that do not exist (empty: the whole path was found)."""
    kind: str = "dir"
    """``dir``, or ``file`` when the path ends at (or passes through) something else."""


def walk(path: str, what: str) -> Walked:
    """Follow ``path`` from ``/`` under the owner rule to the last folder found (opened with
    ``O_PATH``). A link the rule refuses, or a loop, is an UnsafeOutputError naming ``what``;
    a file on the way ends the walk there."""
    given = path
    if not path.startswith("/"):  # joined, not normalized: ``..`` after a link is physical
        path = os.path.join(os.getcwd(), path)
    parts = deque(p for p in path.split("/") if p)
    fd = os.open("/", PATH_FLAGS)
    where, followed = "/", 0
    planted: dict[deputy.Placer, tuple[str, bool]] = {}  # who could have placed a link
    try:
        while parts:
            part = parts.popleft()
            if part == ".":
                continue
            try:
                child = os.open(part, PATH_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                _check_deputy(given, what, planted, fd, where)
                return Walked(fd, where, [part, *parts])
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                found = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(found.st_mode):
                    _check_deputy(given, what, planted, fd, where)
                    return Walked(fd, where, [part, *parts], kind="file")
                followed += 1
                _check_link(given, what, found, fd, _join(where, part), followed)
                deputy.note(planted, os.fstat(fd), found, _join(where, part))
                target = os.readlink(part, dir_fd=fd)
                parts.extendleft(reversed([p for p in target.split("/") if p]))
                if target.startswith("/"):
                    os.close(fd)
                    fd, where = -1, "/"
                    fd = os.open("/", PATH_FLAGS)
                continue
            os.close(fd)
            fd = child
            where = os.path.dirname(where) if part == ".." else _join(where, part)
        _check_deputy(given, what, planted, fd, where)
        return Walked(fd, where, [])
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def _check_link(
    given: str, what: str, link: os.stat_result, folder_fd: int, at: str, followed: int
) -> None:
    if followed > MAX_LINKS:
        raise UnsafeOutputError(
            f"{what} ({given}): more than {MAX_LINKS} symbolic links on the way (a loop at "
            f"{at}?); give the real location"
        )
    folder = os.fstat(folder_fd)
    if may_follow(link, folder):
        return
    raise UnsafeOutputError(
        f"{what} ({given}): {at} is a symbolic link owned by {owner_name(link.st_uid)} in "
        f"{os.path.dirname(at)}, a folder others can write (mode "
        f"{stat.S_IMODE(folder.st_mode):04o}, owner {owner_name(folder.st_uid)}); a link there "
        "is followed only when you or the folder's owner made it: give the real location, "
        "or remove the link"
    )


def _check_deputy(
    given: str, what: str, planted: dict[deputy.Placer, tuple[str, bool]], fd: int, where: str
) -> None:
    """A link someone else could have placed leads only into a folder they could write."""
    if not planted:
        return
    folder = os.fstat(fd)
    for placer, how in sorted(planted.items(), key=lambda item: (not item[1][1], item)):
        if deputy.may(placer, folder, deputy.W | deputy.X) and deputy.reaches(placer, where + "/-"):
            continue
        raise UnsafeOutputError(
            f"{what} ({given}): the way there passes {deputy.words(placer, how)}, leading to "
            f"{where}, which {deputy.describe(placer)} cannot write (mode "
            f"{stat.S_IMODE(folder.st_mode):04o}, owner {owner_name(folder.st_uid)}); this "
            "tool writes through a link only where whoever could have placed it could write: "
            "give the real location, or remove the link"
        )


def resolve(path: str, what: str) -> str:
    """The location a local ``path`` (OUT, C, the report) names, walked under the owner rule
    (a link it forbids anywhere on the way is refused): the folders found, links resolved,
    then the missing tail as spelled (``..`` there taken by name, as nothing is there to
    follow). What is checked is what is written: the result holds no link."""
    try:
        found = walk(path, what)
    except OSError:  # a folder above shut: the writes will say so
        return os.path.realpath(path)
    os.close(found.fd)
    return os.path.normpath(os.path.join(found.path, *found.missing))


def open_folder(path: str, what: str) -> int:
    """The folder ``path`` opened for reading: the folders above it walked under the owner
    rule, its own name opened with ``O_NOFOLLOW`` (a link there raises ELOOP or ENOTDIR, as
    ``os.open`` does); FileNotFoundError or NotADirectoryError when a folder above is missing
    or a file."""
    head, name = os.path.split(os.path.abspath(path))
    if not name:
        return os.open("/", OPEN_FLAGS)
    found = walk(head, what)
    try:
        if found.kind == "file":
            raise NotADirectoryError(errno.ENOTDIR, "a file on the way", path)
        if found.missing:
            raise FileNotFoundError(errno.ENOENT, "a folder on the way is missing", path)
        return os.open(name, OPEN_FLAGS, dir_fd=found.fd)
    finally:
        os.close(found.fd)


def _join(where: str, part: str) -> str:
    return f"{where.rstrip('/')}/{part}"

"""The one door for writes inside a local folder of ours (OUT, C, their sidecars, the report's
folder): every create, write, rename and delete is made relative to the folder's descriptor,
one path component at a time, never through a link.

The model is ``shutil.rmtree``'s link-safe walk and Go's ``os.Root``: each component is opened
with ``O_NOFOLLOW | O_DIRECTORY`` under its parent's descriptor, files are created with
``O_EXCL | O_NOFOLLOW`` and renamed into place with ``dir_fd``; a link, a FIFO or a device
anywhere on the way is refused, so no write can land outside the folder. ``..``, ``.`` and
empty components are refused too. Nothing else in the code writes to a local OUT or C
(``tests/pipeline/test_door.py`` checks the source).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pipeline.errors import UnsafeOutputError
from pipeline.store import links

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
DIR_FLAGS = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
READ_FLAGS = os.O_RDONLY | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC
SMALL_READ_BYTES = 16 << 20
"""The most a sidecar (lock, journal entry, listing, state) is read: they are small JSON."""


_pinned: dict[str, tuple[int, int]] = {}
"""Folders a job holds (OUT, or C, under its lock) -> their identity: every door below one
walks from it and refuses a folder swapped in at its path."""


def pin(root: str, identity: tuple[int, int] | None) -> None:
    """Hold ``root`` to the folder of ``identity`` for this process (None: let it go)."""
    root = root.rstrip("/") or "/"
    if identity is None:
        _pinned.pop(root, None)
    else:
        _pinned[root] = identity


def unpin_below(root: str) -> None:
    """Let go every folder pinned at or below ``root`` (another job's, on a long-lived worker,
    whose folder a later one may have made again)."""
    root = root.rstrip("/") or "/"
    for path in [p for p in tuple(_pinned) if p == root or p.startswith(root + "/")]:
        _pinned.pop(path, None)


def _pinned_base(root: str) -> tuple[str, tuple[int, int]] | None:
    """The pinned folder at or above ``root``, the nearest one, and its identity (from one
    snapshot: other threads of a worker pin as they start their tasks)."""
    found = [(p, i) for p, i in tuple(_pinned.items()) if root == p or root.startswith(p + "/")]
    return max(found, key=lambda pair: len(pair[0])) if found else None


def partial_name(name: str) -> str:
    """A temporary file beside ``name`` (renamed over it once written): zarr's spelling."""
    return f"{name}.{uuid.uuid4().hex}.partial"


@dataclass(frozen=True)
class Entry:
    """One thing inside the folder, as ``walk`` finds it (links are never followed)."""

    path: str
    """Relative to the folder, ``/``-separated; folders end without a slash."""
    kind: str
    """``file``, ``dir``, ``link`` or ``other`` (FIFO, socket, device)."""
    size: int
    dev: int
    ino: int


class Door:
    """A local folder; every operation names a path relative to it."""

    def __init__(self, root: str, what: str = "OUT") -> None:
        self.root = root.rstrip("/") or "/"
        self.what = what

    # -- walking -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def folder(self, relpath: str = "", *, create: bool = False) -> Iterator[int]:
        """A descriptor of the folder at ``relpath`` (created, component by component, with
        ``create``); a link or a non-folder on the way is refused."""
        parts = _parts(relpath, self.root)
        fd = self._open_root()
        for part in parts:
            fd = self._step(fd, part, relpath, create)  # closes the parent, whatever happens
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_root(self) -> int:
        """The root's descriptor: walked from the folder a job pinned when it holds one above
        (or at) the root, so a folder swapped in at that path meanwhile is refused. Unpinned,
        the folders above are walked under the owner rule (pipeline.store.links); pinned, the
        folder's identity settles where the path leads, so a plain open serves (every chunk
        write of a job comes here)."""
        pinned = _pinned_base(self.root)
        base = self.root if pinned is None else pinned[0]
        try:
            fd = os.open(base, DIR_FLAGS) if pinned else links.open_folder(base, self.what)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._refuse("", "is a symbolic link or not a folder") from e
            raise
        if pinned is None:
            return fd
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != pinned[1]:
            os.close(fd)
            raise self._refuse("", f"is not the folder the job locked ({base} was replaced)")
        for part in _parts(self.root[len(base) :], self.root):
            fd = self._step(fd, part, "", False)
        return fd

    def identity(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the root folder, opened as every operation opens it."""
        with self.folder() as fd:
            st = os.fstat(fd)
        return (st.st_dev, st.st_ino)

    def _step(self, parent: int, part: str, relpath: str, create: bool) -> int:
        try:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=parent)
                child = os.open(part, DIR_FLAGS, dir_fd=parent)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._refuse(relpath, "passes through a symbolic link or a file") from e
            raise
        finally:
            os.close(parent)
        return child

    def _refuse(self, relpath: str, problem: str) -> UnsafeOutputError:
        where = f"{self.root}/{relpath}" if relpath else self.root
        return UnsafeOutputError(
            f"{self.what} ({self.root}): {where} {problem}; this tool writes only into folders "
            f"of its own, never through links: remove it or choose another {self.what}"
        )

    # -- writes ------------------------------------------------------------------------------

    def write(
        self, name: str, data: bytes | memoryview, *, exclusive: bool = False, durable: bool = False
    ) -> None:
        """Write ``name`` whole and atomically: a temporary file created beside it (``O_EXCL |
        O_NOFOLLOW``), then renamed over it (``exclusive``: linked into place, refusing one
        that exists). A link or anything but a file at ``name`` is refused, never followed.
        ``durable``: the file and then its folder synced, so the write survives a power cut
        (a protocol's state: a kill alone never loses a renamed file)."""
        view = memoryview(data).cast("B")

        def fill(fd: int) -> None:
            _write_all(fd, view)
            if durable:
                os.fsync(fd)

        self._write_via(name, fill, 0, exclusive)
        if durable:
            self.sync_folder(_split(name)[0])

    def sync_folder(self, relpath: str = "") -> None:
        """fsync the folder ``relpath``: the renames and removals in it are on disk."""
        with self.folder(relpath) as fd:
            os.fsync(fd)

    def write_with(self, name: str, fill: Callable[[int], None], *, flags: int = 0) -> bool:
        """Like ``write``, the temporary file filled by ``fill(fd)`` (opened with extra
        ``flags``, e.g. ``O_DIRECT``); False, having written nothing, where the open or the
        writes raise EINVAL (a file system refusing those flags)."""
        try:
            self._write_via(name, fill, flags, False)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return False
            raise
        return True

    def _write_via(
        self, name: str, fill: Callable[[int], None], flags: int, exclusive: bool
    ) -> None:
        head, base = _split(name)
        with self.folder(head, create=True) as parent:
            tmp = partial_name(base)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC
                         | flags, 0o666, dir_fd=parent)  # fmt: skip
            try:
                try:
                    fill(fd)
                finally:
                    os.close(fd)
                self._place(parent, tmp, base, name, exclusive)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise

    def _place(self, parent: int, tmp: str, base: str, name: str, exclusive: bool) -> None:
        if not exclusive:
            self._check_replaceable(parent, base, name)
            os.rename(tmp, base, src_dir_fd=parent, dst_dir_fd=parent)
            return
        os.link(tmp, base, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
        os.unlink(tmp, dir_fd=parent)

    def _check_replaceable(self, parent: int, base: str, name: str) -> None:
        """A rename replaces a link or a file; a link here means someone planted it."""
        try:
            st = os.stat(base, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            raise self._refuse(name, f"is {_kind_words(st.st_mode)}, not a file of ours")

    def create(self, name: str, data: bytes) -> int:
        """Create ``name`` exclusively (``O_EXCL | O_NOFOLLOW``) holding ``data``; returns its
        open descriptor (read-write), which the caller closes. FileExistsError if anything,
        a link included, is there."""
        head, base = _split(name)
        with self.folder(head, create=True) as parent:
            fd = os.open(base, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                         0o644, dir_fd=parent)  # fmt: skip
        try:
            if data:
                os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_existing(self, name: str) -> int:
        """``name`` opened read-write only if it is a regular file (not a link, FIFO,
        device or folder); FileNotFoundError when there is none."""
        head, base = _split(name)
        with self.folder(head) as parent:
            try:
                fd = os.open(base, os.O_RDWR | O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC,
                             dir_fd=parent)  # fmt: skip
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP):
                    raise self._refuse(name, "is a link, a folder or a special file") from e
                raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)  # a second name would make a write here a write to another file
            raise self._refuse(name, "is not a regular file with one name (a hard link?)")
        return fd

    def remove(self, name: str) -> bool:
        """Delete the file ``name`` (True), or nothing is there (False); a folder, a FIFO or a
        device is refused. A link is removed as a link (its target is never touched)."""
        head, base = _split(name)
        try:
            with self.folder(head) as parent:
                st = os.stat(base, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise self._refuse(name, "is a folder where a file of ours was expected")
                os.unlink(base, dir_fd=parent)
        except FileNotFoundError:
            return False
        return True

    def remove_if_same(self, name: str, fd: int) -> bool:
        """Delete ``name`` only while it is still the file open at ``fd`` (same inode)."""
        head, base = _split(name)
        try:
            with self.folder(head) as parent:
                st = os.stat(base, dir_fd=parent, follow_symlinks=False)
                if not os.path.samestat(st, os.fstat(fd)):
                    return False
                os.unlink(base, dir_fd=parent)
        except FileNotFoundError:
            return False
        return True

    def rmdir(self, name: str) -> bool:
        """Remove the empty folder ``name`` (True); False when it is not there or not empty."""
        head, base = _split(name)
        try:
            with self.folder(head) as parent:
                os.rmdir(base, dir_fd=parent)
        except FileNotFoundError:
            return False
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            if e.errno == errno.ENOTDIR:
                raise self._refuse(name, "is not a folder") from e
            raise
        return True

    def rename(self, source: str, target: str, *, replace: bool = False) -> bool:
        """Move ``source`` to ``target`` inside the folder (True), or nothing is at ``source``
        (False); ``target`` must not exist, or with ``replace`` it is replaced in one rename
        when it is a file (anything else there is refused)."""
        shead, sbase = _split(source)
        thead, tbase = _split(target)
        try:
            with self.folder(shead) as sfd, self.folder(thead, create=True) as tfd:
                st = os.stat(sbase, dir_fd=sfd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise self._refuse(source, f"is {_kind_words(st.st_mode)}, not a file")
                if replace:
                    self._check_replaceable(tfd, tbase, target)
                    os.rename(sbase, tbase, src_dir_fd=sfd, dst_dir_fd=tfd)
                    return True
                os.link(sbase, tbase, src_dir_fd=sfd, dst_dir_fd=tfd, follow_symlinks=False)
                os.unlink(sbase, dir_fd=sfd)
        except FileNotFoundError:
            return False
        return True

    def remove_tree(self, relpath: str) -> int:
        """Delete the folder ``relpath`` and everything in it, links as links, never
        following one (as ``shutil.rmtree`` does on this platform); returns files removed."""
        entries = [e for e in self.walk(relpath) if e.kind != "dir"]
        for entry in entries:
            self.remove(entry.path)
        self.remove_empty_below(relpath)
        self.rmdir(relpath)
        return len(entries)

    def remove_empty_below(self, relpath: str = "") -> None:
        """Remove the empty folders under ``relpath``, deepest first (one emptied by its
        children goes too; one holding anything stays)."""
        folders = [e.path for e in self.walk(relpath) if e.kind == "dir"]
        for folder in sorted(folders, key=len, reverse=True):
            self.rmdir(folder)

    def make_folder(self, relpath: str) -> None:
        """Create the folder ``relpath`` (and the missing ones above it inside the root)."""
        with self.folder(relpath, create=True):
            pass

    # -- reads -------------------------------------------------------------------------------

    def read(self, name: str, limit: int = SMALL_READ_BYTES) -> bytes | None:
        """The file ``name`` (None: not there), refused when it is not a regular file or holds
        more than ``limit`` bytes."""
        return self.read_range(name, 0, None, limit)

    def read_head(self, name: str, nbytes: int) -> bytes | None:
        """The first ``nbytes`` of the regular file ``name`` (None: not there)."""
        return self.read_range(name, 0, nbytes)

    def read_range(
        self, name: str, start: int, stop: int | None, limit: int | None = None
    ) -> bytes | None:
        """Bytes ``start:stop`` of the regular file ``name`` (``stop`` None: to its end;
        negative ``start``: from its end), or None when there is none; refused when the file
        holds more than ``limit`` bytes."""
        head, base = _split(name)
        try:
            with self.folder(head) as parent:
                try:
                    fd = os.open(base, READ_FLAGS, dir_fd=parent)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                        raise self._refuse(name, "is a link, a folder or a special file") from e
                    raise
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._refuse(name, f"is {_kind_words(st.st_mode)}, not a file")
            if limit is not None and st.st_size > limit:
                raise self._refuse(name, f"holds {st.st_size:,} bytes, more than {limit:,}")
            first = max(st.st_size + start, 0) if start < 0 else start
            last = st.st_size if stop is None else min(stop, st.st_size)
            return _read_all(fd, first, max(last - first, 0))
        finally:
            os.close(fd)

    def lstat(self, name: str) -> os.stat_result | None:
        """``name``'s own status (a link's, not its target's); None when nothing is there. A
        link or a file on the way is refused (UnsafeOutputError), never taken for "none"."""
        head, base = _split(name)
        try:
            with self.folder(head) as parent:
                return os.stat(base, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        """Anything (a link included) at ``name``."""
        return self.lstat(name) is not None

    def same_file(self, one: str, other: str) -> bool:
        """``one`` and ``other`` are one regular file (two names of one inode)."""
        first, second = self.lstat(one), self.lstat(other)
        if first is None or second is None:
            raise FileNotFoundError(one if first is None else other)
        return stat.S_ISREG(first.st_mode) and os.path.samestat(first, second)

    def walk(self, relpath: str = "") -> Iterator[Entry]:
        """Everything under ``relpath``, links and special files reported, never followed."""
        with self.folder(relpath) as fd:
            yield from _walk(fd, relpath)


MAX_DEPTH = 16
"""Folders deeper than this are never ours (ours go 4 deep): reported, not walked."""


def _walk(fd: int, prefix: str, depth: int = 0) -> Iterator[Entry]:
    with os.scandir(fd) as it:
        found = list(it)
    for item in found:
        st = item.stat(follow_symlinks=False)
        path = f"{prefix}/{item.name}" if prefix else item.name
        kind = _kind(st.st_mode)
        if kind == "dir" and depth >= MAX_DEPTH:
            kind = "other"
        yield Entry(path, kind, st.st_size, st.st_dev, st.st_ino)
        if kind != "dir":
            continue
        try:
            child = os.open(item.name, DIR_FLAGS, dir_fd=fd)
        except OSError:
            continue  # removed or swapped as we looked: the next step that needs it refuses
        try:
            if os.path.samestat(st, os.fstat(child)):  # nothing swapped in between
                yield from _walk(child, path, depth + 1)
        finally:
            os.close(child)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "link" if stat.S_ISLNK(mode) else "other"


def _kind_words(mode: int) -> str:
    kind = _kind(mode)
    return {"dir": "a folder", "link": "a symbolic link", "other": "a special file"}.get(
        kind, "a file"
    )


def _parts(relpath: str, root: str) -> list[str]:
    parts = [p for p in relpath.split("/") if p] if relpath else []
    for part in parts:
        if part in (".", ".."):
            raise UnsafeOutputError(f"{root}: the path {relpath!r} leaves the folder")
    return parts


def _split(name: str) -> tuple[str, str]:
    head, _, base = name.rstrip("/").rpartition("/")
    if base in ("", ".", ".."):
        raise UnsafeOutputError(f"not a file name: {name!r}")
    return head, base


def _read_all(fd: int, offset: int, nbytes: int) -> bytes:
    parts, done = [], 0
    while done < nbytes:
        part = os.pread(fd, nbytes - done, offset + done)
        if not part:
            break  # shortened meanwhile
        parts.append(part)
        done += len(part)
    return b"".join(parts)


def _write_all(fd: int, view: memoryview) -> None:
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


@dataclass(frozen=True)
class Made:
    """A folder ``create_folder`` made, known by its identity: removed only while it is
    still that folder (one swapped in at its path meanwhile is someone else's). Its descriptor
    stays open until ``remove_empty_folders``, so no other folder can take its inode number."""

    path: str
    identity: tuple[int, int]
    fd: int = -1


def create_folder(path: str, what: str = "OUT") -> list[Made]:
    """Create the folder ``path`` and its missing parents, each by name inside its parent's
    descriptor (the folders above walked under the owner rule of pipeline.store.links; a link
    planted for a missing one is refused, never followed); returns the folders this call made,
    outermost first (empty: it was there), so a job that leaves them empty can remove them."""
    path = os.path.abspath(path)
    found = links.walk(path, what)
    fd, head = found.fd, found.path
    made: list[Made] = []
    try:
        if found.kind == "file":
            raise NotADirectoryError(errno.ENOTDIR, "a file on the way", path)
        for name in found.missing:
            head = os.path.join(head, name)
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
                mine = True
            except FileExistsError:
                mine = False  # made by someone else meanwhile: theirs
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            if mine:
                st = os.fstat(fd)
                made.append(Made(head, (st.st_dev, st.st_ino), os.dup(fd)))
    except OSError as e:
        release(made)
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and found.kind != "file":
            raise UnsafeOutputError(f"{head} is a symbolic link or a file, not a folder") from e
        raise
    finally:
        os.close(fd)
    return made


def remove_empty_folders(made: list[Made], what: str = "OUT") -> None:
    """Remove the folders ``made`` (outermost first) while they are empty, innermost first;
    one that is no longer the folder made (swapped meanwhile) stays, and so do those above."""
    try:
        for folder in reversed(made):
            if not _remove_made(folder, what):
                return
    finally:
        release(made)


def _remove_made(folder: Made, what: str) -> bool:
    head, name = os.path.split(folder.path)
    try:
        parent = links.open_folder(head, what)
    except (OSError, UnsafeOutputError):
        return False
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != folder.identity:
            return False
        os.rmdir(name, dir_fd=parent)
    except OSError:
        return False
    finally:
        os.close(parent)
    return True


def release(made: list[Made]) -> None:
    """Close the descriptors ``create_folder`` kept (the folders stay)."""
    for folder in made:
        if folder.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(folder.fd)

"""An input inside an archive (``zip://A::a.zip``, ``tar://A::a.tar``, any fsspec archive file
system) read no larger than its stored objects can need.

fsspec's archive file systems open the archive by name (a FIFO swapped in after a look blocks
the open forever, a link to /dev/zero reads until memory runs out) and hand zarr each member
inflated whole: a 1 MiB zip whose chunk member inflates to 1 GiB took gigabytes of memory
before the chunk's decode cap saw it. Here a local archive is opened by us, ``O_NONBLOCK``, and
must be a regular file on the open descriptor; fsspec gets that open file, never the name. A
member is refused before it is inflated when its declared size (the zip's central directory,
the tar header, the file system's ``info``) is more than its key can need -- a metadata
document METADATA_BYTES, a chunk or shard what its array's codecs can make of one
(pipeline.store.chunks.bounded), nothing until those are known -- and is inflated a piece at a
time, never past that: a member whose header understates it stops at its declared size in
zipfile and tarfile (a zip's CRC then fails: refused as damaged), at the limit in any other
file system (refused). Zip members must be stored or deflated: Python's zipfile inflates bzip2
and lzma members without an output cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import lzma
import os
import stat
import tarfile
import threading
import zipfile
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import IO, TYPE_CHECKING, Any

import fsspec
from fsspec.archive import AbstractArchiveFileSystem
from fsspec.implementations.zip import ZipFileSystem
from zarr.abc.store import (
    ByteRequest,
    Store,
)
from zarr.core.buffer.core import default_buffer_prototype
from zarr.core.common import concurrent_map

from pipeline.errors import InputError, InputNotFoundError, StoredObjectError
from pipeline.plan.units import format_bytes
from pipeline.store import deputy
from pipeline.store.chunks.input_store import KINDS, METADATA_BYTES, is_metadata, refusal, span
from pipeline.store.fs import local_path

if TYPE_CHECKING:
    from zarr.core.buffer import Buffer, BufferPrototype

ARCHIVE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
"""A FIFO swapped in at the archive's path cannot block this open, nor a terminal become ours."""
PIECE_BYTES = 2**20
"""A member is inflated this much at a time (zipfile's deflate honours it as an output cap)."""
ZIP_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}
"""Zip compressions inflated within a bound: zipfile's bzip2 and lzma take no output cap."""
DAMAGED = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError,
           gzip.BadGzipFile, NotImplementedError)  # fmt: skip
"""What a damaged archive or member raises (a CRC that fails, a stream cut short)."""


def archive_store(url: str, storage_options: dict[str, Any] | None) -> ArchiveStore | None:
    """An ArchiveStore for a chained URL into an archive, its local archive file opened by us
    (InputNotFoundError when missing; InputError when not a regular file); None for any
    other URL."""
    found = _archive_class(url)
    if found is None:
        return None
    cls, links = found
    local = local_path(links[-1])
    if local is None:  # a remote archive: fsspec opens it (no FIFO there); members bounded
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        return ArchiveStore(fs, str(root), url, storage_options)
    if len(links) > 2:
        raise InputError(
            f"its archive {local} is reached through {'::'.join(links[1:-1])}, which opens it "
            f"by name; name the archive file itself: {links[0]}::{local}"
        )
    return ArchiveStore(
        _open_local(cls, local), cls._strip_protocol(links[0]), url, storage_options
    )


def archive_path(url: str) -> str | None:
    """The local archive file of a chained URL into an archive, which ``archive_store`` opens
    itself (``zip://A::/d/a.zip`` -> ``/d/a.zip``); None for any other URL."""
    found = _archive_class(url)
    return None if found is None else local_path(found[1][-1])


def _archive_class(url: str) -> tuple[type[Any], list[str]] | None:
    """The fsspec archive file system a chained URL opens first, and the URL's links; None
    when it opens none (an unknown protocol is check_protocol's to refuse)."""
    links = url.split("::")
    protocol, _ = fsspec.core.split_protocol(links[0])
    if len(links) < 2 or protocol is None:
        return None
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return None
    return (cls, links) if issubclass(cls, AbstractArchiveFileSystem) else None


def _open_local(cls: type[Any], path: str) -> Any:
    """``cls`` (an fsspec archive file system) over the regular file at ``path``, opened by
    us: looked at first (opening some devices acts), then checked on the open descriptor."""
    try:
        _check_regular(os.stat(path).st_mode, path)
        fd = os.open(path, ARCHIVE_FLAGS)
    except FileNotFoundError as e:
        raise InputNotFoundError(f"its archive {path} does not exist; check the path") from e
    except OSError as e:
        raise InputError(f"its archive {path} cannot be read ({e.strerror})") from e
    try:
        opened = os.fstat(fd)
        _check_regular(opened.st_mode, path)
        problem = deputy.refusal(path, opened)
        if problem is not None:  # another user's link to a file only the caller may read
            raise InputError(f"its archive {path} is {problem}")
        raw = io.FileIO(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    raw.name = path  # what fsspec's tar infers its compression from (.tar.gz)
    file = io.BufferedReader(raw)
    try:
        return cls(fo=file)
    except (*DAMAGED, OSError, ValueError) as e:
        file.close()
        raise InputError(f"its archive {path} cannot be read as {cls.protocol}: {e}") from e


def _check_regular(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in KINDS if test(mode)), "not a regular file")
        raise InputError(f"its archive {path} is {kind}, not a file; name the archive file itself")


class ArchiveStore(Store):
    """A read-only zarr Store over the members under ``root`` of an open archive file system:
    metadata documents read up to METADATA_BYTES, every other key (chunks, shards) up to
    ``chunk_bytes`` (0: not read, until the array's codecs are known)."""

    supports_writes = False
    supports_deletes = False
    supports_listing = True

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        storage_options: dict[str, Any] | None,
        chunk_bytes: int = 0,
    ) -> None:
        super().__init__(read_only=True)
        self.fs = fs
        self.root = root.strip("/")
        self.url = url
        self.storage_options = storage_options
        self.chunk_bytes = chunk_bytes
        """The most a chunk (or shard) member may inflate to, in bytes."""
        # tarfile (and libarchive) read members from one shared position: one at a time.
        # zipfile keeps each member's own position, under its own lock.
        zipped = isinstance(fs, ZipFileSystem)
        self._lock: Any = contextlib.nullcontext() if zipped else threading.Lock()

    def with_chunk_bytes(self, chunk_bytes: int) -> ArchiveStore:
        """This store, the same open archive, reading chunks of up to ``chunk_bytes``."""
        return ArchiveStore(self.fs, self.root, self.url, self.storage_options, chunk_bytes)

    def with_read_only(self, read_only: bool = False) -> ArchiveStore:
        if not read_only:
            raise ValueError(f"{self.url} is an archive input: it is read only")
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # reopened where it lands, checked again
        return (_reopened, (self.url, self.storage_options, self.chunk_bytes))

    def __eq__(self, other: object) -> bool:
        same = (self.fs, self.root, self.chunk_bytes)
        return isinstance(other, ArchiveStore) and (other.fs, other.root, other.chunk_bytes) == same

    def __str__(self) -> str:
        return self.url

    def limit(self, key: str) -> int:
        return METADATA_BYTES if is_metadata(key) else self.chunk_bytes

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        prototype = prototype or default_buffer_prototype()
        return await asyncio.to_thread(self._read, key, prototype, byte_range)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        reads = [(self._read, key, prototype, byte_range) for key, byte_range in key_ranges]
        return await concurrent_map(reads, asyncio.to_thread, limit=None)

    async def exists(self, key: str) -> bool:
        return await asyncio.to_thread(lambda: self.fs.isfile(self._member(key)))

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()

    async def delete(self, key: str) -> None:
        self._check_writable()

    def list(self) -> AsyncIterator[str]:
        return self.list_prefix("")

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await asyncio.to_thread(self._keys):
            if key.startswith(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        keys = await asyncio.to_thread(self._keys)
        children = {k[len(prefix) :].split("/", 1)[0] for k in keys if k.startswith(prefix)}
        for child in sorted(children):
            yield child

    def _member(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _keys(self) -> tuple[str, ...]:
        """Every member under ``root``, relative to it."""
        base = f"{self.root}/" if self.root else ""
        with self._lock:
            found = self.fs.find(self.root)
        return tuple(sorted(str(p)[len(base) :] for p in found if str(p).startswith(base)))

    def _read(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None
    ) -> Buffer | None:
        member, limit = self._member(key), self.limit(key)
        with self._lock:
            try:
                data = _member_bytes(self.fs, member, limit, byte_range)
            except DAMAGED as e:
                raise self._refused(key, f"damaged ({type(e).__name__}: {e})") from e
            except _Unfit as e:
                raise self._refused(key, str(e)) from None
        return None if data is None else prototype.buffer.from_bytes(data)

    def _refused(self, key: str, what: str) -> StoredObjectError:
        found = f"the archive member {self._member(key)}, {what}"
        return refusal(key, found, self.url.split("::", 1)[1])


class _Unfit(Exception):
    """What makes a member no object of an array: "a folder", "declaring 1.0 GiB where..."."""


def _member_bytes(
    fs: Any, member: str, limit: int, byte_range: ByteRequest | None
) -> bytes | bytearray | None:
    """``byte_range`` of ``member``, inflated to at most ``limit`` bytes; None when there is
    no such member; _Unfit when it declares or inflates to more, or cannot be read bounded."""
    entry = _entry(fs, member)
    if entry is None:
        return None
    declared, opener = entry
    if declared is not None and declared > limit:
        raise _Unfit(f"declaring {_size(declared)} where at most {_size(limit)} can be needed")
    with opener() as stream:
        if declared is None or byte_range is None:
            data = _inflate(stream, limit + 1)
            if len(data) > limit:
                claim = "" if declared is None else f" (it declares {_size(declared)})"
                raise _Unfit(
                    f"inflating to more than {_size(limit)}{claim}, where at most "
                    f"{_size(limit)} can be needed"
                )
            start, stop = span(byte_range, len(data))
            return data if byte_range is None else data[start:stop]
        start, stop = span(byte_range, declared)
        stream.seek(start)  # zipfile inflates up to there, never past the declared size
        return _inflate(stream, stop - start)


def _entry(fs: Any, member: str) -> tuple[int | None, Callable[[], IO[bytes]]] | None:
    """(declared size, opener) of ``member``; None when the archive has none."""
    if isinstance(fs, ZipFileSystem):
        try:
            info = fs.zip.getinfo(member)
        except KeyError:
            return None
        if info.is_dir():
            raise _Unfit("a folder")
        if info.flag_bits & 0x1:
            raise _Unfit("encrypted")
        if info.compress_type not in ZIP_METHODS:
            method = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}
            name = method.get(info.compress_type, f"method {info.compress_type}")
            raise _Unfit(
                f"compressed with {name}, which cannot be inflated within a bound "
                "(zip it again stored or deflated: zip -r0 or zip -r)"
            )
        return info.file_size, lambda: fs.zip.open(info)
    try:
        found = fs.info(member)
    except FileNotFoundError:
        return None
    if found.get("type") == "directory":
        raise _Unfit("a folder")
    size = found.get("size")
    return (None if size is None else int(size)), lambda: fs.open(member, "rb")


def _inflate(stream: IO[bytes], most: int) -> bytearray:
    """Up to ``most`` bytes of ``stream``, read a piece at a time."""
    data = bytearray()
    while len(data) < most:
        piece = stream.read(min(PIECE_BYTES, most - len(data)))
        if not piece:
            break
        data += piece
    return data


def _size(n: int) -> str:
    return f"{format_bytes(n)} ({n:,} bytes)" if n >= 1024 else format_bytes(n)


def _reopened(
    url: str, storage_options: dict[str, Any] | None, chunk_bytes: int
) -> ArchiveStore | None:
    store = archive_store(url, storage_options)
    return None if store is None else store.with_chunk_bytes(chunk_bytes)

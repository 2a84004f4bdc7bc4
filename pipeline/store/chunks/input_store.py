"""An input's stored objects read from local files no larger than they can need.

zarr's LocalStore reads whatever a key's path names, whole: a FIFO where a chunk should be
blocks the job forever, a link to /dev/zero or /dev/urandom reads until memory runs out, a
sparse 3 GiB chunk file is read whole. Here an object is looked at first (``stat``, following
links: chunks on another disk through a linked folder are a normal layout) and opened only
when it is a regular file no larger than its key can need -- a metadata document
METADATA_BYTES, a chunk or shard what its array's codecs can make of one
(pipeline.store.chunks.bounded) -- opened with O_NONBLOCK (a FIFO swapped in after the look cannot
block the open) and checked again on the open file. Anything else is a StoredObjectError
naming the key and what is there. The direct readers (chunk_read, shard_read, raw_chunks) open
their files through ``open_checked`` too.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer.core import default_buffer_prototype
from zarr.core.common import concurrent_map
from zarr.storage import LocalStore

from pipeline.errors import StoredObjectError
from pipeline.plan.units import format_bytes
from pipeline.store import deputy

if TYPE_CHECKING:
    from zarr.core.buffer import Buffer, BufferPrototype

METADATA_BYTES = 16 * 2**20
"""The most a metadata document (``zarr.json``, ``.zarray``, ``.zattrs``) is read to: a
numeric array's is a few KB; attributes of a few MiB are already unusual."""
METADATA_KEYS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_checked(path: str, limit: int, key: str) -> tuple[int, int] | None:
    """(descriptor, size) of the regular file at ``path`` (links followed), refused
    (StoredObjectError naming ``key``) when it is something else or larger than ``limit``
    bytes; None when nothing is stored there. The caller closes the descriptor."""
    try:
        # A look before the open: opening some devices acts (a tape rewinds, a watchdog
        # starts); the check on the open file below is the one that counts.
        _check(os.stat(path), limit, key, path)
        fd = os.open(path, OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None  # not stored: the fill value (zarr's LocalStore says the same)
    try:
        opened = os.fstat(fd)
        size = _check(opened, limit, key, path)
        _check_planters(path, opened, key)
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def _check_planters(path: str, opened: os.stat_result, key: str) -> None:
    """A link another user made leads only to what that user could read (else the caller's
    rights would copy it into OUT: pipeline.store.deputy)."""
    problem = deputy.refusal(path, opened)
    if problem is not None:
        raise refusal(key, problem, path)


def read_checked(path: str, limit: int, key: str, byte_range: ByteRequest | None = None) -> Any:
    """The bytes (a bytearray) of ``byte_range`` of the file ``open_checked`` admits; None
    when nothing is stored there."""
    opened = open_checked(path, limit, key)
    if opened is None:
        return None
    fd, size = opened
    try:
        start, stop = span(byte_range, size)
        data = bytearray(stop - start)
        got = 0
        while got < len(data):  # a regular file's read may come short, never block
            with memoryview(data) as view:
                n = os.preadv(fd, [view[got:]], start + got)
            if n == 0:
                break  # cut short since the fstat: what there is, as zarr would read it
            got += n
        del data[got:]
        return data
    finally:
        os.close(fd)


def refusal(key: str, found: str, path: str) -> StoredObjectError:
    """The error for ``found`` (see StoredObjectError) at ``key`` (its file ``path``)."""
    part = "metadata document" if is_metadata(key) else "chunk"
    return StoredObjectError(
        f"the {part} {key} is {found} ({path}); restore that {part} from a good copy of the "
        "array or rewrite the array",
        key,
        found,
    )


def named(error: StoredObjectError, name: str, url: str, then: str = "") -> StoredObjectError:
    """``error`` told of input ``name`` at ``url``, its fix ending with ``then``."""
    part = "metadata document" if is_metadata(error.key) else "chunk"
    where = f"{url.rstrip('/')}/{error.key}" if url else error.key
    who = f"{name} ({url})" if url else name
    return StoredObjectError(
        f"{who} cannot be read: its {part} {where} is {error.found}; restore that "
        f"{part} from a good copy or rewrite {name}{then}",
        error.key,
        error.found,
    )


class InputStore(LocalStore):
    """A read-only LocalStore whose every read goes through ``read_checked``: metadata up to
    METADATA_BYTES, every other key (chunks, shards) up to ``chunk_bytes``."""

    def __init__(
        self, root: Path | str, *, read_only: bool = True, chunk_bytes: int = METADATA_BYTES
    ) -> None:
        super().__init__(root, read_only=read_only)
        self.chunk_bytes = chunk_bytes
        """The most a chunk (or shard) file may hold; until the array's codecs are known,
        only metadata is read."""

    def with_read_only(self, read_only: bool = False) -> Self:
        return type(self)(self.root, read_only=read_only, chunk_bytes=self.chunk_bytes)

    def with_chunk_bytes(self, chunk_bytes: int) -> InputStore:
        return InputStore(self.root, read_only=self.read_only, chunk_bytes=chunk_bytes)

    def limit(self, key: str) -> int:
        return METADATA_BYTES if is_metadata(key) else self.chunk_bytes

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        self._ensure_open_sync()
        return self._read(key, prototype or default_buffer_prototype(), byte_range)

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        if not self._is_open:
            await self._open()
        prototype = prototype or default_buffer_prototype()
        return await asyncio.to_thread(self._read, key, prototype, byte_range)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        reads = [(self._read, key, prototype, byte_range) for key, byte_range in key_ranges]
        return await concurrent_map(reads, asyncio.to_thread, limit=None)

    def _read(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None
    ) -> Buffer | None:
        path = os.path.join(self.root, key)
        data = read_checked(path, self.limit(key), key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)


def _check(found: os.stat_result, limit: int, key: str, path: str) -> int:
    """``found``'s size when it is a regular file of at most ``limit`` bytes; else refused."""
    if stat.S_ISREG(found.st_mode):
        if found.st_size <= limit:
            return found.st_size
        what = f"a {format_bytes(found.st_size)} file where at most {format_bytes(limit)}"
        raise refusal(key, f"{what} can be needed", path)
    kind = next((name for test, name in KINDS if test(found.st_mode)), "not a regular file")
    raise refusal(key, kind, path)


def span(byte_range: ByteRequest | None, size: int) -> tuple[int, int]:
    """[start, stop) of ``byte_range`` in an object of ``size`` bytes, as zarr's LocalStore
    reads."""
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        start = min(byte_range.start, size)
        return start, max(start, min(byte_range.end, size))
    if isinstance(byte_range, OffsetByteRequest):
        return min(byte_range.offset, size), size
    if isinstance(byte_range, SuffixByteRequest):
        return max(0, size - byte_range.suffix), size
    raise TypeError(f"Unexpected byte_range, got {byte_range}.")


def is_metadata(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in METADATA_KEYS

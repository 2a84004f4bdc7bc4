"""OUT's large chunks written around the page cache (``O_DIRECT``) on a local file system.

A buffered write copies every byte into freshly allocated page-cache pages in the kernel, at
many times the system time of a direct write (the device reads our buffer itself), and OUT's
chunks are not read back by the job. zarr's LocalStore has no such option, so OUT's store
stages a large chunk into a page-aligned buffer (O_DIRECT's rule; a copy in user space, far
cheaper than the kernel's into new pages), written to a temporary file and renamed over the
chunk as zarr does. Small objects (metadata, chunks under DIRECT_MIN_BYTES) and file systems
refusing O_DIRECT (tmpfs) are written buffered. Both go through OUT's door
(pipeline.store.door).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import LocalStore

from pipeline.errors import UnsafeOutputError
from pipeline.store.chunks.input_store import METADATA_BYTES, is_metadata
from pipeline.store.door import Door

DIRECT_MIN_BYTES = 2**20
"""Smaller writes go through the page cache: their copy costs little, a device round trip
each would cost more."""
ALIGN = 4096
"""O_DIRECT wants the buffer's address, the file offset and the length in multiples of the
device's logical block (512 B or 4 KiB): 4 KiB covers both."""
KEPT_BUFFERS = 2
"""Staging buffers kept for reuse (fresh ones cost a page fault per page); more writes at
once make their own."""

_free: list[mmap.mmap] = []
_free_lock = threading.Lock()


class OutStore(LocalStore):
    """A local OUT (or C) as zarr sees it: zarr's LocalStore for reads, every write and delete
    through the folder's door (pipeline.store.door: no link followed, nothing outside the
    folder touched), large chunks written around the page cache where the file system allows."""

    def __init__(self, root: Path | str, *, read_only: bool = False, what: str = "OUT") -> None:
        super().__init__(root, read_only=read_only)
        self.door = Door(str(self.root), what)
        self.chunk_bytes = METADATA_BYTES
        """The most a stored chunk (or shard) may hold: metadata's bound until the array's
        layout is known (``bound``), so a planted sparse file is never read whole."""

    def bound(self, array: Any) -> Any:
        """``array`` (opened on this store), its stored objects' size now known."""
        from pipeline.store.chunks.bounded import stored_bytes

        self.chunk_bytes = max(stored_bytes(array), METADATA_BYTES)
        return array

    async def _open(self, *, mode: Any = None) -> None:
        """OUT's folder must be there (claimed): never created here, through a link or not
        (a stopped job's straggler must not make a deleted OUT again)."""
        self.door.identity()  # refuses a link, a file or a swapped folder; FileNotFoundError
        self._is_open = True

    def _ensure_open_sync(self) -> None:
        if not self._is_open:
            self.door.identity()
            self._is_open = True

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        self._ensure_open_sync()
        data = self._read(key, byte_range)
        return (
            None
            if data is None
            else (prototype or default_buffer_prototype()).buffer.from_bytes(data)
        )

    def with_read_only(self, read_only: bool = False) -> OutStore:
        return type(self)(self.root, read_only=read_only, what=self.door.what)

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        """Reads too go through the door: a link, FIFO or folder planted in OUT is refused,
        never followed or waited on."""
        if prototype is None:
            prototype = default_buffer_prototype()
        if not self._is_open:
            await self._open()
        data = await asyncio.to_thread(self._read, key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    def _read(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        limit = METADATA_BYTES if is_metadata(key) else self.chunk_bytes
        start, stop = 0, None
        if isinstance(byte_range, RangeByteRequest):
            start, stop = byte_range.start, byte_range.end
        elif isinstance(byte_range, OffsetByteRequest):
            start = byte_range.offset
        elif isinstance(byte_range, SuffixByteRequest):
            start = -byte_range.suffix
        elif byte_range is not None:
            raise TypeError(f"unexpected byte range {byte_range!r}")
        return self.door.read_range(key, start, stop, limit)

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        await asyncio.to_thread(self._write, key, value.as_buffer_like(), exclusive)

    def set_sync(self, key: str, value: Buffer) -> None:
        self._check_writable()
        self._write(key, value.as_buffer_like(), False)

    def _write(self, key: str, data: Any, exclusive: bool) -> None:
        view = memoryview(data).cast("B")
        direct = not exclusive and len(view) >= DIRECT_MIN_BYTES and hasattr(os, "O_DIRECT")
        if direct and write_direct(self.door, key, view):
            return
        self.door.write(key, view, exclusive=exclusive)

    async def delete(self, key: str) -> None:
        self._check_writable()
        await asyncio.to_thread(self.door.remove, key)

    def delete_sync(self, key: str) -> None:
        self._check_writable()
        self.door.remove(key)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        if prefix and self.door.exists(prefix):
            await asyncio.to_thread(self.door.remove_tree, prefix)

    async def clear(self) -> None:
        raise UnsafeOutputError(f"{self.root}: clearing a whole store is never done here")

    async def move(self, dest_root: Path | str) -> None:
        raise UnsafeOutputError(f"{self.root}: moving a whole store is never done here")


def write_direct(door: Door, key: str, data: Any) -> bool:
    """Write ``data`` to ``key`` inside the door's folder with O_DIRECT (a temporary file,
    renamed over it); False, having written nothing, where the file system refuses it."""
    view = memoryview(data).cast("B")
    return door.write_with(key, lambda fd: _write_all(fd, view), flags=os.O_DIRECT)


def _write_all(fd: int, view: memoryview) -> None:
    """The aligned body with O_DIRECT from a staging buffer, then the tail (under ALIGN bytes)
    buffered."""
    body = len(view) - len(view) % ALIGN
    staging = _take(body)
    try:
        staging[:body] = view[:body]
        written = 0
        while written < body:
            with memoryview(staging) as chunk:
                written += os.pwrite(fd, chunk[written:body], written)
    finally:
        _give(staging)
    if body < len(view):
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        os.pwrite(fd, view[body:], body)


def _take(nbytes: int) -> mmap.mmap:
    """A page-aligned buffer of at least ``nbytes``: a kept one that fits, else a new one."""
    with _free_lock:
        for i, buffer in enumerate(_free):
            if len(buffer) >= nbytes:
                return _free.pop(i)
    return mmap.mmap(-1, max(nbytes, ALIGN))


def _give(buffer: mmap.mmap) -> None:
    with _free_lock:
        if len(_free) < KEPT_BUFFERS:
            _free.append(buffer)
            return
    buffer.close()

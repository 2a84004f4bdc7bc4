"""Operands in memory (numpy and dask arrays) as Zarr arrays the workers can open.

Each is written once to a private temporary folder on this machine: ``tempfile.mkdtemp``'s
(under ``$TMPDIR``, mode 0700: this user alone), one per job, holding ``A.zarr`` and ``B.zarr``
(``X.zarr`` for a Gram product; an array given twice is written once). ``$TMPDIR`` must be a
folder no other user can rename it in (private_base). The copies are Zarr v3, uncompressed, and
go when the job has run, when it is garbage-collected, when planning it fails or when the
interpreter exits, whichever comes first; a process killed first leaves them to the next job
of the same user on the host (sweep_stale).

The copies must fit: their bytes must leave ``reserve_bytes`` of the folder's file system free
(else refused, naming the operand, its bytes and the limit). Both kinds are written one stored
chunk at a time, so this process holds one chunk more at most: a numpy array is in memory
already; a dask array is computed block by block, each block whole stored chunks (multiples of
its own chunks when they are regular, else rechunked: dask#12583), and a chunk must fit the
memory available. The workers of a local cluster see the folder; a remote cluster's must share
it, or they say they cannot read it (pipeline.errors.InputUnreachableError, whose fix is then
to write the array to storage they can read and pass its URL).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import stat
import sys
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import psutil
import zarr

from pipeline.errors import COPY_FOLDER_PREFIX, ArgumentTypeError, InputError, UsageError
from pipeline.plan.units import format_bytes
from pipeline.store import links
from pipeline.store.deputy import owner_name

SIDE = 1024
"""A copy's chunks are at most this many rows and columns to start with (copy_chunks)."""
CHUNK_BYTES = 8 << 20
"""... and grow along the longer axis until a chunk holds about this many bytes."""
RESERVE_BYTES = 1 << 30
"""Free space the copies leave in the temporary folder's file system (or a tenth of its size,
when that is less)."""
FIX = (
    "write it to Zarr yourself (e.g. zarr.create_array('a.zarr', data=array), or "
    "dask_array.to_zarr('a.zarr')) and pass that path or URL"
)


class TemporaryOperands:
    """The folder of a job's copies; removed by ``remove()``, at garbage collection or at exit."""

    def __init__(self, folder: str, copies: dict[str, str], kinds: dict[str, str]) -> None:
        self.folder = folder
        self.copies = copies
        """Each copied operand's name (A, B, X) and its array's path."""
        self.kinds = kinds
        """Each copied operand's name and what it was ("numpy array", "dask array")."""
        self._finalizer = weakref.finalize(self, shutil.rmtree, folder, True)

    def shown(self, url: str) -> str | None:
        """How a job shows the copy at ``url``: its operand, in memory (None: not a copy)."""
        for name, path in self.copies.items():
            if path == url:
                return f"{name} ({self.kinds[name]})"
        return None

    @property
    def removed(self) -> bool:
        return not self._finalizer.alive

    def remove(self) -> None:
        self._finalizer()

    @contextlib.contextmanager
    def removed_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.remove()
            raise

    @contextlib.contextmanager
    def used(self) -> Iterator[None]:
        """Around a job's run: refused once removed, removed after (whatever happens)."""
        if self.removed:
            names = " and ".join(self.copies)
            raise UsageError(
                f"this job's {names} (array(s) in memory, copied to a temporary folder for the "
                "job) were removed when it first ran; prepare the job again to run it again"
            )
        try:
            yield
        finally:
            self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.removed else "present"
        return f"<TemporaryOperands {', '.join(self.copies)} in {self.folder} ({state})>"


def in_memory(obj: object) -> bool:
    """A numpy or dask array (the forms copied to a temporary Zarr array)."""
    return isinstance(obj, np.ndarray) or _is_dask(obj)


def refuse_as_out(obj: object) -> None:
    """An array in memory as OUT is refused: the workers write OUT."""
    if in_memory(obj):
        raise ArgumentTypeError(
            f"OUT is a {_kind(obj)}; OUT is written by the workers, so it must be stored: "
            "give a path (str or os.PathLike), an fsspec URL or a zarr.Array this tool wrote, "
            "and read the product back with the result's open(), to_dask() or to_xarray()"
        )


def _is_dask(obj: object) -> bool:
    array = sys.modules.get("dask.array")  # not loaded: no dask array can exist
    return array is not None and isinstance(obj, array.Array)


def stage(
    operands: Sequence[object], names: Sequence[str]
) -> tuple[tuple[object, ...], TemporaryOperands | None]:
    """``operands`` with each array in memory replaced by the path of its temporary copy
    (the same object twice copied once), and the copies' folder (None: nothing to copy).
    Every operand is checked, and the room for all of them, before anything is written."""
    chosen: dict[int, tuple[str, Any]] = {}
    for obj, name in zip(operands, names, strict=True):
        if in_memory(obj) and id(obj) not in chosen:
            chosen[id(obj)] = (name, obj)
    if not chosen:
        return tuple(operands), None
    for name, obj in chosen.values():
        check_operand(obj, name)
    base = private_base(tempfile.gettempdir())
    check_room([(name, obj) for name, obj in chosen.values()], base)
    sweep_stale(base)
    folder = tempfile.mkdtemp(prefix=_prefix() + f"{os.getpid()}-", dir=base)
    paths = {name: os.path.join(folder, f"{name}.zarr") for name, _ in chosen.values()}
    kinds = {name: _kind(obj) for name, obj in chosen.values()}
    copies = TemporaryOperands(folder, paths, kinds)
    with copies.removed_on_error():
        for name, obj in chosen.values():
            write_copy(obj, copies.copies[name], name)
    given = tuple(paths[chosen[id(o)][0]] if id(o) in chosen else o for o in operands)
    return given, copies


def private_base(base: str) -> str:
    """The temporary folder the copies go in, ``base`` resolved under the owner rule
    (pipeline.store.links: a link another user planted on the way is refused); refused where
    another user could rename the copies' folder and put their own arrays in its place: owned
    by someone else than the caller or root, or writable by others without the sticky bit."""
    found = links.resolve(base, "the temporary folder (TMPDIR)")
    st = os.stat(found)
    others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if st.st_uid not in (0, os.geteuid()) or (others and not st.st_mode & stat.S_ISVTX):
        why = (
            f"is owned by {owner_name(st.st_uid)}"
            if st.st_uid not in (0, os.geteuid())
            else "is writable by others without the sticky bit"
        )
        raise UsageError(
            f"the temporary folder {found} (TMPDIR) {why}, so another user could replace the "
            "copy of an array in memory before the workers read it; point TMPDIR at a folder "
            "only you can write (or a sticky one, as /tmp is), or write the array to Zarr "
            "yourself and pass its path"
        )
    return found


def _prefix() -> str:
    """The copies' folder names: ours by host and process id (sweep_stale)."""
    return f"{COPY_FOLDER_PREFIX}{socket.gethostname().replace('-', '_')}-"


def sweep_stale(base: str) -> None:
    """Remove the copies' folders of this user's processes on this host that are gone (killed
    before they could remove them); a folder of a live process, another host's or another
    user's is left alone."""
    prefix = _prefix()
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        for entry in entries:
            pid = entry.name.removeprefix(prefix).split("-", 1)[0]
            if not entry.name.startswith(prefix) or not pid.isdigit():
                continue
            st = entry.stat(follow_symlinks=False)
            mine = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            if mine and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)  # resists link attacks


def check_operand(array: Any, name: str) -> None:
    """Refuse what cannot be multiplied before it is copied: not 2-D, empty, not numeric, a
    masked array (its mask would be lost), a dask array of unknown chunk sizes."""
    kind = _kind(array)
    shape = tuple(array.shape)
    if len(shape) != 2:
        raise InputError(
            f"{name} is a {len(shape)}-D {kind} of shape {shape}; only 2-D matrices can be "
            "multiplied: reshape it (e.g. v[:, None] for a column, v[None, :] for a row)"
        )
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biufc":
        raise InputError(
            f"{name} is a {kind} of dtype {dtype}, which is not numeric; convert it, e.g. "
            f"{name.lower()}.astype('float32')"
        )
    if any(math.isnan(n) for n in shape):
        raise InputError(
            f"{name} is a {kind} of unknown shape {shape}; call compute_chunk_sizes() first"
        )
    if 0 in shape:
        raise InputError(f"{name} is an empty {kind} ({shape[0]}x{shape[1]}); nothing to multiply")
    if isinstance(array, np.ma.MaskedArray):
        raise InputError(
            f"{name} is a masked array, whose mask would be lost; fill it first "
            f"({name.lower()}.filled(0)) and pass that"
        )


def _kind(array: Any) -> str:
    return "numpy array" if isinstance(array, np.ndarray) else "dask array"


def nbytes(array: Any) -> int:
    shape = tuple(array.shape)
    return int(shape[0]) * int(shape[1]) * int(np.dtype(array.dtype).itemsize)


def reserve_bytes(total: int) -> int:
    """The free space the copies leave on a file system of ``total`` bytes."""
    return min(RESERVE_BYTES, total // 10)


def check_room(named: list[tuple[str, Any]], folder: str) -> None:
    """Refuse copies that would not fit in ``folder``'s file system (each named with its bytes
    and what is left for it), and a dask array whose largest stored chunk would not fit the
    memory available."""
    usage = shutil.disk_usage(folder)
    limit = max(usage.free - reserve_bytes(usage.total), 0)
    for name, array in named:
        needed = nbytes(array)
        if needed > limit:
            raise UsageError(
                f"{name} is a {_kind(array)} of {format_bytes(needed)} ({needed} bytes); it is "
                f"copied to a temporary Zarr array in {folder}, where {format_bytes(limit)} "
                f"({limit} bytes) can be taken (the free space less "
                f"{format_bytes(reserve_bytes(usage.total))}); {FIX}, or set TMPDIR to a "
                "folder with room"
            )
        limit -= needed
    available = int(psutil.virtual_memory().available)
    for name, array in named:
        chunk = _chunk_bytes(array)
        if _is_dask(array) and chunk > available:
            raise UsageError(
                f"{name} is a dask array whose largest stored chunk takes {format_bytes(chunk)} "
                f"({chunk} bytes), more than the {format_bytes(available)} ({available} bytes) "
                f"of memory available to compute it; rechunk it smaller ({name.lower()}"
                f".rechunk(...)), or {FIX}"
            )


def copy_chunks(shape: tuple[int, int], itemsize: int) -> tuple[int, int]:
    """A copy's chunks: at most SIDE x SIDE, the longer axis's grown until a chunk holds about
    CHUNK_BYTES (a tall, thin array is not cut into a thousand tiny chunks)."""
    rows, cols = min(shape[0], SIDE), min(shape[1], SIDE)
    if shape[0] >= shape[1]:
        rows = min(shape[0], max(rows, CHUNK_BYTES // (cols * itemsize)))
    else:
        cols = min(shape[1], max(cols, CHUNK_BYTES // (rows * itemsize)))
    return rows, cols


def _stored_chunks(array: Any) -> tuple[int, int]:
    """copy_chunks, and for a dask array of regular chunks (all but the last of one size) whole
    multiples of them (at least one): each of its blocks is then computed once, into one
    stored chunk."""
    shape = (int(array.shape[0]), int(array.shape[1]))
    chunks = copy_chunks(shape, np.dtype(array.dtype).itemsize)
    if not _is_dask(array) or not all(
        all(c == sizes[0] for c in sizes[:-1]) and sizes[-1] <= sizes[0] for sizes in array.chunks
    ):
        return chunks
    own = (int(array.chunks[0][0]), int(array.chunks[1][0]))
    rows, cols = (min(n, max(1, c // o) * o) for n, c, o in zip(shape, chunks, own, strict=True))
    return rows, cols


def _chunk_bytes(array: Any) -> int:
    rows, cols = _stored_chunks(array)
    return rows * cols * int(np.dtype(array.dtype).itemsize)


def write_copy(array: Any, path: str, name: str = "A") -> None:
    """``array`` as an uncompressed Zarr v3 array at ``path`` (native byte order); a dask block
    that computes to another shape than its chunks declare is refused, naming ``name``."""
    chunks = _stored_chunks(array)
    copy = zarr.create_array(
        path,
        shape=tuple(int(n) for n in array.shape),
        chunks=chunks,
        dtype=np.dtype(array.dtype).newbyteorder("="),
        compressors=None,
        zarr_format=3,
    )
    blocks = array.rechunk(chunks).to_delayed() if _is_dask(array) else None
    for i, j in np.ndindex(*_grid(copy.shape, chunks)):  # one chunk in memory at a time
        region = np.s_[i * chunks[0] : (i + 1) * chunks[0], j * chunks[1] : (j + 1) * chunks[1]]
        # a numpy view (Fortran order, strided) is copied one chunk at a time as zarr encodes it
        if blocks is None:
            copy[region] = array[region]
            continue
        want = tuple(min(c, n - k * c) for c, n, k in zip(chunks, copy.shape, (i, j), strict=True))
        where = (
            f"{name} is a dask array whose block at rows {i * chunks[0]}:{i * chunks[0] + want[0]}"
            f", columns {j * chunks[1]}:{j * chunks[1] + want[1]}"
        )
        fix = "fix what makes it (map_blocks needs chunks= when it changes a block's shape)"
        try:
            block = np.asarray(blocks[i, j].compute())
        except ValueError as e:  # its parts did not fit together: chunks that lie
            raise InputError(f"{where} cannot be computed ({e}); {fix}") from e
        if block.shape != want:  # numpy would broadcast it
            raise InputError(
                f"{where} computes to shape {block.shape}, not its declared {want}; {fix}"
            )
        copy[region] = block


def _grid(shape: tuple[int, ...], chunks: tuple[int, int]) -> tuple[int, int]:
    return -(-shape[0] // chunks[0]), -(-shape[1] // chunks[1])

"""A block of a sharded array read shard by shard from local files, without zarr's per-chunk
machinery: each shard's index once, then the inner chunks the block needs in as few reads as
their byte ranges allow, each decoded as pipeline.store.chunks.unsharded decodes an unsharded chunk.

Sharding is how small chunks are stored at scale, and zarr reads each inner chunk as its own
byte-range request through its event loop: a product of small chunks in shards runs several
times slower than the same chunks unsharded, most of the difference in zarr's threads. Here
the needed chunks of one shard are usually neighbours in the file (zarr writes a shard's
chunks in C order), so they come in one read.

Covered: a zarr v3 array on a LocalStore whose one codec is ``sharding_indexed`` with the inner
codecs chunk_read takes (bytes, little-endian, and at most one compressor) and the default index
codecs (bytes and crc32c, or bytes alone), at either end. Anything else, a missing shard or an
empty inner chunk (its fill value is zarr's to give) go through zarr. An index whose checksum or
ranges do not hold is refused as zarr would refuse it; a shard file that is no regular file or
is larger than its inner chunks and index can take, and an inner chunk's range longer than one
can take, are refused unread (pipeline.store.chunks.input_store).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.memory.scratch import scratch
from pipeline.plan.memory import ZARR_BYTES_PER_CHUNK, ZARR_CONCURRENCY
from pipeline.plan.units import format_bytes
from pipeline.store.chunks.input_store import open_checked, refusal
from pipeline.store.chunks.unsharded import (
    DIRECT_MAX_CHUNK_BYTES,
    Layout,
    little_bytes,
    place,
    stored_limit,
    v3_layout,
)

EMPTY = 2**64 - 1
"""An inner chunk that was never written: offset and length both."""
GAP_BYTES = 64 << 10
"""Neighbouring chunks' ranges are read as one while the bytes between them stay under this,
and the one read within what the memory model counts for zarr's read of the block (its
chunks in flight and its bookkeeping per chunk: pipeline.plan.memory.zarr_bytes)."""


@dataclass(frozen=True)
class ShardLayout:
    inner: Layout
    """The inner chunks, as chunk_read stores them."""
    shard: tuple[int, int]
    index_at_end: bool
    checksum: bool
    """The index ends with its crc32c."""


def shard_layout(array: Any) -> ShardLayout | None:
    """The layout when this path reads ``array``, else None (zarr's path)."""
    import zarr
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
    from zarr.storage import LocalStore

    if not isinstance(array, zarr.Array) or array.ndim != 2 or array.metadata.zarr_format != 3:
        return None
    codecs = array.metadata.codecs
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    if not isinstance(array.store_path.store, LocalStore):
        return None
    sharding, dtype, shards = codecs[0], np.dtype(array.dtype), array.shards
    if dtype.kind not in "biufc" or dtype.byteorder == ">" or shards is None:
        return None
    index = tuple(type(c) for c in sharding.index_codecs)
    if index not in ((BytesCodec, Crc32cCodec), (BytesCodec,)):
        return None
    if not little_bytes(sharding.index_codecs[0]):
        return None
    chunks = (int(sharding.chunk_shape[0]), int(sharding.chunk_shape[1]))
    inner = v3_layout(sharding.codecs, dtype, chunks)
    shard = (int(shards[0]), int(shards[1]))
    if inner is None or shard[0] % chunks[0] or shard[1] % chunks[1]:
        return None
    return ShardLayout(
        inner,
        shard,
        getattr(sharding.index_location, "value", sharding.index_location) == "end",
        Crc32cCodec in index,
    )


def readable(array: Any) -> bool:
    """True when this path reads ``array``: a layout it covers, inner chunks of at most
    chunk_read's DIRECT_MAX_CHUNK_BYTES (larger ones gain little beside their decode)."""
    found = shard_layout(array)
    if found is None:
        return False
    (cm, cn) = found.inner.chunks
    return cm * cn * found.inner.dtype.itemsize <= DIRECT_MAX_CHUNK_BYTES


def read_into(array: Any, rows: tuple[int, int], cols: tuple[int, int], out: NDArray[Any]) -> bool:
    """``array[rows, cols]`` into ``out`` (cast by numpy as ``astype`` would); False, with
    ``out`` partly written, when this path cannot read it (then read it through zarr)."""
    found = shard_layout(array)
    if found is None:
        return False
    (sm, sn), (cm, cn) = found.shard, found.inner.chunks
    folder = os.path.join(str(array.store_path.store.root), array.store_path.path)
    chunk_bytes = cm * cn * found.inner.dtype.itemsize
    touched = (-(-rows[1] // cm) - rows[0] // cm) * (-(-cols[1] // cn) - cols[0] // cn)
    span = ZARR_CONCURRENCY * chunk_bytes + ZARR_BYTES_PER_CHUNK * touched
    with scratch(chunk_bytes) as decoded:
        for si in range(rows[0] // sm, -(-rows[1] // sm)):
            for sj in range(cols[0] // sn, -(-cols[1] // sn)):
                key = array.metadata.encode_chunk_key((si, sj))
                shard = (key, os.path.join(folder, key))
                if not _read_shard(found, shard, (si, sj), (rows, cols), out, decoded, span):
                    return False
    return True


def _read_shard(
    found: ShardLayout,
    stored: tuple[str, str],
    shard: tuple[int, int],
    block: tuple[tuple[int, int], tuple[int, int]],
    out: NDArray[Any],
    decoded: NDArray[np.uint8],
    span: int,
) -> bool:
    """The block's part in one shard file; False where zarr must read it (see read_into)."""
    (rows, cols), (sm, sn), (cm, cn) = block, found.shard, found.inner.chunks
    per = (sm // cm, sn // cn)
    # The inner chunks of this shard the block touches, as rows and columns of its grid.
    i0, i1 = (
        (max(rows[0], shard[0] * sm) - shard[0] * sm) // cm,
        -(-(min(rows[1], (shard[0] + 1) * sm) - shard[0] * sm) // cm),
    )
    j0, j1 = (
        (max(cols[0], shard[1] * sn) - shard[1] * sn) // cn,
        -(-(min(cols[1], (shard[1] + 1) * sn) - shard[1] * sn) // cn),
    )
    (key, path), inner_limit = stored, stored_limit(found.inner)
    index_bytes = 16 * per[0] * per[1] + (4 if found.checksum else 0)
    # a regular file no larger than its inner chunks and its index can take, opened without
    # blocking (pipeline.store.chunks.input_store)
    opened = open_checked(path, per[0] * per[1] * inner_limit + index_bytes, key)
    if opened is None:
        return False  # every chunk empty: zarr's fill value
    fd, size = opened
    try:
        if size < index_bytes:
            raise ValueError(f"a shard of {size} bytes cannot hold its {index_bytes}-byte index")
        raw = os.pread(fd, index_bytes, size - index_bytes if found.index_at_end else 0)
        _check(raw, found.checksum)
        table = np.frombuffer(raw, "<u8", count=2 * per[0] * per[1]).reshape(per[0], per[1], 2)
        needed = table[i0:i1, j0:j1].reshape(-1, 2)
        if (needed == EMPTY).any():
            return False  # an inner chunk never written: zarr's fill value
        # each figure first: an offset near 2**64 plus a length would wrap past the check
        if (needed > size).any() or (needed[:, 0] + needed[:, 1] > size).any():
            raise ValueError(f"a shard's index points past its {size} bytes")
        if (needed[:, 1] > inner_limit).any():
            longest = format_bytes(int(needed[:, 1].max()))
            where = f"{longest} for an inner chunk where at most {format_bytes(inner_limit)}"
            raise refusal(key, f"a shard whose index gives {where} can be needed", path)
        coords = [(i, j) for i in range(i0, i1) for j in range(j0, j1)]
        base = (shard[0] * per[0], shard[1] * per[1])
        for run in _runs(needed, span):
            lo, hi = int(needed[run[0], 0]), max(int(needed[k, 0] + needed[k, 1]) for k in run)
            with scratch(hi - lo) as data:
                got = os.preadv(fd, [data.data], lo)
                if got != hi - lo:
                    raise ValueError(f"a shard's chunk ends past its {size} bytes")
                for k in run:
                    start, length = int(needed[k, 0]) - lo, int(needed[k, 1])
                    index = (base[0] + coords[k][0], base[1] + coords[k][1])
                    if not place(
                        found.inner, index, data[start : start + length], rows, cols, out, decoded
                    ):
                        return False
    finally:
        os.close(fd)
    return True


def _check(raw: bytes, checksum: bool) -> None:
    """The index's crc32c, as zarr's Crc32cCodec checks it."""
    if not checksum:
        return
    import google_crc32c

    if np.uint32(google_crc32c.value(raw[:-4])).tobytes() != raw[-4:]:
        raise ValueError("a shard's index does not match its crc32c checksum")


def _runs(ranges: NDArray[np.uint64], span: int) -> list[list[int]]:
    """The chunks (positions in ``ranges``: offset, length) grouped into runs read at once:
    sorted by offset, a chunk joins the run before it while the gap to it stays under
    GAP_BYTES and the run within ``span`` bytes (a run holds one chunk at least)."""
    order = sorted(range(len(ranges)), key=lambda k: int(ranges[k, 0]))
    runs: list[list[int]] = []
    start = end = 0
    for k in order:
        lo, hi = int(ranges[k, 0]), int(ranges[k, 0] + ranges[k, 1])
        if runs and lo - end <= GAP_BYTES and max(hi, end) - start <= span:
            runs[-1].append(k)
            end = max(end, hi)
        else:
            runs.append([k])
            start, end = lo, hi
    return runs

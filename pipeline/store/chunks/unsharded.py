"""A block of an unsharded array read chunk by chunk without zarr's per-chunk machinery.

zarr reads a chunk through its codec pipeline, an asyncio task and its indexing, which cost
several times what fetching and decoding a small chunk's bytes do: small chunks spend most of
their time there. This path fetches a batch of stored chunks in one round trip through the
store, decodes each into exactly its own size (pipeline.store.chunks.sizes: the same bounds as
every other read) and copies the part the block needs into the caller's buffer. From a local
store each chunk is read (os.open, readv) into one buffer the whole block reuses, and decoded
through one other when it is copied (kernels.memory.scratch), a good share cheaper than a file
object and a buffer pair per chunk; each file is opened only when it is a regular file no
larger than a stored chunk can be, else refused unread
(pipeline.store.chunks.input_store.open_checked). A chunk wholly inside a block one chunk wide
is decoded straight into the caller's buffer (its rows are contiguous there), which zarr
cannot do (it decodes into its own buffer, then copies): such blocks of large chunks come this
way too.
Arrays it does not cover (filters, a transposing or big-endian layout, codecs other than one
compressor) and blocks with an unstored chunk go through zarr; sharded ones through
pipeline.store.chunks.sharded, which decodes their inner chunks with ``place``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from numpy.typing import NDArray

from kernels.memory.scratch import scratch
from pipeline.plan.memory import ZARR_BYTES_PER_CHUNK
from pipeline.store.chunks.codec_bounds import compressed_bytes
from pipeline.store.chunks.input_store import open_checked
from pipeline.store.chunks.sizes import DECODERS, decode_exact

BATCH_CHUNKS = 10
"""Stored chunks fetched in one round trip at least (zarr's own reads hold as many)."""
DIRECT_MAX_CHUNK_BYTES = 2**20
"""Larger chunks go through zarr (its per-chunk cost is a few percent of their decode, and it
decodes a read's chunks in parallel) unless the block holds one whole and contiguous."""


@dataclass(frozen=True)
class Layout:
    """How an array's chunks are stored, when this path can read them."""

    codec: str | None
    """numcodecs id of the one compressor (None: the elements' bytes as they are)."""
    dtype: np.dtype[Any]
    """The stored elements, little-endian (or one byte)."""
    chunks: tuple[int, int]


def layout(array: Any) -> Layout | None:
    """The array's chunk layout when this path can read it, else None (zarr's path)."""
    if not isinstance(array, zarr.Array):
        return None  # a view that computes its values (verify's Undone, Transposed): its own path
    dtype = np.dtype(array.dtype)
    if array.ndim != 2 or getattr(array, "shards", None) is not None or dtype.byteorder == ">":
        return None
    if dtype.kind not in "biufc":
        return None
    metadata = array.metadata
    chunks = (int(array.chunks[0]), int(array.chunks[1]))
    if metadata.zarr_format == 2:
        if metadata.filters or metadata.order != "C":
            return None
        codec = getattr(metadata.compressor, "codec_id", None)
        if metadata.compressor is not None and codec not in DECODERS:
            return None
        return Layout(codec, dtype, chunks)
    return v3_layout(metadata.codecs, dtype, chunks)


def stored_limit(found: Layout) -> int:
    """The most bytes one stored chunk of ``found`` can take: its elements' bytes, compressed
    or not (a larger file is refused unread: pipeline.store.chunks.input_store)."""
    (cm, cn) = found.chunks
    chunk_bytes = cm * cn * found.dtype.itemsize
    return chunk_bytes if found.codec is None else compressed_bytes(chunk_bytes)


def v3_layout(codecs: Any, dtype: np.dtype[Any], chunks: tuple[int, int]) -> Layout | None:
    """The layout of zarr v3 chunks stored through ``codecs`` (an array's, or a shard's inner
    ones): little-endian bytes, then at most one compressor numcodecs decodes; else None."""
    if not codecs or not little_bytes(codecs[0]) or len(codecs) > 2:
        return None
    if len(codecs) == 1:
        return Layout(None, dtype, chunks)
    codec = v3_codec_id(codecs[1])
    return Layout(codec, dtype, chunks) if codec else None


def little_bytes(codec: Any) -> bool:
    """``codec`` is zarr v3's bytes codec, little-endian (or for one-byte elements)."""
    from zarr.codecs import BytesCodec

    endian = getattr(codec, "endian", None)
    return isinstance(codec, BytesCodec) and getattr(endian, "value", endian) in (None, "little")


def v3_codec_id(codec: Any) -> str | None:
    """The numcodecs id decoding a v3 compressor's chunks, when one does so exactly."""
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    if isinstance(codec, ZstdCodec):
        return None if codec.checksum else "zstd"
    if isinstance(codec, GzipCodec):
        return "gzip"
    if isinstance(codec, BloscCodec):
        return "blosc"
    return None


def readable(
    array: Any, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None
) -> bool:
    """True when this path reads ``array`` (``[rows, cols]`` of it): a layout it covers, and
    chunks of at most DIRECT_MAX_CHUNK_BYTES, or compressed ones decoding straight into the
    block (it is one whole chunk wide and holds at least one whole chunk)."""
    found = layout(array)
    if found is None:
        return False
    if math.prod(found.chunks) * found.dtype.itemsize <= DIRECT_MAX_CHUNK_BYTES:
        return True
    if found.codec is None or rows is None or cols is None:
        return False
    (cm, cn) = found.chunks
    one_chunk_wide = cols[0] % cn == 0 and cols[1] - cols[0] == cn
    return one_chunk_wide and -(-rows[0] // cm) * cm + cm <= rows[1]


def read_into(array: Any, rows: tuple[int, int], cols: tuple[int, int], out: NDArray[Any]) -> bool:
    """``array[rows, cols]`` into ``out`` (cast by numpy as ``astype`` would); False, with
    ``out`` partly written, when this path cannot read it (then read it through zarr)."""
    found = layout(array)
    if found is None:
        return False
    (cm, cn), item = found.chunks, found.dtype.itemsize
    indices = [
        (i, j)
        for i in range(rows[0] // cm, -(-rows[1] // cm))
        for j in range(cols[0] // cn, -(-cols[1] // cn))
    ]
    chunk_bytes = cm * cn * item
    # The memory model counts zarr's bookkeeping per chunk touched, which this path does not
    # spend: it holds that many more stored bytes per batch instead.
    batch = max(BATCH_CHUNKS, ZARR_BYTES_PER_CHUNK * len(indices) // max(chunk_bytes, 1))
    # One buffer decodes every chunk this block holds only part of (taken once per block: a
    # small chunk's fixed costs are most of its time).
    with scratch(chunk_bytes if found.codec else 0) as decoded:
        for index, data in _chunks(array, found, indices, batch):
            if data is None or not place(found, index, data, rows, cols, out, decoded):
                return False  # unstored (its fill value is zarr's to give), or a bad raw size
    return True


def place(
    found: Layout,
    index: tuple[int, int],
    data: NDArray[np.uint8],
    rows: tuple[int, int],
    cols: tuple[int, int],
    out: NDArray[Any],
    decoded: NDArray[np.uint8],
) -> bool:
    """Chunk ``index``'s stored bytes decoded into its part of ``out`` (the block ``[rows,
    cols]``), through ``decoded`` (a chunk's bytes) unless it lands whole and contiguous;
    False for a raw chunk of the wrong size (zarr's read says what is wrong with it)."""
    (cm, cn), (i, j) = found.chunks, index
    chunk_bytes = cm * cn * found.dtype.itemsize
    r0, r1 = max(rows[0], i * cm), min(rows[1], (i + 1) * cm)
    c0, c1 = max(cols[0], j * cn), min(cols[1], (j + 1) * cn)
    target = out[r0 - rows[0] : r1 - rows[0], c0 - cols[0] : c1 - cols[0]]
    part = (slice(r0 - i * cm, r1 - i * cm), slice(c0 - j * cn, c1 - j * cn))
    if found.codec is None:
        if data.nbytes != chunk_bytes:
            return False
        np.copyto(target, data.view(found.dtype).reshape(cm, cn)[part], "unsafe")
        return True
    what = f"{cm}x{cn} {found.dtype} elements"
    if target.shape == (cm, cn) and target.dtype == found.dtype and target.flags.c_contiguous:
        # the whole chunk, its rows contiguous: decoded in place, no copy
        decode_exact(found.codec, data, chunk_bytes, what, target.reshape(-1).view(np.uint8))
        return True
    decode_exact(found.codec, data, chunk_bytes, what, decoded[:chunk_bytes])
    np.copyto(target, decoded[:chunk_bytes].view(found.dtype).reshape(cm, cn)[part], "unsafe")
    return True


def _chunks(
    array: Any, found: Layout, indices: list[tuple[int, int]], batch: int
) -> Iterator[tuple[tuple[int, int], NDArray[np.uint8] | None]]:
    """Each index with its chunk's stored bytes (None: not stored), valid until the next one is
    asked for: from a local store by plain file reads in this thread into a reused buffer
    (zarr's local store sends each through its event loop and a thread, a fixed cost per chunk
    that small chunks feel, and into new bytes), else ``batch`` at a time in one round trip
    through zarr's store."""
    from zarr.storage import LocalStore

    from pipeline.store.chunks.raw import stored_chunks

    store = array.store_path.store
    if not isinstance(store, LocalStore):
        for start in range(0, len(indices), batch):
            part = indices[start : start + batch]
            yield from zip(part, stored_chunks(array, part), strict=True)
        return
    folder = os.path.join(str(store.root), array.store_path.path)
    key, limit = array.metadata.encode_chunk_key, stored_limit(found)
    with scratch(0) as buffer:
        for index in indices:
            # a regular file no larger than a chunk can take, opened without blocking
            opened = open_checked(os.path.join(folder, key(index)), limit, key(index))
            if opened is None:
                yield index, None
                continue
            fd, size = opened
            try:
                if size > buffer.nbytes:  # grown for the largest stored chunk, then reused
                    buffer = np.empty(max(size, 2 * buffer.nbytes), np.uint8)
                got = os.readv(fd, [buffer.data[:size]])
            finally:
                os.close(fd)
            yield index, buffer[:got]

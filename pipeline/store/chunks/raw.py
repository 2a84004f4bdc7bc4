"""A block's chunks as stored (compressed), for decoding on the GPU (--gpu-decode).

Only arrays whose every chunk is one plain zstd frame of the little-endian, C-order elements
qualify: Zarr v3 with codecs [bytes, zstd] or [bytes, zstd, crc32c], and Zarr v2 with a Zstd
compressor, no filters and order C. Anything else -- sharded, Blosc, LZ4, transposed,
big-endian, zstd's own content checksum (checkable only by decoding) -- is decoded on the host.

nvCOMP documents a corrupt zstd frame as undefined behaviour (no error guaranteed; a fault can
poison the worker's CUDA context), so the device sees only frames the host has checked: each
well formed (header, blocks, ending exactly at the chunk's end), declaring exactly its chunk's
bytes, and matching its crc32c where zarr stores one. A chunk failing a check is decoded on the
host, which refuses it and names it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.device.decode import ChunkPiece, CompressedPanel
from pipeline.store.chunks.zstd_frames import declared_size

ALIGN = 16


def device_decodable(array: Any) -> bool:
    """True when ``array``'s chunks are plain zstd frames of its elements (see above)."""
    from zarr.codecs import BytesCodec, ZstdCodec

    dtype = np.dtype(array.dtype)
    if dtype.byteorder == ">" or getattr(array, "shards", None) is not None:
        return False
    metadata = array.metadata
    if metadata.zarr_format == 2:
        compressor = metadata.compressor
        return (
            getattr(compressor, "codec_id", None) == "zstd"
            and not getattr(compressor, "checksum", False)
            and not metadata.filters
            and metadata.order == "C"
        )
    if len(metadata.codecs) not in (2, 3) or (len(metadata.codecs) == 3 and not has_crc32c(array)):
        return False
    bytes_codec, zstd = metadata.codecs[:2]  # zstd may be pipeline.store.chunks.bounded's subclass
    if not (isinstance(bytes_codec, BytesCodec) and isinstance(zstd, ZstdCodec)):
        return False
    endian = getattr(bytes_codec.endian, "value", bytes_codec.endian)
    return endian in (None, "little") and not zstd.checksum


def has_crc32c(array: Any) -> bool:
    """True when ``array``'s chunks end in zarr's crc32c of their bytes (v3 codecs end so)."""
    from zarr.codecs import Crc32cCodec

    codecs: tuple[Any, ...] = tuple(getattr(array.metadata, "codecs", ()))
    return bool(codecs) and isinstance(codecs[-1], Crc32cCodec)


def checked_frame(stored: NDArray[np.uint8], crc32c: bool, chunk_bytes: int) -> Any:
    """The zstd frame of a stored chunk, or None when the host finds it unsafe for the device:
    its crc32c (when stored) differs, or it is not whole zstd frames declaring exactly
    ``chunk_bytes``."""
    frame = stored
    if crc32c:
        import google_crc32c

        frame, stored_crc = stored[:-4], stored[-4:].tobytes()
        if len(stored) < 4 or google_crc32c.value(frame.tobytes()) != int.from_bytes(
            stored_crc, "little"
        ):
            return None
    return frame if declared_size(frame, chunk_bytes) == chunk_bytes else None


def stored_chunks(array: Any, indices: list[tuple[int, int]]) -> list[NDArray[np.uint8] | None]:
    """The stored (still encoded) bytes of ``array``'s chunks at ``indices``, fetched at once;
    None for a chunk that is not stored. Local files are read within what a stored chunk of
    ``array`` can take (pipeline.store.chunks.input_store: a FIFO, a device or a larger file
    refused)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    from zarr.storage import LocalStore

    keys = [array.metadata.encode_chunk_key(index) for index in indices]
    store = array.store_path.store
    if isinstance(store, LocalStore):
        from pipeline.store.chunks.bounded import stored_bytes
        from pipeline.store.chunks.input_store import read_checked

        folder, limit = os.path.join(str(store.root), array.store_path.path), stored_bytes(array)
        read = [read_checked(os.path.join(folder, key), limit, key) for key in keys]
        return [None if data is None else np.frombuffer(data, np.uint8) for data in read]
    paths = [array.store_path / key for key in keys]
    prototype = default_buffer_prototype()

    async def fetch() -> list[Any]:
        return await asyncio.gather(*(path.get(prototype=prototype) for path in paths))

    frames = sync(fetch()) if indices else []
    return [None if frame is None else frame.as_numpy_array() for frame in frames]


def read_compressed(
    array: Any, rows: tuple[int, int], cols: tuple[int, int], out: NDArray[np.uint8]
) -> CompressedPanel | None:
    """The stored chunks of ``array[rows, cols]`` packed into ``out``, with where each piece
    goes; None when one is missing (its elements are the fill value: decode on the host), they
    don't fit in ``out``, or a chunk fails the host's checks (checked_frame; the host path
    refuses it, naming it, or decodes it bounded)."""
    (cm, cn) = array.chunks
    indices = [
        (i, j)
        for i in range(rows[0] // cm, -(-rows[1] // cm))
        for j in range(cols[0] // cn, -(-cols[1] // cn))
    ]
    stored = stored_chunks(array, indices)
    chunk_bytes = cm * cn * np.dtype(array.dtype).itemsize
    crc32c = has_crc32c(array)
    checked = [None if f is None else checked_frame(f, crc32c, chunk_bytes) for f in stored]
    frames = [f for f in checked if f is not None]
    if len(frames) < len(stored):
        return None
    sizes = [len(frame) for frame in frames]
    starts = [0]
    for size in sizes:  # nvCOMP wants each frame aligned (16 bytes does for every codec)
        starts.append(starts[-1] + -(-size // ALIGN) * ALIGN)
    if starts[-1] > out.nbytes:
        return None
    pieces = []
    for (i, j), frame, size, offset in zip(indices, frames, sizes, starts, strict=False):
        out[offset : offset + size] = frame
        r0, r1 = max(rows[0], i * cm), min(rows[1], (i + 1) * cm)
        c0, c1 = max(cols[0], j * cn), min(cols[1], (j + 1) * cn)
        take = (r0 - i * cm, r1 - i * cm, c0 - j * cn, c1 - j * cn)
        pieces.append(ChunkPiece(offset, size, (cm, cn), take, (r0 - rows[0], c0 - cols[0])))
    elements = (rows[1] - rows[0]) * (cols[1] - cols[0]) * np.dtype(array.dtype).itemsize
    dtype = np.dtype(array.dtype).newbyteorder("<").str
    return CompressedPanel(tuple(pieces), dtype, starts[-1], elements)

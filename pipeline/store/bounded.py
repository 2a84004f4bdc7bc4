"""Inputs whose zstd chunks decode into exactly their own size, never more.

numcodecs allocates what a zstd frame declares and decompresses it all (a 66 KB chunk can
declare and hold 2 GiB); a frame that declares nothing is decoded into a buffer that grows
without bound. Each input is opened with its zstd codec swapped for one that reads the declared
size first (pipeline.store.zstd_frames) and refuses a chunk whose size is not its shape's,
undecoded, then decodes into a buffer of exactly that size (numcodecs refuses, still bounded, a
frame without a declared size that holds more). Every read of an input goes through zarr's codec
pipeline -- the CPU tasks, verify's reads, the staged GPU path's host decoding -- so every one
is bounded. Covered: Zarr v3 ``zstd`` right after ``bytes`` (sharded too: inner chunks and
index), Zarr v2 ``Zstd`` without filters. Other codecs decode as zarr does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numcodecs.zstd
import numpy as np
import zarr
from numcodecs.compat import ensure_contiguous_ndarray
from numpy.typing import NDArray
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
from zarr.core.array import AsyncArray
from zarr.core.metadata import ArrayMetadata, ArrayV2Metadata

from pipeline.errors import ChunkSizeError
from pipeline.store.zstd_frames import Frames, declared_size, first_frame_size

if TYPE_CHECKING:
    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec as ZarrChunkSpec
    from zarr.core.buffer import Buffer


def check_frames(data: Frames, expected: int, what: str) -> int | None:
    """Refuse zstd ``data`` whose frames declare other than ``expected`` bytes (``what``: the
    chunk's shape and dtype, for the message); returns what they declare. Frames that declare
    nothing (None) pass: decoding into ``expected`` bytes bounds them."""
    if first_frame_size(data) == expected:  # the common case: one frame, one header read
        return expected
    declared = declared_size(data, expected)
    if declared is not None and declared != expected:
        raise _refused(declared, expected, what)
    return declared


def decode_exact(data: Frames, expected: int, what: str) -> NDArray[np.uint8]:
    """Zstd ``data`` decoded into a new buffer of exactly ``expected`` bytes, or refused."""
    declared = check_frames(data, expected, what)
    out = np.empty(expected, dtype=np.uint8)
    try:
        numcodecs.zstd.decompress(data, out)
    except ValueError as e:  # frames past the first declare more: numcodecs refused them
        total = declared_size(data, 2**63)
        if total is None:
            raise
        raise _refused(total, expected, what) from e
    except RuntimeError as e:
        if declared is not None or "too small" not in str(e):
            raise
        raise ChunkSizeError(
            f"a stored zstd chunk declares no size and decodes past the {expected:,} bytes "
            f"its {what} hold; refused there",
            None,
            expected,
        ) from e
    return out


def _refused(declared: int, expected: int, what: str) -> ChunkSizeError:
    return ChunkSizeError(
        f"a stored zstd chunk declares {declared:,} bytes but its {what} hold {expected:,}; "
        "refused before decoding",
        declared,
        expected,
    )


class BoundedZstdCodec(ZstdCodec):
    """Zarr v3 ``zstd`` right after ``bytes``: a chunk decodes to exactly its shape's bytes."""

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ZarrChunkSpec) -> Buffer:
        dtype = chunk_spec.dtype.to_native_dtype()
        expected = math.prod(chunk_spec.shape) * dtype.itemsize
        what = f"{'x'.join(map(str, chunk_spec.shape))} {dtype} elements"
        out = decode_exact(chunk_bytes.as_numpy_array(), expected, what)
        return chunk_spec.prototype.buffer.from_array_like(out)


class BoundedZstd(numcodecs.zstd.Zstd):  # type: ignore[misc]
    """Zarr v2 ``Zstd`` without filters: a chunk decodes to exactly ``chunk_bytes``."""

    def __init__(self, level: int, checksum: bool, chunk_bytes: int, what: str) -> None:
        super().__init__(level=level, checksum=checksum)
        self._chunk_bytes = chunk_bytes  # private: kept out of get_config, so of the metadata
        self._what = what

    def decode(self, buf: Any, out: Any = None) -> Any:
        if out is not None:  # the caller's buffer bounds it
            return super().decode(buf, out)
        data = ensure_contiguous_ndarray(buf).view(np.uint8)
        return decode_exact(data, self._chunk_bytes, self._what)


def bounded(array: zarr.Array[Any]) -> zarr.Array[Any]:
    """``array`` (read-only) with its zstd chunks decoded as above; as it is when none are."""
    metadata = _bounded_metadata(array.metadata)
    if metadata is None:
        return array
    config = array.async_array.config
    return zarr.Array(AsyncArray(metadata=metadata, store_path=array.store_path, config=config))


def _bounded_metadata(metadata: ArrayMetadata) -> ArrayMetadata | None:
    """The metadata with its zstd codecs bounded; None when there is none to bound."""
    if isinstance(metadata, ArrayV2Metadata):
        compressor = metadata.compressor
        if not isinstance(compressor, numcodecs.zstd.Zstd) or metadata.filters:
            return None
        dtype = metadata.dtype.to_native_dtype()
        what = f"{'x'.join(map(str, metadata.chunks))} {dtype} elements"
        chunk = math.prod(metadata.chunks) * dtype.itemsize
        checksum = getattr(compressor, "checksum", False)
        codec = BoundedZstd(compressor.level, checksum, chunk, what)
        return dataclasses.replace(metadata, compressor=codec)
    codecs = _bounded_codecs(metadata.codecs)
    return None if codecs == metadata.codecs else dataclasses.replace(metadata, codecs=codecs)


def _bounded_codecs(codecs: tuple[Codec, ...]) -> tuple[Codec, ...]:
    """The codecs with every zstd that directly follows ``bytes`` bounded, inside shards too
    (a zstd after another bytes-to-bytes codec sees bytes of a size only that codec knows)."""
    out: list[Codec] = []
    for codec in codecs:
        if isinstance(codec, ShardingCodec):
            codec = dataclasses.replace(
                codec,
                codecs=_bounded_codecs(codec.codecs),
                index_codecs=_bounded_codecs(codec.index_codecs),
            )
        elif type(codec) is ZstdCodec and out and isinstance(out[-1], BytesCodec):
            codec = BoundedZstdCodec(level=codec.level, checksum=codec.checksum)
        out.append(codec)
    return tuple(out)

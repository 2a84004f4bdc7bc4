"""Inputs whose compressed chunks decode into exactly their own size, never more.

Each input is opened with its compressor swapped for one that decodes through
pipeline.store.chunk_sizes: the size a chunk declares is read first and a chunk declaring
other than its shape's bytes refused undecoded, then it is decoded into a buffer of exactly
that size. Every read of an input goes through zarr's codec pipeline -- the CPU tasks,
verify's reads, the staged GPU path's host decoding -- so every one is bounded. Covered: Zarr v3
``zstd``, ``blosc`` and ``gzip`` right after ``bytes`` (inner chunks of shards too), Zarr v2
``zstd``, ``blosc``, ``lz4``, ``gzip`` and ``zlib`` compressors without filters (a filter
changes the size the compressor sees). Other codecs decode as zarr does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numcodecs.abc
import numpy as np
import zarr
from numcodecs.compat import ensure_contiguous_ndarray
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ShardingCodec, ZstdCodec
from zarr.core.array import AsyncArray
from zarr.core.metadata import ArrayMetadata, ArrayV2Metadata

from pipeline.store.chunk_sizes import DECODERS, decode_exact

if TYPE_CHECKING:
    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec as ZarrChunkSpec
    from zarr.core.buffer import Buffer


class _Bounded:
    """A Zarr v3 bytes-to-bytes codec right after ``bytes``: a chunk decodes into exactly
    its shape's bytes."""

    codec_id: ClassVar[str]

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ZarrChunkSpec) -> Buffer:
        dtype = chunk_spec.dtype.to_native_dtype()
        expected = math.prod(chunk_spec.shape) * dtype.itemsize
        data = chunk_bytes.as_numpy_array()
        out = decode_exact(self.codec_id, data, expected, _what(chunk_spec.shape, dtype))
        return chunk_spec.prototype.buffer.from_array_like(out)


class BoundedZstdCodec(_Bounded, ZstdCodec):
    codec_id = "zstd"


class BoundedBloscCodec(_Bounded, BloscCodec):
    codec_id = "blosc"


class BoundedGzipCodec(_Bounded, GzipCodec):
    codec_id = "gzip"


V3 = {ZstdCodec: BoundedZstdCodec, BloscCodec: BoundedBloscCodec, GzipCodec: BoundedGzipCodec}


class BoundedCompressor(numcodecs.abc.Codec):  # type: ignore[misc]
    """A Zarr v2 compressor without filters: a chunk decodes into exactly ``chunk_bytes``;
    anything else (its config, encoding, attributes) is the wrapped compressor's."""

    codec_id: ClassVar[str]  # one subclass per codec (V2): zarr looks for it on the class

    def __init__(self, inner: Any, chunk_bytes: int, what: str) -> None:
        self._inner, self._chunk_bytes, self._what = inner, chunk_bytes, what

    def __getattr__(self, name: str) -> Any:  # level, checksum, cname...: the inner one's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def get_config(self) -> dict[str, Any]:
        return dict(self._inner.get_config())

    def encode(self, buf: Any) -> Any:
        return self._inner.encode(buf)

    def decode(self, buf: Any, out: Any = None) -> Any:
        if out is not None:  # the caller's buffer bounds it
            return self._inner.decode(buf, out)
        data = ensure_contiguous_ndarray(buf).view(np.uint8)
        return decode_exact(self.codec_id, data, self._chunk_bytes, self._what)


V2 = {name: type(f"Bounded_{name}", (BoundedCompressor,), {"codec_id": name}) for name in DECODERS}


def bounded(array: zarr.Array[Any]) -> zarr.Array[Any]:
    """``array`` (read-only) with its chunks decoded as above; as it is when none can be."""
    metadata = _bounded_metadata(array.metadata)
    if metadata is None:
        return array
    config = array.async_array.config
    return zarr.Array(AsyncArray(metadata=metadata, store_path=array.store_path, config=config))


def stored_codec(array: zarr.Array[Any]) -> str | None:
    """The codec id of ``array``'s unsharded chunks when they decode bounded, else None."""
    metadata = array.metadata
    if isinstance(metadata, ArrayV2Metadata):
        return _v2_codec(metadata)
    codecs = metadata.codecs
    for before, codec in zip(codecs, codecs[1:], strict=False):
        if isinstance(codec, _Bounded) and isinstance(before, BytesCodec):
            return codec.codec_id
    return None


def _bounded_metadata(metadata: ArrayMetadata) -> ArrayMetadata | None:
    """The metadata with its compressors bounded; None when none can be."""
    if isinstance(metadata, ArrayV2Metadata):
        name = _v2_codec(metadata)
        if name is None:
            return None
        dtype = metadata.dtype.to_native_dtype()
        chunk = math.prod(metadata.chunks) * dtype.itemsize
        codec = V2[name](metadata.compressor, chunk, _what(metadata.chunks, dtype))
        return dataclasses.replace(metadata, compressor=codec)
    codecs = _bounded_codecs(metadata.codecs)
    return None if codecs == metadata.codecs else dataclasses.replace(metadata, codecs=codecs)


def _v2_codec(metadata: ArrayV2Metadata) -> str | None:
    """The compressor's codec id when its chunks can decode bounded (no filters), else None."""
    name = getattr(metadata.compressor, "codec_id", None)
    return name if name in DECODERS and not metadata.filters else None


def _bounded_codecs(codecs: tuple[Codec, ...]) -> tuple[Codec, ...]:
    """The codecs with each one right after ``bytes`` bounded, inside shards too (one after
    another bytes-to-bytes codec sees bytes of a size only that codec knows)."""
    out: list[Codec] = []
    for codec in codecs:
        if isinstance(codec, ShardingCodec):
            codec = dataclasses.replace(
                codec,
                codecs=_bounded_codecs(codec.codecs),
                index_codecs=_bounded_codecs(codec.index_codecs),
            )
        elif type(codec) in V3 and out and isinstance(out[-1], BytesCodec):
            codec = _rebound(V3[type(codec)], codec)
        out.append(codec)
    return tuple(out)


def _rebound(cls: type[Any], codec: Codec) -> Codec:
    """``codec`` as its bounded subclass, its settings (frozen dataclass fields) as they are."""
    new: Codec = object.__new__(cls)
    new.__dict__.update(codec.__dict__)
    return new


def _what(shape: tuple[int, ...], dtype: np.dtype[Any]) -> str:
    return f"{'x'.join(map(str, shape))} {dtype} elements"

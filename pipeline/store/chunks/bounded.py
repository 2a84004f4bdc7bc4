"""Inputs whose every decode is capped, and whose stored objects are read within a bound.

Each input is opened with its compressors swapped for ones that decode through
pipeline.store.chunks.sizes. The one next to the elements (Zarr v3: right after ``bytes``; Zarr
v2: the compressor of an array without filters) decodes into exactly its chunk's bytes, a chunk
declaring another size refused undecoded; one further out (a second compressor in a v3 chain, a
v2 compressor after filters) decodes into at most what the codecs between it and the elements
can make of a chunk (pipeline.store.chunks.codec_bounds: a filter's worst expansion, such as AsType
to a wider type; each compressor's worst case). Every read of an input goes through zarr's codec
pipeline -- the CPU tasks, verify's reads, the staged GPU path's host decoding -- or the direct
readers, which decode through chunk_sizes too, so every one is bounded. The same walk over the
codecs gives the most bytes one stored chunk (or shard: its inner chunks' bound summed, and its
index) can take: an input's InputStore reads no file larger. A codec nothing bounds is refused
by name when the input is opened (InputError).
"""

from __future__ import annotations

import asyncio
import dataclasses
import lzma
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numcodecs.abc
import numpy as np
import zarr
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy
from zarr.abc.codec import ArrayArrayCodec
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.core.array import AsyncArray
from zarr.core.buffer.core import default_buffer_prototype
from zarr.core.metadata import ArrayMetadata, ArrayV2Metadata
from zarr.storage import StorePath

from pipeline.store.chunks.archive_store import ArchiveStore, archive_store
from pipeline.store.chunks.codec_bounds import (
    CHECKSUM_BYTES,
    V3_ARRAY_TO_ARRAY,
    V3_CHECKSUMS,
    V3_COMPRESSORS,
    V3_SAME_SIZE,
    compressed_bytes,
    unbounded,
    v2_filtered_bytes,
)
from pipeline.store.chunks.input_store import InputStore
from pipeline.store.chunks.sizes import DECODERS, decode_capped, decode_exact
from pipeline.store.fs import local_path

if TYPE_CHECKING:
    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArrayConfig
    from zarr.core.array_spec import ArraySpec as ZarrChunkSpec
    from zarr.core.buffer import Buffer


class _Bounded:
    """A Zarr v3 bytes-to-bytes compressor whose chunks decode into exactly their shape's
    bytes (``_exact``: right after ``bytes``) or into at most ``_limit`` bytes."""

    codec_id: ClassVar[str]
    _limit: int
    _exact: bool
    _what: str

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ZarrChunkSpec) -> Buffer:
        data = chunk_bytes.as_numpy_array()
        if self._exact:
            dtype = chunk_spec.dtype.to_native_dtype()
            expected = math.prod(chunk_spec.shape) * dtype.itemsize
            out = decode_exact(self.codec_id, data, expected, _what(chunk_spec.shape, dtype))
        else:
            out = decode_capped(self.codec_id, data, self._limit, self._what)
        return chunk_spec.prototype.buffer.from_array_like(out)

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ZarrChunkSpec) -> Buffer:
        # numcodecs' v3 codecs decode here without a _decode_sync: every one through ours
        return await asyncio.to_thread(self._decode_sync, chunk_bytes, chunk_spec)


_V3_CLASSES: dict[type[Any], type[Any]] = {}
"""Each v3 compressor class met, with its bounded subclass."""


def _bounded_class(cls: type[Any], codec_id: str) -> type[Any]:
    if issubclass(cls, _Bounded):
        return cls  # bounded again (stored_bytes of a bounded array): its limits anew
    if cls not in _V3_CLASSES:
        name = f"Bounded{cls.__name__}"
        _V3_CLASSES[cls] = type(name, (_Bounded, cls), {"codec_id": codec_id})
    return _V3_CLASSES[cls]


class BoundedCompressor(numcodecs.abc.Codec):  # type: ignore[misc]
    """A Zarr v2 compressor whose chunks decode into exactly ``limit`` bytes (``exact``: no
    filters) or at most that many; anything else (its config, encoding, attributes) is the
    wrapped compressor's."""

    codec_id: ClassVar[str]  # one subclass per codec (V2): zarr looks for it on the class

    def __init__(self, inner: Any, limit: int, exact: bool, what: str) -> None:
        self._inner, self._limit, self._exact, self._what = inner, limit, exact, what

    def __getattr__(self, name: str) -> Any:  # level, checksum, cname...: the inner one's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def get_config(self) -> dict[str, Any]:
        return dict(self._inner.get_config())

    def encode(self, buf: Any) -> Any:
        return self._inner.encode(buf)

    def decode(self, buf: Any, out: Any = None) -> Any:
        data = ensure_contiguous_ndarray(buf).reshape(-1).view(np.uint8)
        if self._exact:
            decoded = decode_exact(self.codec_id, data, self._limit, self._what)
        else:
            decoded = decode_capped(self.codec_id, data, self._limit, self._what)
        return decoded if out is None else ndarray_copy(decoded, out)


V2 = {name: type(f"Bounded_{name}", (BoundedCompressor,), {"codec_id": name}) for name in DECODERS}


def open_input_array(url: str, storage_options: dict[str, Any] | None) -> zarr.Array[Any]:
    """The array at ``url``, read-only (its codecs as stored: see ``bounded``): from local
    files through an InputStore, from an archive through an ArchiveStore, each reading no
    chunk (or shard) larger than one can take; else as zarr opens the URL. An InputError
    naming a codec that cannot be bounded."""
    local = local_path(url)
    first: InputStore | ArchiveStore | None = (
        InputStore(local) if local is not None else archive_store(url, storage_options)
    )
    if first is None:
        return zarr.open_array(url, mode="r", storage_options=storage_options)
    array = zarr.open_array(store=first, mode="r")  # its metadata only, so far
    if not _numeric(array):
        return array
    store = first.with_chunk_bytes(stored_bytes(array))
    config = array.async_array.config
    return zarr.Array(
        AsyncArray(metadata=array.metadata, store_path=StorePath(store), config=config)
    )


def bounded(array: zarr.Array[Any]) -> zarr.Array[Any]:
    """``array`` (read-only) with its decodes capped as above; an InputError naming the codec
    when one cannot be bounded."""
    if not _numeric(array):
        return array
    config = array.async_array.config
    metadata, _ = _bound_metadata(array.metadata, config)
    return zarr.Array(AsyncArray(metadata=metadata, store_path=array.store_path, config=config))


def stored_bytes(array: zarr.Array[Any]) -> int:
    """The most bytes one stored chunk (or shard) of ``array`` can take."""
    return _bound_metadata(array.metadata, array.async_array.config)[1]


def stored_codec(array: zarr.Array[Any]) -> str | None:
    """The codec id of ``array``'s stored chunks when they are one compressor's, decoding
    into exactly their shape's bytes (opened through ``bounded``), else None."""
    metadata = array.metadata
    if isinstance(metadata, ArrayV2Metadata):
        compressor = metadata.compressor
        if isinstance(compressor, BoundedCompressor) and compressor._exact:
            return compressor.codec_id
        return None
    found = [c for c in metadata.codecs if isinstance(c, _Bounded)]
    return found[0].codec_id if len(found) == 1 and found[0]._exact else None


def _bound_metadata(metadata: ArrayMetadata, config: ArrayConfig) -> tuple[ArrayMetadata, int]:
    """The metadata with its compressors bounded, and the most bytes a stored object takes."""
    if isinstance(metadata, ArrayV2Metadata):
        return _bound_v2(metadata)
    spec = metadata.get_chunk_spec((0,) * metadata.ndim, config, default_buffer_prototype())
    codecs, stored = _bound_chain(metadata.codecs, spec)
    return dataclasses.replace(metadata, codecs=codecs), stored


def _bound_v2(metadata: ArrayV2Metadata) -> tuple[ArrayV2Metadata, int]:
    """Zarr v2: the compressor decodes into exactly the chunk's bytes, or (after filters) at
    most what the filters can make of them."""
    dtype = metadata.dtype.to_native_dtype()
    filters = tuple(metadata.filters or ())
    filtered = v2_filtered_bytes(filters, math.prod(metadata.chunks) * dtype.itemsize)
    compressor: Any = metadata.compressor
    if compressor is None:
        return metadata, filtered
    if isinstance(compressor, BoundedCompressor):
        compressor = compressor._inner  # bounded again (stored_bytes of a bounded array)
    name = str(getattr(compressor, "codec_id", type(compressor).__name__))
    if name not in DECODERS or _raw_lzma(name, compressor):
        raise unbounded(name, "compressor")
    what = _what(metadata.chunks, dtype)
    if filters:
        what += f" through {', '.join(str(getattr(f, 'codec_id', f)) for f in filters)}"
    codec = V2[name](compressor, filtered, not filters, what)
    return dataclasses.replace(metadata, compressor=codec), compressed_bytes(filtered)


def _bound_chain(codecs: tuple[Codec, ...], spec: ZarrChunkSpec) -> tuple[tuple[Codec, ...], int]:
    """``codecs`` (a v3 chain for chunks of ``spec``) with each compressor bounded, and the
    most bytes a chunk stored through them takes. The first compressor after ``bytes``
    decodes exactly (reordering codecs between them keep the size); one after another
    compressor, a checksum or a shard, into at most the bytes the chain below it can make."""
    out: list[Codec] = []
    nbytes, exact = 0, False
    below: list[str] = []  # the codecs between the elements and the next compressor
    for codec in codecs:
        name = _name(codec)
        if isinstance(codec, ArrayArrayCodec):
            if name not in V3_ARRAY_TO_ARRAY:
                raise unbounded(name, "codec")
            spec = codec.resolve_metadata(spec)  # as many elements, perhaps another dtype
        elif isinstance(codec, BytesCodec):
            nbytes, exact = math.prod(spec.shape) * spec.dtype.to_native_dtype().itemsize, True
        elif isinstance(codec, ShardingCodec):
            codec, nbytes = _bound_shard(codec, spec)
            exact, below = False, ["sharding"]
        elif name in V3_COMPRESSORS and not _raw_lzma(V3_COMPRESSORS[name], codec):
            what = f"{_what(spec.shape, spec.dtype.to_native_dtype())} through {', '.join(below)}"
            codec = _rebound(codec, V3_COMPRESSORS[name], nbytes, exact, what)
            nbytes, exact = compressed_bytes(nbytes), False
            below.append(name)
        elif name in V3_CHECKSUMS:
            nbytes, exact = nbytes + CHECKSUM_BYTES, False
            below.append(name)
        elif name not in V3_SAME_SIZE:
            raise unbounded(name, "codec")
        out.append(codec)
    return tuple(out), nbytes


def _bound_shard(codec: ShardingCodec, spec: ZarrChunkSpec) -> tuple[ShardingCodec, int]:
    """The sharding codec with its inner chains bounded, and the most bytes a shard takes:
    its inner chunks' bound each, and its index."""
    per = codec._get_chunks_per_shard(spec)
    inner, inner_bytes = _bound_chain(codec.codecs, codec._get_chunk_spec(spec))
    index, index_bytes = _bound_chain(codec.index_codecs, codec._get_index_chunk_spec(per))
    bounded_codec = dataclasses.replace(codec, codecs=inner, index_codecs=index)
    return bounded_codec, math.prod(per) * inner_bytes + index_bytes


def _rebound(codec: Codec, codec_id: str, limit: int, exact: bool, what: str) -> Codec:
    """``codec`` as its bounded subclass, its settings (frozen dataclass fields) as they are."""
    new: Codec = object.__new__(_bounded_class(type(codec), codec_id))
    new.__dict__.update(codec.__dict__, _limit=limit, _exact=exact, _what=what)
    return new


_CORE_NAMES: tuple[tuple[type[Any], str], ...] = (
    (ZstdCodec, "zstd"),
    (BloscCodec, "blosc"),
    (GzipCodec, "gzip"),
    (Crc32cCodec, "crc32c"),
    (TransposeCodec, "transpose"),
)


def _name(codec: Codec) -> str:
    """``codec``'s name in array metadata (numcodecs' v3 codecs carry theirs)."""
    for cls, name in _CORE_NAMES:
        if isinstance(codec, cls):
            return name
    return str(getattr(codec, "codec_name", None) or type(codec).__name__)


def _raw_lzma(codec_id: str, codec: Any) -> bool:
    """An lzma codec of raw streams: their filters are in the metadata, not the stream, and
    chunk_sizes' lzma decoder reads streams that say theirs (.xz, .lzma)."""
    config = getattr(codec, "codec_config", None) or {}
    formats = (getattr(codec, "format", None), config.get("format"))
    return codec_id == "lzma" and lzma.FORMAT_RAW in formats


def _numeric(array: zarr.Array[Any]) -> bool:
    """Only numeric arrays are read: pipeline.store.inputs.array_spec refuses the others."""
    return np.dtype(array.dtype).kind in "biufc"


def _what(shape: tuple[int, ...], dtype: np.dtype[Any]) -> str:
    return f"{'x'.join(map(str, shape))} {dtype} elements"

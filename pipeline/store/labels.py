"""A coordinate of labels (strings, bytes) opened so that no chunk of it decodes past what its
labels can take.

pipeline.store.chunks.bounded caps the decodes of numeric arrays only; labels go through zarr's
own codecs, where a 10 KB zstd chunk decodes into gigabytes and an 8-byte vlen-utf8 chunk whose
header counts 2**31 labels has numcodecs fill a 16 GiB object array before it reads one. Here
each compressor decodes into at most what its chunk's labels can take (a variable-length label
at most the longest read), and the bytes reaching the labels' own codec are checked first: no
more than that, and a variable-length chunk counting exactly its chunk's labels. A layout not
covered (sharding, filters, a codec of another's) gives None: the labels are not compared.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numcodecs.abc
import numpy as np
import zarr
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy
from numpy.typing import NDArray
from zarr.abc.codec import BytesBytesCodec
from zarr.core.array import AsyncArray
from zarr.core.metadata import ArrayV2Metadata, ArrayV3Metadata

from pipeline.store.chunks.codec_bounds import (
    CHECKSUM_BYTES,
    V3_CHECKSUMS,
    V3_COMPRESSORS,
    compressed_bytes,
)
from pipeline.store.chunks.sizes import DECODERS, decode_capped

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer

CHUNK_BYTES = 64 << 20
"""The most one chunk of labels is decoded into (zarr's own largest guessed chunk): a layout
whose chunks need more is not read."""
COUNT_BYTES = 4
"""A variable-length chunk's label count, and each label's length: little-endian uint32."""
VARIABLE = ("vlen-utf8", "vlen-bytes")
"""The codecs of variable-length labels, in Zarr v3 and v2 alike."""

Decode = Callable[[NDArray[np.uint8]], NDArray[np.uint8]]


def capped(array: zarr.Array[Any], label_bytes: int) -> zarr.Array[Any] | None:
    """``array`` (labels) read-only with every decode capped, a variable-length label counted
    at ``label_bytes`` at most; None where its layout is not one capped here."""
    metadata = array.metadata
    if isinstance(metadata, ArrayV2Metadata):
        bounded: ArrayV2Metadata | ArrayV3Metadata | None = _v2(metadata, label_bytes)
    else:
        bounded = _v3(metadata, label_bytes)
    if bounded is None:
        return None
    config = array.async_array.config
    return zarr.Array(AsyncArray(metadata=bounded, store_path=array.store_path, config=config))


def _v3(metadata: ArrayV3Metadata, label_bytes: int) -> ArrayV3Metadata | None:
    names = [str(codec.to_dict()["name"]) for codec in metadata.codecs]
    if not names or names[0] not in ("bytes", *VARIABLE):
        return None  # an array-to-array codec, sharding or another's serializer first
    if any(n not in V3_COMPRESSORS and n not in V3_CHECKSUMS for n in names[1:]):
        return None
    items = math.prod(metadata.chunks)
    limits = _limits(items, metadata.dtype.to_native_dtype().itemsize, names[0], label_bytes)
    if limits is None:
        return None
    check, cap = limits
    steps: list[Any] = [metadata.codecs[0], _Step(check)]
    for name, codec in zip(names[1:], metadata.codecs[1:], strict=True):
        if name in V3_COMPRESSORS:
            codec = _Step(_capped(V3_COMPRESSORS[name], cap, f"{items} labels"))
        steps.append(codec)
    return dataclasses.replace(metadata, codecs=tuple(steps))


def _v2(metadata: ArrayV2Metadata, label_bytes: int) -> ArrayV2Metadata | None:
    filters = [str(f.codec_id) for f in metadata.filters or ()]
    compressor = metadata.compressor
    if filters not in ([], *([v] for v in VARIABLE)):
        return None
    if compressor is not None and compressor.codec_id not in DECODERS:
        return None
    items = math.prod(metadata.chunks)
    itemsize = metadata.dtype.to_native_dtype().itemsize
    limits = _limits(items, itemsize, filters[0] if filters else "bytes", label_bytes)
    if limits is None:
        return None
    check, cap = limits
    # the last filter is the first decoded: the check runs right before the labels' codec
    steps: tuple[Any, ...] = (*(metadata.filters or ()), _V2Step(None, check))
    if compressor is not None:
        capped_decode = _capped(str(compressor.codec_id), cap, f"{items} labels")
        compressor = _V2Step(compressor, capped_decode)
    return dataclasses.replace(metadata, filters=steps, compressor=compressor)


def _limits(items: int, itemsize: int, codec: str, label_bytes: int) -> tuple[Decode, int] | None:
    """The check on a chunk's bytes before its labels' ``codec`` decodes them, and the most
    bytes a compressor may decode one into; None where a chunk needs more than CHUNK_BYTES."""
    if codec == "bytes":
        least = most = items * itemsize
    else:
        least = COUNT_BYTES * (1 + items)  # every label empty
        most = least + items * label_bytes
    if least > CHUNK_BYTES:
        return None
    cap = min(most, CHUNK_BYTES)

    def check(data: NDArray[np.uint8]) -> NDArray[np.uint8]:
        if data.size > cap:
            raise ValueError(f"a chunk of {data.size:,} bytes where its labels take {cap:,}")
        if codec != "bytes":
            counted = int.from_bytes(data[:COUNT_BYTES].tobytes(), "little")
            if counted != items or data.size < least:
                raise ValueError(
                    f"a chunk of {data.size:,} bytes counting {counted:,} labels where its "
                    f"chunk holds {items:,}"
                )
        return data

    # checksums and a compressor's slack between the labels and an outer compressor
    return check, compressed_bytes(cap) + 2 * CHECKSUM_BYTES


def _capped(codec_id: str, cap: int, what: str) -> Decode:
    def decode(data: NDArray[np.uint8]) -> NDArray[np.uint8]:
        return decode_capped(codec_id, data, cap, what)

    return decode


@dataclass(frozen=True)
class _Step(BytesBytesCodec):
    """A Zarr v3 bytes-to-bytes step that decodes through ``decode`` (read only)."""

    decode_bytes: Decode
    is_fixed_size = False

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        data = chunk_bytes.as_numpy_array().reshape(-1).view(np.uint8)
        out = await asyncio.to_thread(self.decode_bytes, data)
        return chunk_spec.prototype.buffer.from_array_like(out)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("read only")


class _V2Step(numcodecs.abc.Codec):  # type: ignore[misc]
    """A Zarr v2 compressor (``inner``'s settings) or filter (none) decoding through
    ``decode`` (read only)."""

    codec_id = "labels"  # zarr looks for one on the class; a compressor's own on the instance

    def __init__(self, inner: Any, decode: Decode) -> None:
        if inner is not None:
            self.codec_id = str(inner.codec_id)
        self._inner, self._decode = inner, decode

    def get_config(self) -> dict[str, Any]:
        return dict(self._inner.get_config()) if self._inner else {"id": self.codec_id}

    def encode(self, buf: Any) -> Any:
        raise NotImplementedError("read only")

    def decode(self, buf: Any, out: Any = None) -> Any:
        decoded = self._decode(ensure_contiguous_ndarray(buf).reshape(-1).view(np.uint8))
        return decoded if out is None else ndarray_copy(decoded, out)

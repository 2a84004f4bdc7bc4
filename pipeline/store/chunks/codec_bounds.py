"""How many bytes each codec can make of its input, by name: what caps an input's decodes and
the stored objects read for it (pipeline.store.chunks.bounded). Numbers and names only.

A codec missing here has a decoded size nothing here can bound (a third-party codec, a
compressor the standard decoders in pipeline.store.chunks.sizes do not cover): an array using it
is refused at open, naming it, rather than decoded without a limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.errors import InputError

COMPRESSOR_SLACK_BYTES = 64 << 10
"""Added to every compressor's worst case (headers, block tables, a Blosc chunk's offsets)."""
CHECKSUM_BYTES = 64
"""What a checksum codec appends at most (crc32c, crc32 and adler32 4 bytes, Fletcher-32 4,
Jenkins lookup3 4 and its prefix)."""

V3_COMPRESSORS = {
    "zstd": "zstd",
    "blosc": "blosc",
    "gzip": "gzip",
    **{f"numcodecs.{c}": c for c in ("zstd", "blosc", "lz4", "zlib", "gzip", "bz2", "lzma")},
}
"""Zarr v3 bytes-to-bytes compressors: codec name -> the numcodecs id decoding its chunks."""
CHECKSUM_IDS = ("crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3")
"""numcodecs' checksum codecs: decoding only removes what they append."""
V3_CHECKSUMS = frozenset({"crc32c", *(f"numcodecs.{c}" for c in CHECKSUM_IDS)})
V3_SAME_SIZE = frozenset({"numcodecs.shuffle"})
"""Bytes-to-bytes codecs that reorder their input's bytes."""
ARRAY_TO_ARRAY_IDS = ("delta", "bitround", "fixedscaleoffset", "quantize", "packbits", "astype")
V3_ARRAY_TO_ARRAY = frozenset({"transpose", *(f"numcodecs.{c}" for c in ARRAY_TO_ARRAY_IDS)})
"""Array-to-array codecs: elements in, as many elements out (their dtype as zarr resolves
it), so their decoded size follows from their input's."""
V2_RECAST = {
    "delta": ("dtype", "astype"),
    "fixedscaleoffset": ("dtype", "astype"),
    "quantize": ("dtype", "astype"),
    "astype": ("decode_dtype", "encode_dtype"),
}
"""Zarr v2 filters storing each element as another dtype: (its decoded dtype's attribute,
its encoded dtype's)."""
V2_SAME_SIZE = frozenset({"bitround", "shuffle"})
V2_CHECKSUMS = frozenset(CHECKSUM_IDS)


def compressed_bytes(nbytes: int) -> int:
    """The most bytes ``nbytes`` can take once compressed: 1% more (zstd, Blosc, LZ4,
    deflate, bz2 and lzma all stay under it for incompressible data) and
    COMPRESSOR_SLACK_BYTES."""
    return nbytes + nbytes // 100 + COMPRESSOR_SLACK_BYTES


def v2_filtered_bytes(filters: tuple[Any, ...], nbytes: int) -> int:
    """The most bytes ``nbytes`` of elements can take through Zarr v2 ``filters`` (applied in
    order when written): what the compressor after them can decode into."""
    for f in filters:
        name = str(getattr(f, "codec_id", type(f).__name__))
        if name in V2_RECAST:
            decoded, encoded = (np.dtype(getattr(f, a)).itemsize for a in V2_RECAST[name])
            nbytes = -(-nbytes // decoded) * encoded
        elif name == "packbits":  # eight booleans a byte, and a byte saying how many
            nbytes = nbytes // 8 + 2
        elif name in V2_CHECKSUMS:
            nbytes += CHECKSUM_BYTES
        elif name not in V2_SAME_SIZE:
            raise unbounded(name, "filter")
    return nbytes


def unbounded(codec: str, role: str) -> InputError:
    """The refusal of an array stored through ``codec`` (its ``role``: filter, compressor,
    codec), which nothing here bounds."""
    return InputError(
        f"its {role} {codec!r} decodes into a size that cannot be bounded before decoding "
        "(bounded here: zstd, blosc, lz4, gzip, zlib, bz2 and lzma compressors, dtype, delta, "
        "scale-offset, quantize, bitround, shuffle and checksum filters, sharding), so a "
        "hostile chunk could take any amount of memory; rewrite the array with zstd, e.g. "
        "zarr.create_array(NEW, data=zarr.open_array(OLD)[...], compressors=zarr.codecs."
        "ZstdCodec())"
    )

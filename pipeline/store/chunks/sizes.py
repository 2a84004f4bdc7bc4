"""A stored chunk decoded into exactly its own size, or refused (numcodecs and the standard
library's decompressors, no zarr).

numcodecs allocates what a chunk's header declares and decodes it all: a 66 KB zstd frame can
declare, and hold, 2 GiB; Blosc's and LZ4's headers declare a size the same way; zstd frames
that declare nothing, gzip, zlib, bz2 (785 B can hold 3.1 GiB) and lzma grow their output until
the data ends. Here the declared size is read first (zstd's frame headers, Blosc's header,
numcodecs' LZ4 prefix) and a chunk declaring other than its shape's bytes is refused undecoded;
then it is decoded into a buffer of exactly that size, which also stops one that declares
nothing at that size (the streams are decoded with a limit on their output). A codec further
from the elements than the first (a chain of compressors, a Zarr v2 compressor after filters)
decodes into at most the bytes the codec after it can need (``decode_capped``).
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

import numcodecs.blosc
import numcodecs.lz4
import numcodecs.zstd
import numpy as np
from numpy.typing import NDArray

from pipeline.cputime import LEDGER
from pipeline.errors import ChunkSizeError
from pipeline.store.chunks.zstd_frames import Frames, declared_size, first_frame_size


def declared_bytes(codec: str, data: Frames, expected: int) -> int | None:
    """The bytes ``data``, stored with ``codec``, declares it decodes to (None: it declares
    none); for zstd, any number above ``expected`` once the frames' total passes it."""
    view = _bytes(data)
    if codec == "zstd":
        first = first_frame_size(view)
        return first if first == expected else declared_size(view, expected)
    if codec == "blosc" and len(view) >= 16:  # version, flags, typesize, then nbytes
        return int.from_bytes(view[4:8].tobytes(), "little")
    if codec == "lz4" and len(view) >= 4:  # numcodecs' prefix
        return int.from_bytes(view[:4].tobytes(), "little", signed=True)
    return None


def check_declared(codec: str, data: Frames, expected: int, what: str) -> int | None:
    """Refuse ``data`` declaring other than ``expected`` bytes (``what``: the chunk's shape
    and dtype, for the message); returns what it declares (None: nothing)."""
    declared = declared_bytes(codec, data, expected)
    if declared is not None and declared != expected:
        raise _refused(codec, declared, expected, what)
    return declared


def decode_exact(
    codec: str, data: Frames, expected: int, what: str, into: NDArray[np.uint8] | None = None
) -> NDArray[np.uint8]:
    """``data`` stored with ``codec`` decoded into a new buffer of exactly ``expected`` bytes
    (or into ``into``, C-contiguous bytes of that size: no copy after), or refused
    (ChunkSizeError) without decoding more than that."""
    declared = check_declared(codec, data, expected, what)
    out = into if into is not None else np.empty(expected, dtype=np.uint8)
    if out.nbytes != expected or not out.flags.c_contiguous:
        raise ValueError(f"decode into {out.nbytes:,} bytes (contiguous: {out.flags.c_contiguous})"
                         f", not {expected:,}")  # fmt: skip
    view = _bytes(data)
    try:
        with LEDGER.measure("decode"):
            DECODERS[codec](view, out)
    except ValueError as e:  # zstd: frames past the first declare more (numcodecs refused)
        total = declared_size(view, 2**63) if codec == "zstd" else None
        if total is None:
            raise
        raise _refused(codec, total, expected, what) from e
    except _TooLong as e:
        raise _endless(codec, expected, what) from e
    except RuntimeError as e:  # numcodecs' zstd stopped a frame that declares no size
        if declared is not None or "too small" not in str(e):
            raise
        raise _endless(codec, expected, what) from e
    return out


def _refused(codec: str, declared: int, expected: int, what: str) -> ChunkSizeError:
    return ChunkSizeError(
        f"a stored {codec} chunk declares {declared:,} bytes but its {what} hold "
        f"{expected:,}; refused before decoding",
        declared,
        expected,
    )


def _endless(codec: str, expected: int, what: str) -> ChunkSizeError:
    return ChunkSizeError(
        f"a stored {codec} chunk declares no size and decodes past the {expected:,} bytes "
        f"its {what} hold; refused there",
        None,
        expected,
    )


class _TooLong(Exception):
    """A stream went on past the buffer."""


def decode_capped(codec: str, data: Frames, cap: int, what: str) -> NDArray[np.uint8]:
    """``data`` stored with ``codec`` decoded into a new buffer of at most ``cap`` bytes, or
    refused (ChunkSizeError) without decoding past that: for a codec whose output is the input
    of another codec (``what``: that stage, for the message), whose exact size only that one
    knows."""
    view = _bytes(data)
    if codec in STREAMS:
        out = np.empty(cap, dtype=np.uint8)  # pages untouched past what is decoded
        try:
            with LEDGER.measure("decode"):
                filled = STREAMS[codec](view, out)
        except _TooLong as e:
            raise ChunkSizeError(
                f"a stored {codec} chunk decodes past the {cap:,} bytes {what} can need; "
                "refused there",
                None,
                cap,
            ) from e
        return out[:filled]
    declared = declared_size(view, cap) if codec == "zstd" else declared_bytes(codec, view, cap)
    if declared is None:
        raise ChunkSizeError(
            f"a stored {codec} chunk declares no size where it decodes into {what}, which "
            f"can need up to {cap:,} bytes (only the codec next to the elements may); refused "
            "undecoded",
            None,
            cap,
        )
    if declared > cap:
        raise ChunkSizeError(
            f"a stored {codec} chunk declares {declared:,} bytes where it decodes into {what}, "
            f"which can need at most {cap:,}; refused before decoding",
            declared,
            cap,
        )
    return decode_exact(codec, view, declared, what)


Stream = Callable[[NDArray[np.uint8], NDArray[np.uint8]], int]
"""Decodes a stored chunk into the start of ``out`` and returns how many bytes it filled;
_TooLong as soon as it would fill more."""


def _streamed(new: Callable[[], Any], members: bool, lenient: bool = False) -> Stream:
    """A stream decoder over ``new()`` decompressors: one stream, or (``members``) streams
    one after another, each asked for one byte more than ``out`` has left. ``lenient``: data
    after the first stream that is no stream ends the chunk (bz2's and lzma's own decompress
    functions read so)."""

    def decode(data: NDArray[np.uint8], out: NDArray[np.uint8]) -> int:
        filled, rest = 0, memoryview(np.ascontiguousarray(data).data).cast("B")
        while len(rest):
            stream = new()
            try:
                got = stream.decompress(rest, len(out) - filled + 1)
            except (OSError, lzma.LZMAError):
                if not (lenient and filled):
                    raise
                break
            if filled + len(got) > len(out):
                raise _TooLong(len(out))
            out[filled : filled + len(got)] = np.frombuffer(got, dtype=np.uint8)
            filled += len(got)
            if not stream.eof:
                raise RuntimeError("the compressed stream is cut short")
            rest = memoryview(stream.unused_data) if members else memoryview(b"")
        return filled

    return decode


def _filling(stream: Stream) -> Callable[[NDArray[np.uint8], NDArray[np.uint8]], None]:
    """``stream``, which must fill ``out`` exactly."""

    def decode(data: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
        filled = stream(data, out)
        if filled != len(out):
            raise RuntimeError(f"decodes to {filled:,} bytes, not {len(out):,}")

    return decode


LZMA_MEMORY_BYTES = 128 * 2**20
"""What an lzma stream's decoder may take (its dictionary, which the stream's header sets):
preset 9's 64 MiB dictionary twice over; a header asking for more is refused, not obeyed."""


def _lzma() -> lzma.LZMADecompressor:
    # .xz and .lzma alike; raw streams (their filters in the metadata) are refused at open
    return lzma.LZMADecompressor(lzma.FORMAT_AUTO, memlimit=LZMA_MEMORY_BYTES)


STREAMS: dict[str, Stream] = {
    "gzip": _streamed(lambda: zlib.decompressobj(31), members=True),
    "zlib": _streamed(lambda: zlib.decompressobj(15), members=False),
    "bz2": _streamed(bz2.BZ2Decompressor, members=True, lenient=True),
    "lzma": _streamed(_lzma, members=True, lenient=True),
}
"""Per numcodecs codec id whose chunks declare no size: decode them, never past ``out``."""

DECODERS: dict[str, Callable[[NDArray[np.uint8], NDArray[np.uint8]], object]] = {
    "zstd": numcodecs.zstd.decompress,
    "blosc": numcodecs.blosc.decompress,
    "lz4": numcodecs.lz4.decompress,
    **{codec: _filling(stream) for codec, stream in STREAMS.items()},
}
"""Per numcodecs codec id: decode into exactly ``out``, never past it."""


def _bytes(data: Frames) -> NDArray[np.uint8]:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)

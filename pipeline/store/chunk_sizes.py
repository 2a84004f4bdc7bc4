"""A stored chunk decoded into exactly its own size, or refused (numcodecs and zlib, no zarr).

numcodecs allocates what a chunk's header declares and decodes it all: a 66 KB zstd frame can
declare, and hold, 2 GiB; Blosc's and LZ4's headers declare a size the same way; zstd frames
that declare nothing, gzip and zlib grow their output until the data ends. Here the declared
size is read first (zstd's frame headers, Blosc's header, numcodecs' LZ4 prefix) and a chunk
declaring other than its shape's bytes is refused undecoded; then it is decoded into a buffer of
exactly that size, which also stops one that declares nothing at that size.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numcodecs.blosc
import numcodecs.lz4
import numcodecs.zstd
import numpy as np
from numpy.typing import NDArray

from pipeline.cputime import LEDGER
from pipeline.errors import ChunkSizeError
from pipeline.store.zstd_frames import Frames, declared_size, first_frame_size


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


def _inflate(wbits: int) -> Callable[[NDArray[np.uint8], NDArray[np.uint8]], None]:
    """zlib (15) or gzip (31, members one after another) decoded into ``out``, stopping one
    byte past it."""

    def decode(data: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
        filled, rest = 0, data.tobytes()
        while rest:
            stream = zlib.decompressobj(wbits)
            got = stream.decompress(rest, len(out) - filled + 1)
            if filled + len(got) > len(out):
                raise _TooLong(len(out))
            out[filled : filled + len(got)] = np.frombuffer(got, dtype=np.uint8)
            filled += len(got)
            if not stream.eof:
                raise RuntimeError("the compressed stream is cut short")
            rest = stream.unused_data if wbits > 15 else b""
        if filled != len(out):
            raise RuntimeError(f"decodes to {filled:,} bytes, not {len(out):,}")

    return decode


DECODERS: dict[str, Callable[[NDArray[np.uint8], NDArray[np.uint8]], object]] = {
    "zstd": numcodecs.zstd.decompress,
    "blosc": numcodecs.blosc.decompress,
    "lz4": numcodecs.lz4.decompress,
    "gzip": _inflate(31),
    "zlib": _inflate(15),
}
"""Per numcodecs codec id: decode into exactly ``out``, never past it."""


def _bytes(data: Frames) -> NDArray[np.uint8]:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)

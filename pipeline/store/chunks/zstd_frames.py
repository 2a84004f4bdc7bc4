"""What a zstd chunk says it holds, read from its frame headers without decoding (pure).

A 66 KB frame can declare, and hold, 2 GiB; numcodecs allocates what the frames declare before
decompressing. Reading the declared size first (RFC 8878 §3.1.1) lets a chunk be refused when
it claims more than its own shape holds, before a byte is decompressed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

Frames = bytes | NDArray[Any]
"""Stored bytes, or a contiguous array of them."""

MAGIC = 0xFD2FB528
"""A zstd frame's first four bytes, little-endian."""
SKIPPABLE = 0x184D2A50
"""Skippable frames' magic, with any low nibble: four bytes of length, then that many."""
_FCS_BYTES = (1, 2, 4, 8)  # Frame_Content_Size field size per flag (flag 0: 1 if single segment)
_DID_BYTES = (0, 1, 2, 4)  # Dictionary_ID field size per flag


def first_frame_size(data: Frames) -> int | None:
    """The content size the first frame declares; None when it declares none or ``data`` does
    not start with a zstd frame."""
    header = _header(_bytes(data), 0)
    return None if header is None else header[0]


def declared_size(data: Frames, limit: int) -> int | None:
    """The content size all frames in ``data`` declare together, or a number above ``limit``
    as soon as the total passes it (the rest is not read); None when a frame declares none or
    ``data`` is not one or more whole zstd frames."""
    view = _bytes(data)
    total, offset = 0, 0
    while offset < len(view):
        if offset + 8 <= len(view) and _u32(view, offset) & 0xFFFFFFF0 == SKIPPABLE:
            offset += 8 + _u32(view, offset + 4)
            continue
        header = _header(view, offset)
        if header is None or header[0] is None:
            return None
        total += header[0]
        if total > limit:
            return total
        end = _frame_end(view, header[1], header[2])
        if end is None:
            return None
        offset = end
    return total if offset == len(view) and len(view) else None


def _header(view: NDArray[np.uint8], offset: int) -> tuple[int | None, int, bool] | None:
    """(declared content size or None, where the first block starts, has a checksum) of the
    frame at ``offset``; None when there is no well-formed frame header there."""
    if offset + 5 > len(view) or _u32(view, offset) != MAGIC:
        return None
    descriptor = int(view[offset + 4])
    single_segment = bool(descriptor & 0x20)
    if descriptor & 0x08:  # reserved bit: not a frame this format defines
        return None
    fcs_flag = descriptor >> 6
    fcs_bytes = _FCS_BYTES[fcs_flag] if fcs_flag or single_segment else 0
    start = offset + 5 + (0 if single_segment else 1) + _DID_BYTES[descriptor & 0x03]
    end = start + fcs_bytes
    if end > len(view):
        return None
    size = _uint(view, start, fcs_bytes) if fcs_bytes else None
    if fcs_bytes == 2 and size is not None:
        size += 256  # the two-byte field is stored minus 256
    return size, end, bool(descriptor & 0x04)


def _frame_end(view: NDArray[np.uint8], offset: int, checksum: bool) -> int | None:
    """Where the frame whose blocks start at ``offset`` ends; None when it is cut short."""
    while offset + 3 <= len(view):
        header = _uint(view, offset, 3)
        kind, size = (header >> 1) & 0x03, header >> 3
        if kind == 3:  # reserved block type
            return None
        offset += 3 + (1 if kind == 1 else size)  # an RLE block stores one byte
        if header & 0x01:  # the last block
            offset += 4 if checksum else 0
            return offset if offset <= len(view) else None
    return None


def _u32(view: NDArray[np.uint8], offset: int) -> int:
    return _uint(view, offset, 4)


def _uint(view: NDArray[np.uint8], offset: int, size: int) -> int:
    """The little-endian unsigned integer of ``size`` bytes at ``offset``."""
    return int.from_bytes(view[offset : offset + size].tobytes(), "little")


def _bytes(data: Frames) -> NDArray[np.uint8]:
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)

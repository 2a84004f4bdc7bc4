"""A Gram product's writes: tile (i, j), i <= j, is written with its mirror.

Only tiles on and above the diagonal are tasks. Tile (i, j), i < j, is written at (i, j) and
transposed at (j, i), chunks no other task writes; a diagonal tile's upper triangle is kept
and mirrored below it, so G equals Gᵀ bitwise. Bands of rows arrive in order (the last K
panel's write bands); band [r0, r1) of a diagonal tile writes its rows from column r0 on (the
square at r0 symmetrised) and the mirror of its part right of that square below it: whole
chunks each, since bands and the grid are made of whole (square) chunks.

The journal's crc32 covers the upper part as written, band by band (a whole off-diagonal
tile; a diagonal tile's rows from their band's first column on); the mirror is checked on
--resume by re-deriving it: it must be the exact transpose (``stored_checksum``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.plan.matmul import row_bands
from pipeline.plan.spec import Tile

Reader = Callable[[tuple[int, int], tuple[int, int]], NDArray[Any] | None]
"""OUT's block ``[rows, cols]`` as written, C-ordered (None: it cannot be read)."""


def is_diagonal(symmetric: bool, tile: Tile) -> bool:
    return symmetric and tile.index[0] == tile.index[1]


def write_band(
    out: Any, tile: Tile, band: tuple[int, int], data: NDArray[Any], crc: int = 0
) -> int:
    """Write rows ``band`` of ``tile`` (``data``, in OUT's dtype) and their mirror; returns
    ``crc`` chained over the upper part written."""
    r0, r1 = band
    top, left = tile.rows[0] + r0, tile.cols[0]
    if tile.index[0] != tile.index[1]:
        if data.size:
            out[top : top + r1 - r0, left : tile.cols[1]] = data
            out[left : tile.cols[1], top : top + r1 - r0] = np.ascontiguousarray(data.T)
        return zlib.crc32(np.ascontiguousarray(data).data, crc)
    upper = upper_part(data, r0)
    if upper.size:
        out[top : top + r1 - r0, left + r0 : tile.cols[1]] = upper
    below = data[:, r1:]
    if below.size:  # rows below this band, columns of its square
        out[left + r1 : tile.cols[1], top : top + r1 - r0] = np.ascontiguousarray(below.T)
    return zlib.crc32(upper.data, crc)


def write_tile(out: Any, tile: Tile, data: NDArray[Any], block_rows: int | None) -> int:
    """The whole tile at once (after a split-K reduction), band by band as ``write_band``
    would; returns the crc32 the journal records."""
    crc = 0
    for r0, r1 in row_bands(tile.shape[0], block_rows):
        crc = write_band(out, tile, (r0, r1), data[r0:r1], crc)
    return crc


def upper_part(band: NDArray[Any], r0: int) -> NDArray[Any]:
    """A diagonal tile's band ``[r0, r0 + rows)``, from column r0 on, with its square made
    symmetric from its upper triangle (a copy; bitwise, -0.0 and NaN payloads kept)."""
    h = band.shape[0]
    upper = np.array(band[:, r0:], order="C")
    square = upper[:, :h]
    keep = np.triu(np.ones((h, h), dtype=bool))
    upper[:, :h] = np.where(keep, square, square.T)
    return upper


def stored_checksum(read: Reader, tile: Tile, block_rows: int | None) -> int | None:
    """--resume: the crc32 of a written tile as the journal defines it, or None when its
    mirror is not its exact transpose, or either cannot be read (then it is computed again).
    ``read(rows, cols)``: OUT's block as written, C-ordered, or None."""
    data = read(tile.rows, tile.cols)
    mirror = data if tile.index[0] == tile.index[1] else read(tile.cols, tile.rows)
    if data is None or mirror is None or not same_bits(data, mirror.T):
        return None
    if tile.index[0] != tile.index[1]:
        return zlib.crc32(data.data)
    crc = 0
    for b0, b1 in row_bands(tile.shape[0], block_rows):
        crc = zlib.crc32(np.ascontiguousarray(data[b0:b1, b0:]).data, crc)
    return crc


def same_bits(x: NDArray[Any], y: NDArray[Any]) -> bool:
    """Bitwise equality (NaN equals the same NaN, -0.0 differs from 0.0)."""
    if x.shape != y.shape:
        return False
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    return x.tobytes() == y.tobytes()

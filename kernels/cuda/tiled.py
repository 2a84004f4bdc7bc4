"""The seed-fixed tiled kernel: the numba docs' shared-memory matmul with its bugs fixed.

One thread per output element, TILE x TILE blocks, square A and B tiles staged in shared memory.
It is the readable reference; `cuda_blocked` holds the register-blocked default.

Fixes against the docs example: loads are bounds-checked and zero-filled (ragged shapes), there is
no early return (every thread reaches every barrier), the K loop runs ceil(K / TILE) times from K
(not gridDim), the accumulator has the element type (`tmp = 0.` made float32 math float64), and
the kernel accumulates (C += A @ B) so the host can stream K panels into one device buffer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels.constants import GPU_DTYPES

TILE = 16
"""Tile edge in elements (threads per block = TILE**2). Read at call time: tests lower it."""

FLOAT_DTYPES = tuple(np.dtype(d) for d in GPU_DTYPES)

# numba.cuda, bound on first use: kernels must see it as a module global, because the simulator
# swaps in its fake module by rewriting globals (closures would keep the real one).
cuda: Any = None


def check_float_dtype(dtype: np.dtype | type) -> np.dtype:
    """The dtype as numpy.dtype if it is float32 or float64, else TypeError."""
    dt = np.dtype(dtype)
    if dt not in FLOAT_DTYPES:
        raise TypeError(
            f"CUDA kernels support float32 and float64, got {dt}; cast the inputs with "
            "astype(numpy.float32) or astype(numpy.float64)"
        )
    return dt


def make_tiled_kernel(dtype: np.dtype | type, tile: int | None = None) -> Callable[..., None]:
    """Plain Python kernel `kernel(a, b, c)` doing c += a @ b; wrap it with cuda.jit.

    `tile` defaults to the module's TILE at call time.
    """
    return _make_tiled_kernel(check_float_dtype(dtype), TILE if tile is None else int(tile))


@functools.cache
def _make_tiled_kernel(dtype: np.dtype, tile: int) -> Callable[..., None]:
    global cuda
    import numba.cuda
    from numba import from_dtype

    cuda = numba.cuda
    elem = from_dtype(dtype)  # float32 or float64: the accumulator and tile type

    def tiled_matmul(a, b, c):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array((tile, tile), elem)
        sb = cuda.shared.array((tile, tile), elem)
        tx = cuda.threadIdx.x  # along columns of C: adjacent threads read adjacent addresses
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * tile + ty
        col = cuda.blockIdx.x * tile + tx
        m = c.shape[0]
        n = c.shape[1]
        k = a.shape[1]
        acc = elem(0)  # typed: a bare 0. would make every add float64
        for step in range((k + tile - 1) // tile):
            kk = step * tile
            # Out-of-range threads still load (zeros) and still reach both barriers.
            if row < m and kk + tx < k:
                sa[ty, tx] = a[row, kk + tx]
            else:
                sa[ty, tx] = elem(0)
            if kk + ty < k and col < n:
                sb[ty, tx] = b[kk + ty, col]
            else:
                sb[ty, tx] = elem(0)
            # Both tiles must be complete before any thread reads them.
            cuda.syncthreads()
            for i in range(tile):
                acc += sa[ty, i] * sb[i, tx]
            # Every thread must be done reading before the next step overwrites the tiles.
            cuda.syncthreads()
        if row < m and col < n:
            c[row, col] += acc

    tiled_matmul.__name__ = f"tiled_matmul_{dtype.name}"
    return tiled_matmul

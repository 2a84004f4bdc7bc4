"""The tensor-core kernels' tile shape (kernels.cuda.tensor.kernel) and the PTX ISA's fragment
layout of ``mma.m16n8k8`` with .tf32 operands: pure numbers, shared by the source generator and the
NumPy emulation that checks it.

Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32): with ``g = lane >> 2``
and ``t = lane & 3``, a lane holds A (16 x 8, row-major) elements a0..a3 at (g, t), (g + 8, t),
(g, t + 4), (g + 8, t + 4); B (8 x 8, "col") elements b0, b1 at (t, g), (t + 4, g); and
C/D (16 x 8, float32) elements c0..c3 at (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MMA_M, MMA_N, MMA_K = 16, 8, 8
"""Shape of one mma.sync.aligned.m16n8k8 (rows of A and C, columns of B and C, depth)."""
WARP = 32
RUN = 4
"""Consecutive elements one thread moves from a row of A (along K) or of B (along N) per load."""
PRECISIONS = ("tf32", "3xtf32")
PASSES = {"tf32": 1, "3xtf32": 3}
"""mma per (m-tile, n-tile, k-step): 3xTF32 adds small.big and big.small to big.big."""


def a_fragment(lane: int, reg: int) -> tuple[int, int]:
    """(row, col) in the 16 x 8 A tile of register ``reg`` (0..3) of ``lane``."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (reg & 1), t + 4 * (reg >> 1)


def b_fragment(lane: int, reg: int) -> tuple[int, int]:
    """(row, col) in the 8 x 8 B tile of register ``reg`` (0..1) of ``lane``."""
    g, t = lane >> 2, lane & 3
    return t + 4 * reg, g


def c_fragment(lane: int, reg: int) -> tuple[int, int]:
    """(row, col) in the 16 x 8 C tile of accumulator ``reg`` (0..3) of ``lane``."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (reg >> 1), 2 * t + (reg & 1)


@dataclass(frozen=True)
class MmaSpec:
    """Tile shape of a tensor-core kernel (all sizes in elements; powers of two)."""

    precision: Literal["tf32", "3xtf32"]
    block_m: int = 128
    block_n: int = 128
    block_k: int = 16
    warps_m: int = 2
    """Warps along the block's rows; each covers block_m / warps_m rows."""
    warps_n: int = 4
    min_blocks: int = 2
    """Blocks per SM the register allocation must allow (launch bounds)."""
    a_pad: int = 4
    """A is stored row-major with pitch block_k + a_pad: a pitch of 4 x odd words puts the 8
    rows x 4 columns of one fragment load on 32 distinct banks."""
    b_pad: int = 8
    """B is stored row-major with pitch block_n + b_pad (8 mod 32 words): 4 rows x 8 columns
    of one fragment load on 32 distinct banks."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        sizes = (self.block_m, self.block_n, self.block_k, self.warps_m, self.warps_n)
        if any(s <= 0 or s & (s - 1) for s in sizes):
            raise ValueError(f"tile sizes must be powers of two, got {self}")
        if self.warp_m % MMA_M or self.warp_n % MMA_N or self.block_k % MMA_K:
            raise ValueError(f"a warp tile of {self.warp_m}x{self.warp_n} is not whole mma tiles")
        if (self.block_k + self.a_pad) % 8 != 4 or (self.block_n + self.b_pad) % 32 != 8:
            raise ValueError(f"pitches {self.a_pitch}, {self.b_pitch} give bank conflicts")
        if self.a_loads % RUN or self.b_loads % RUN or self.a_loads == 0 or self.b_loads == 0:
            raise ValueError(f"{self} does not split its tiles over {self.threads} threads")

    @property
    def threads(self) -> int:
        return WARP * self.warps_m * self.warps_n

    @property
    def warp_m(self) -> int:
        return self.block_m // self.warps_m

    @property
    def warp_n(self) -> int:
        return self.block_n // self.warps_n

    @property
    def m_tiles(self) -> int:
        """mma tiles along a warp's rows."""
        return self.warp_m // MMA_M

    @property
    def n_tiles(self) -> int:
        return self.warp_n // MMA_N

    @property
    def k_steps(self) -> int:
        """mma k-steps per K tile."""
        return self.block_k // MMA_K

    @property
    def passes(self) -> int:
        return PASSES[self.precision]

    @property
    def mma_per_k_tile(self) -> int:
        """mma.sync one warp issues per K tile: the HMMA count the static gate expects."""
        return self.m_tiles * self.n_tiles * self.k_steps * self.passes

    @property
    def a_pitch(self) -> int:
        return self.block_k + self.a_pad

    @property
    def b_pitch(self) -> int:
        return self.block_n + self.b_pad

    @property
    def a_loads(self) -> int:
        """A elements each thread prefetches per K tile."""
        return self.block_m * self.block_k // self.threads

    @property
    def b_loads(self) -> int:
        return self.block_k * self.block_n // self.threads

    @property
    def planes(self) -> int:
        """Shared copies of each tile: the value (tf32), or its big and small parts (3xtf32)."""
        return 1 if self.precision == "tf32" else 2

    @property
    def shared_bytes(self) -> int:
        """Static shared memory: double-buffered A and B tiles, per plane, float32 words."""
        words = 2 * (self.block_m * self.a_pitch + self.block_k * self.b_pitch)
        return 4 * words * self.planes

    @property
    def launch_bounds(self) -> tuple[int, int]:
        return (self.threads, self.min_blocks)


TF32_SPEC = MmaSpec("tf32")
"""128 x 128 x 16 blocks, 8 warps of 64 x 32: 32 mma per warp per K tile, 37 KiB shared."""
X3_SPEC = MmaSpec("3xtf32", block_k=8)
"""K tiles of 8 keep both planes (big, small) of the double buffer within 48 KiB (41 KiB)."""

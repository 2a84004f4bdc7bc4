"""The tile shape of a register-blocked kernel (kernels.cuda.blocked.kernel): a frozen spec that the
source generator and the launch math both read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from kernels.cuda.tiled import check_float_dtype


@dataclass(frozen=True)
class BlockedSpec:
    """Tile shape of a register-blocked kernel (all sizes in elements, powers of two)."""

    dtype: str
    """"float32" or "float64"."""
    block_m: int
    block_n: int
    block_k: int
    threads: int
    frag: int = 4
    """Edge of one of a thread's 2 x 2 output fragments."""
    pad: int = 4
    """Extra elements per row of the transposed A tile: spreads the transposed stores on banks."""
    load_vec: int = 4
    """Consecutive elements one thread moves from global memory per row segment."""
    min_blocks: int = 1
    """Blocks per SM the register allocation must allow (launch bounds)."""
    index_math: Literal["shift", "divmod"] = "shift"
    acc_init: Literal["typed", "float64"] = "typed"

    def __post_init__(self) -> None:
        check_float_dtype(np.dtype(self.dtype))
        sizes = (self.block_m, self.block_n, self.block_k, self.threads, self.frag, self.load_vec)
        if any(s <= 0 or s & (s - 1) for s in sizes):
            raise ValueError(f"tile sizes must be powers of two, got {self}")
        if self.thread_rows * self.thread_cols != self.threads:
            raise ValueError(
                f"{self.threads} threads do not cover a {self.block_m}x{self.block_n} tile"
            )
        for what, elems in (("A", self.block_m * self.block_k), ("B", self.block_k * self.block_n)):
            if elems % (self.threads * self.load_vec):
                raise ValueError(f"{what} tile of {elems} elements does not split over the threads")

    @property
    def thread_cols(self) -> int:
        return self.block_n // (2 * self.frag)

    @property
    def thread_rows(self) -> int:
        return self.block_m // (2 * self.frag)

    @property
    def launch_bounds(self) -> tuple[int, int]:
        """(threads per block, blocks per SM): ptxas fits registers to 65536 / (product)."""
        return (self.threads, self.min_blocks)

    @property
    def a_pitch(self) -> int:
        return self.block_m + self.pad

    @property
    def a_loads(self) -> int:
        """A elements each thread prefetches per K tile."""
        return self.block_m * self.block_k // self.threads

    @property
    def b_loads(self) -> int:
        return self.block_k * self.block_n // self.threads

    @property
    def shared_bytes(self) -> int:
        words = 2 * self.block_k * (self.a_pitch + self.block_n)
        return words * np.dtype(self.dtype).itemsize


# Two blocks of 256 threads per SM caps ptxas at 128 registers per thread.
F32_SPEC = BlockedSpec("float32", block_m=128, block_n=128, block_k=8, threads=256, min_blocks=2)
# 8 x 8 doubles per thread (128 accumulator registers) on 64 threads: 8 DFMA per 128-bit load.
F64_SPEC = BlockedSpec("float64", block_m=64, block_n=64, block_k=8, threads=64)

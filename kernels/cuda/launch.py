"""Launch math of the CUDA kernels: grids and blocks as pure functions, no numba import."""

from __future__ import annotations

from dataclasses import dataclass

MAX_GRID_Y = 65535
"""CUDA's limit on gridDim.y (and z); gridDim.x allows 2**31 - 1."""


@dataclass(frozen=True)
class LaunchConfig:
    """Grid and block dimensions of one kernel launch, (x, y) order as CUDA takes them."""

    grid: tuple[int, int]
    """Blocks along x (output columns) and y (output rows)."""
    block: tuple[int, int]
    """Threads per block along x and y."""

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1]


def ceil_div(a: int, b: int) -> int:
    """Smallest q with q * b >= a, for a >= 0 and b > 0."""
    if a < 0 or b <= 0:
        raise ValueError(f"ceil_div needs a >= 0 and b > 0, got a={a}, b={b}")
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """Smallest multiple of b that is >= a."""
    return ceil_div(a, b) * b


def k_steps(k: int, tile: int) -> int:
    """Iterations of a kernel's K loop: ceil(K / tile), zero when K is zero."""
    return ceil_div(k, tile)


def _check_grid(m: int, n: int, grid: tuple[int, int]) -> None:
    if grid[1] > MAX_GRID_Y:
        raise ValueError(
            f"output of {m} rows needs {grid[1]} block rows > CUDA's gridDim.y limit {MAX_GRID_Y}; "
            "split the output into smaller row tiles"
        )


def tiled_launch(m: int, n: int, tile: int) -> LaunchConfig:
    """One thread per output element in tile x tile blocks; x runs along columns (coalesced)."""
    if m < 0 or n < 0 or tile <= 0:
        raise ValueError(f"need m, n >= 0 and tile > 0, got m={m}, n={n}, tile={tile}")
    grid = (ceil_div(n, tile), ceil_div(m, tile))
    _check_grid(m, n, grid)
    return LaunchConfig(grid=grid, block=(tile, tile))


def blocked_launch(m: int, n: int, block_m: int, block_n: int, threads: int) -> LaunchConfig:
    """Register-blocked kernels: one 1-D block of `threads` per block_m x block_n output tile."""
    if m < 0 or n < 0 or block_m <= 0 or block_n <= 0 or threads <= 0:
        raise ValueError(
            f"need m, n >= 0 and positive tile/threads, got m={m}, n={n}, "
            f"block_m={block_m}, block_n={block_n}, threads={threads}"
        )
    grid = (ceil_div(n, block_n), ceil_div(m, block_m))
    _check_grid(m, n, grid)
    return LaunchConfig(grid=grid, block=(threads, 1))

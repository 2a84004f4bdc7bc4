"""Launch math: tables and properties, no numba."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels.cuda.launch import (
    MAX_GRID_Y,
    LaunchConfig,
    blocked_launch,
    ceil_div,
    k_steps,
    round_up,
    tiled_launch,
)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (0, 16, 0),  # empty
        (1, 16, 1),  # one partial tile
        (16, 16, 1),  # exact
        (17, 16, 2),  # one element over
        (128, 128, 1),
        (1000, 7, 143),
    ],
)
def test_ceil_div(a: int, b: int, expected: int) -> None:
    assert ceil_div(a, b) == expected


@pytest.mark.parametrize(("a", "b"), [(-1, 4), (4, 0), (4, -2)])
def test_ceil_div_rejects_bad_input(a: int, b: int) -> None:
    with pytest.raises(ValueError, match="ceil_div needs"):
        ceil_div(a, b)


@given(st.integers(0, 10**9), st.integers(1, 10**4))
def test_ceil_div_is_smallest_cover(a: int, b: int) -> None:
    q = ceil_div(a, b)
    assert q * b >= a
    assert (q - 1) * b < a or q == 0
    assert round_up(a, b) == q * b
    assert k_steps(a, b) == q


@pytest.mark.parametrize(
    ("m", "n", "tile", "grid"),
    [
        (0, 5, 16, (1, 0)),  # no rows: empty grid, the host does not launch
        (1, 100, 16, (7, 1)),  # a row vector: x runs along columns
        (100, 1, 16, (1, 7)),  # a column vector
        (64, 64, 16, (4, 4)),
        (5, 7, 4, (2, 2)),  # small simulator tile
    ],
)
def test_tiled_launch(m: int, n: int, tile: int, grid: tuple[int, int]) -> None:
    cfg = tiled_launch(m, n, tile)
    assert cfg == LaunchConfig(grid=grid, block=(tile, tile))
    assert cfg.threads_per_block == tile * tile


@pytest.mark.parametrize(
    ("m", "n", "grid"),
    [
        (128, 128, (1, 1)),
        (129, 1, (1, 2)),
        (1, 257, (3, 1)),
        (1000, 3000, (24, 8)),
    ],
)
def test_blocked_launch(m: int, n: int, grid: tuple[int, int]) -> None:
    cfg = blocked_launch(m, n, 128, 128, 256)
    assert cfg.grid == grid
    assert cfg.block == (256, 1)
    assert cfg.blocks == grid[0] * grid[1]


@given(st.integers(0, MAX_GRID_Y * 4), st.integers(0, 10**7), st.sampled_from([4, 8, 16, 32]))
def test_tiled_launch_covers_output(m: int, n: int, tile: int) -> None:
    gx, gy = tiled_launch(m, n, tile).grid
    assert gx * tile >= n > (gx - 1) * tile or n == gx == 0
    assert gy * tile >= m > (gy - 1) * tile or m == gy == 0


def test_grid_y_limit_is_explained() -> None:
    assert tiled_launch(MAX_GRID_Y * 16, 1, 16).grid == (1, MAX_GRID_Y)  # the limit itself fits
    assert blocked_launch(MAX_GRID_Y * 128, 1, 128, 128, 256).grid == (1, MAX_GRID_Y)
    words = (
        r"output of 1048576 rows needs 65536 block rows > CUDA's gridDim.y limit 65535; "
        "split the output into smaller row tiles$"
    )
    with pytest.raises(ValueError, match=words):
        tiled_launch((MAX_GRID_Y + 1) * 16, 1, 16)
    with pytest.raises(ValueError, match=words.replace("1048576", "8388608")):
        blocked_launch((MAX_GRID_Y + 1) * 128, 1, 128, 128, 256)


def test_tile_of_one() -> None:
    assert tiled_launch(3, 2, 1) == LaunchConfig(grid=(2, 3), block=(1, 1))
    assert blocked_launch(3, 2, 1, 1, 1) == LaunchConfig(grid=(2, 3), block=(1, 1))


@pytest.mark.parametrize(("m", "n", "grid"), [(0, 5, (1, 0)), (5, 0, (0, 1)), (0, 0, (0, 0))])
def test_blocked_launch_of_an_empty_output(m: int, n: int, grid: tuple[int, int]) -> None:
    assert blocked_launch(m, n, 128, 128, 256).grid == grid  # no blocks: the host skips it


@pytest.mark.parametrize(
    "args",
    [(-1, 1, 128, 128, 256), (1, -1, 128, 128, 256), (1, 1, 0, 128, 256), (1, 1, 128, 0, 256),
     (1, 1, 128, 128, 0)],
)  # fmt: skip
def test_blocked_launch_rejects_bad_input(args: tuple[int, int, int, int, int]) -> None:
    m, n, bm, bn, t = args
    words = (
        rf"need m, n >= 0 and positive tile/threads, got m={m}, n={n}, block_m={bm}, "
        rf"block_n={bn}, threads={t}$"
    )
    with pytest.raises(ValueError, match=words):
        blocked_launch(*args)


@pytest.mark.parametrize("args", [(-1, 1, 16), (1, -1, 16), (1, 1, 0)])
def test_tiled_launch_rejects_bad_input(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="need m, n >= 0"):
        tiled_launch(*args)

"""Seed-fixed tiled kernel and CudaAccumulator, run in the Numba CUDA simulator on poisoned
operands (see tests/kernels/poisoned.py)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kernels.cuda import host as cuda_host
from kernels.cuda import tiled as cuda_tiled
from kernels.cuda.launch import tiled_launch
from tests.kernels.poisoned import assert_matmul_close, run_poisoned

pytestmark = [
    pytest.mark.skipif(
        not cuda_host.cuda_available(), reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1"
    ),
    # Test shapes are tiny on purpose; on a real GPU numba warns about the small grids.
    pytest.mark.filterwarnings("ignore:Grid size .* under-utilization"),
]

DTYPES = [np.float32, np.float64]


@pytest.fixture
def small_tile(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """4 x 4 tiles: 16 simulator threads per block instead of 256."""
    monkeypatch.setattr(cuda_tiled, "TILE", 4)
    yield 4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 1),  # smallest
        (1, 6, 9),  # a row vector, 1 x N output
        (9, 6, 1),  # a column vector, N x 1 output
        (5, 7, 6),  # K not a multiple of the tile, nothing divisible
        (8, 8, 4),  # everything divisible: no edge
        (3, 0, 5),  # K = 0: C unchanged
        (6, 13, 3),  # four K steps, the last partial
    ],
)
def test_tiled_kernel_ragged(small_tile: int, shape: tuple[int, int, int], dtype: type) -> None:
    m, _, n = shape
    run_poisoned(cuda_tiled.make_tiled_kernel(dtype), tiled_launch(m, n, small_tile), shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiled_kernel_default_tile(dtype: type) -> None:
    """The production 16 x 16 tile: two block rows, two K steps, ragged everywhere."""
    assert cuda_tiled.TILE == 16
    shape = (17, 20, 3)
    run_poisoned(cuda_tiled.make_tiled_kernel(dtype), tiled_launch(17, 3, 16), shape, dtype)


def test_make_tiled_kernel_rejects_int() -> None:
    with pytest.raises(TypeError, match="support float32 and float64, got int32"):
        cuda_tiled.make_tiled_kernel(np.int32)


# --- CudaAccumulator with the tiled variants -------------------------------------------------

TILED = ["tiled_float32", "tiled_float64"]


@pytest.mark.parametrize("variant", TILED)
@pytest.mark.parametrize(
    ("m", "n", "widths"),
    [
        (5, 7, [3, 0, 5, 4]),  # several panels, one of width 0
        (1, 9, [6, 6]),  # 1 x N
        (9, 1, [1, 1, 1]),  # N x 1, panels of width 1
    ],
)
def test_accumulator_streams_panels(
    small_tile: int, variant: str, m: int, n: int, widths: list[int]
) -> None:
    dtype = cuda_host.VARIANTS[variant].dtype
    rng = np.random.default_rng(len(widths))
    acc = cuda_host.CudaAccumulator((m, n), dtype, variant=variant)
    panels = [
        (rng.standard_normal((m, w)).astype(dtype), rng.standard_normal((w, n)).astype(dtype))
        for w in widths
    ]
    for a, b in panels:
        acc.add(a, b)
    got = acc.result()
    assert got.dtype == dtype and got.shape == (m, n) and got.flags.c_contiguous
    # The panels' products summed are the product of the panels side by side.
    a_all, b_all = np.hstack([a for a, _ in panels]), np.vstack([b for _, b in panels])
    assert_matmul_close(got, a_all, b_all)


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (0, 0)])
def test_accumulator_zero_sized_output(shape: tuple[int, int]) -> None:
    acc = cuda_host.CudaAccumulator(shape, np.dtype(np.float32))
    acc.add(np.ones((shape[0], 3), np.float32), np.ones((3, shape[1]), np.float32))
    assert acc.result().shape == shape


def test_accumulator_zero_width_panel_keeps_zeros() -> None:
    acc = cuda_host.CudaAccumulator((3, 2), np.dtype(np.float64))
    acc.add(np.ones((3, 0)), np.ones((0, 2)))
    np.testing.assert_array_equal(acc.result(), np.zeros((3, 2)))


def test_accumulator_default_variant_per_dtype() -> None:
    for dtype in DTYPES:
        acc = cuda_host.CudaAccumulator((1, 1), np.dtype(dtype))
        assert acc.variant.default and acc.variant.dtype == dtype


@pytest.mark.parametrize("dtype", [np.float16, np.complex64])  # integers: kernels.cuda.integer
def test_accumulator_rejects_dtype(dtype: type) -> None:
    with pytest.raises(TypeError, match="support float32 and float64"):
        cuda_host.CudaAccumulator((2, 2), np.dtype(dtype))


def test_accumulator_rejects_bad_variant_and_panels() -> None:
    with pytest.raises(ValueError, match="unknown CUDA kernel variant 'nope'"):
        cuda_host.CudaAccumulator((2, 2), np.dtype(np.float32), variant="nope")
    with pytest.raises(TypeError, match="computes float64, accumulator is float32"):
        cuda_host.CudaAccumulator((2, 2), np.dtype(np.float32), variant="tiled_float64")
    acc = cuda_host.CudaAccumulator((2, 2), np.dtype(np.float32))
    with pytest.raises(ValueError, match=r"need a \(2, w\) and b \(w, 2\)"):
        acc.add(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(TypeError, match="panels must be float32"):
        acc.add(np.ones((2, 3)), np.ones((3, 2)))


def test_registry_has_one_default_per_dtype() -> None:
    for dtype in DTYPES:
        defaults = [v for v in cuda_host.VARIANTS.values() if v.dtype == dtype and v.default]
        assert len(defaults) == 1
    assert {"tiled_float32", "tiled_float64"} <= set(cuda_host.VARIANTS)

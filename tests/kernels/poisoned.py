"""The simulator harness shared by the CUDA kernel tests.

The kernels accumulate (C += A @ B), so "poison" here means: A, B and C are windows into larger
NaN-filled device arrays. A read outside A or B (a missing zero fill) or a write outside C turns
into NaN; an element the kernel skipped keeps its random start value and fails the comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.cuda.launch import LaunchConfig
from tests.helpers import product_error_bound

PAD = 2  # NaN border around every operand


def assert_matmul_close(
    got: NDArray[Any],
    a: NDArray[Any],
    b: NDArray[Any],
    c0: NDArray[Any] | None = None,
    precision: str | None = None,
) -> None:
    """got == c0 + a @ b within tests/helpers.py's product_error_bound (in ``precision``, by
    default got's dtype's), plus one rounding of the final add into c0."""
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = product_error_bound(a, b, got.dtype, precision)
    if c0 is not None:
        want = want + c0
        bound = bound + float(np.finfo(got.dtype).eps) * (np.abs(c0) + np.abs(want))
    error = np.abs(got.astype(np.float64) - want)
    assert got.shape == want.shape and (error <= bound).all(), (error - bound).max()


def run_poisoned(
    kernel: Callable[..., None], cfg: LaunchConfig, shape: tuple[int, int, int], dtype: Any
) -> None:
    """Launch `kernel` on NaN-bordered windows of random A, B, C; check C0 + A @ B, borders."""
    from numba import cuda

    m, k, n = shape
    rng = np.random.default_rng(m * 10_000 + k * 100 + n)

    def bordered(rows: int, cols: int) -> NDArray[Any]:
        arr = np.full((rows + 2 * PAD, cols + 2 * PAD), np.nan, dtype=dtype)
        arr[PAD : PAD + rows, PAD : PAD + cols] = rng.standard_normal((rows, cols))
        return arr

    a, b, c = bordered(m, k), bordered(k, n), bordered(m, n)
    d_a, d_b, d_c = cuda.to_device(a), cuda.to_device(b), cuda.to_device(c)
    inner = (slice(PAD, -PAD), slice(PAD, -PAD))
    cuda.jit(kernel)[cfg.grid, cfg.block](d_a[inner], d_b[inner], d_c[inner])
    out = d_c.copy_to_host()
    assert_matmul_close(out[inner], a[inner], b[inner], c[inner])
    border = np.ones(out.shape, dtype=bool)
    border[inner] = False
    assert np.isnan(out[border]).all(), "kernel wrote outside C"

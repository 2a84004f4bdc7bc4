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

PAD = 2  # NaN border around every operand


def assert_matmul_close(got: NDArray[Any], want: NDArray[np.float64], k: int) -> None:
    """Compare to a float64 reference with a tolerance that grows with the K length."""
    eps = float(np.finfo(got.dtype).eps)
    np.testing.assert_allclose(got, want, rtol=8 * eps, atol=8 * eps * max(k, 1) * 4)


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
    want = c[inner].astype(np.float64) + a[inner].astype(np.float64) @ b[inner]
    assert_matmul_close(out[inner], want, k)
    border = np.ones(out.shape, dtype=bool)
    border[inner] = False
    assert np.isnan(out[border]).all(), "kernel wrote outside C"

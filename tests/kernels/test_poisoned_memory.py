"""The simulator harness of tests/kernels/conftest.py: memory a kernel did not write reads as
NaN, as it may on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float32, float64

from kernels.cuda import host

pytestmark = [
    pytest.mark.skipif(not host.simulated(), reason="the harness patches the CUDA simulator"),
    pytest.mark.filterwarnings("ignore:Grid size .* under-utilization"),
]


def _read_unwritten(out):  # type: ignore[no-untyped-def]
    shared = cuda.shared.array((4, 4), float32)
    local = cuda.local.array(3, float64)
    dynamic = cuda.shared.array(0, float32)
    i = cuda.threadIdx.x
    out[0, i] = shared[i, 0]
    out[1, i] = local[i % 3]
    out[2, i] = dynamic[i]


def test_unwritten_shared_local_and_dynamic_memory_is_nan() -> None:
    out = cuda.to_device(np.zeros((3, 4), np.float64))
    cuda.jit(_read_unwritten)[1, 4, 0, 16](out)  # 16 bytes of dynamic shared memory
    got = out.copy_to_host()
    assert np.isnan(got).all(), got

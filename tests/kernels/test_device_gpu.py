"""The numba-cuda device (in the simulator): the accumulator is zeroed on the device, on the
stream the caller gives, never by copying a host array of zeros on the legacy stream."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernels.cuda import host as cuda_host
from kernels.device.engine import StagedProduct
from kernels.device.gpu import NumbaDevice
from kernels.memory.allocators import numpy_allocator
from kernels.memory.buffers import BufferPool

pytestmark = pytest.mark.skipif(
    not cuda_host.cuda_available(), reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1"
)


@pytest.fixture
def memsets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, Any]]:
    """Every device memset as (bytes, stream); host-to-device copies of new arrays fail."""
    from numba import cuda
    from numba.cuda.cudadrv import driver

    seen: list[tuple[int, Any]] = []
    real = driver.device_memset

    def spy(dst: Any, val: int, size: int, stream: Any = 0) -> None:
        seen.append((size, stream))
        real(dst, val, size, stream)

    def no_upload(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("zeros must not copy a host array to the device")

    monkeypatch.setattr(driver, "device_memset", spy)
    monkeypatch.setattr(cuda, "to_device", no_upload)
    return seen


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_zeros_are_a_memset_on_the_given_stream(memsets: list[tuple[int, Any]], dtype: str) -> None:
    device = NumbaDevice()
    stream = device.stream()
    dev = device.zeros((5, 7), dtype, stream)
    stream.synchronize()
    host = np.full((5, 7), np.nan, dtype)
    device.copy_to_host(dev, host, stream)
    stream.synchronize()
    assert memsets == [(5 * 7 * np.dtype(dtype).itemsize, stream)]
    assert not host.any()


def test_the_engine_zeroes_its_accumulator_on_its_compute_stream(
    memsets: list[tuple[int, Any]],
) -> None:
    engine = StagedProduct(NumbaDevice(), (3, 4), "float32", BufferPool(numpy_allocator, 1 << 20))
    assert memsets == [(3 * 4 * 4, engine.streams.compute)]
    assert not engine.result().any()

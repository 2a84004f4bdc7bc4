"""Kernel tests run on a simulator that lies like a GPU: shared, local and dynamic shared arrays
start with every byte 0xFF (NaN for floats, -1 for integers) instead of numpy's
whatever-was-there, so a kernel that reads memory it never wrote fails at every ragged edge
(NaN·0 is NaN). On a GPU, uninitialised shared memory holds whatever the last block left."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

POISON_BYTE = 0xFF


def poisoned(shape: Any, dtype: Any) -> np.ndarray[Any, Any]:
    """``numpy.empty`` with every byte set to POISON_BYTE."""
    out = np.empty(shape, dtype)
    out.reshape(-1).view(np.uint8).fill(POISON_BYTE)
    return out


def numpy_dtype(dtype: Any) -> np.dtype[Any]:
    from numba.cuda import types
    from numba.cuda.np import numpy_support

    return numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else np.dtype(dtype)


def _local_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
    """FakeCUDALocal.array, poisoned (one per thread and call, as in the simulator)."""
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    return poisoned(shape, numpy_dtype(dtype))


def _shared_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
    """FakeCUDAShared.array, poisoned. One array per block and source line, as the simulator
    keys them, but claimed with ``setdefault``: the simulator's get-then-set lets two threads
    racing through the first call each keep an array of their own, which the fill made
    frequent (a thread writing a tile nobody reads)."""
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    dt = numpy_dtype(dtype)
    if shape == 0:  # dynamic shared memory: all of it, poisoned when the block started
        count = self._dynshared_size // dt.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dt, count=count)
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)
    found = self._allocations.get(key)
    return found if found is not None else self._allocations.setdefault(key, poisoned(shape, dt))


@pytest.fixture(autouse=True)
def uninitialised_memory_is_nan(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        from numba.cuda.simulator import kernelapi

        shared_init = kernelapi.FakeCUDAShared.__init__

        def init(self: Any, dynshared_size: int) -> None:
            shared_init(self, dynshared_size)
            self._dynshared.fill(-1)  # int8: every byte 0xFF

        monkeypatch.setattr(kernelapi.FakeCUDAShared, "__init__", init)
        monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", _shared_array)
        monkeypatch.setattr(kernelapi.FakeCUDALocal, "array", _local_array)
    yield

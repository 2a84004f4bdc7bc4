"""Accumulator memory reused across tasks: zeroed every time, never while a view lives."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from kernels.cpu import CpuAccumulator
from kernels.memory import zeroed

SHAPE = (512, 1024)  # 2 MiB of float32: above MIN_BYTES


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no buffer kept (earlier tests' accumulators leave some)."""
    monkeypatch.setattr(zeroed, "_kept", [])


def _address(x: np.ndarray) -> int:
    return int(x.__array_interface__["data"][0])


def test_reused_memory_is_zeroed() -> None:
    first = zeroed.zeros(SHAPE, "float32")
    first[:] = 7.0
    where = _address(first)
    del first
    gc.collect()
    second = zeroed.zeros(SHAPE, "float32")
    assert _address(second) == where  # the same memory, not fresh pages
    assert second.shape == SHAPE and second.dtype == np.float32 and not second.any()


def test_a_live_view_keeps_its_memory() -> None:
    first = zeroed.zeros(SHAPE, "float64")
    band = first[100:200, 3:]  # what a band writer holds after the task dropped the array
    band[:] = 1.0
    where = _address(first)
    del first
    gc.collect()
    second = zeroed.zeros(SHAPE, "float64")
    assert _address(second) != where and not second.any()
    assert (band == 1.0).all()  # untouched by the second array's zeroing


def test_an_array_freed_while_the_lock_is_held_does_not_deadlock() -> None:
    """The garbage collector can run an array's finaliser inside ``_take`` (an allocation
    there collects a cycle, e.g. a failed task's traceback holding its accumulator): giving
    the buffer back must not wait for the lock its own thread holds."""
    array = zeroed.zeros(SHAPE, "float32")

    def free_under_lock() -> None:
        nonlocal array
        with zeroed._lock:
            del array  # the finaliser runs here

    thread = threading.Thread(target=free_under_lock, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "freeing an array under the module's lock deadlocked"
    again = zeroed.zeros(SHAPE, "float32")  # the lock was let go and the module still works
    assert not again.any()


def test_small_and_unfitting_requests() -> None:
    small = zeroed.zeros((4, 4), "float32")
    assert small.base is None and not small.any()  # plain numpy
    big = zeroed.zeros(SHAPE, "float32")
    del big
    gc.collect()
    bigger = zeroed.zeros((1024, 1024), "float32")  # nothing kept fits: fresh, zero
    assert not bigger.any() and bigger.shape == (1024, 1024)


def test_cpu_accumulators_reuse_and_stay_correct() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((512, 64)), rng.standard_normal((64, 1024))
    for _ in range(3):  # each starts from zero on the previous one's memory
        acc = CpuAccumulator(SHAPE, "float64")
        acc.add(a, b)
        np.testing.assert_allclose(acc.result(), a @ b, rtol=1e-12, atol=1e-12)
        del acc
        gc.collect()

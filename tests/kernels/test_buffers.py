"""The bounded buffer pool and its allocators: reuse, waiting, eviction, errors, huge pages."""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from kernels.memory import allocators, buffers
from kernels.memory.allocators import host_allocator, numpy_allocator
from kernels.memory.buffers import PAGE, BufferPool

ONE_PAGE = ((PAGE // 4,), np.float32)  # a spec of exactly one page


def address(array: Any) -> int:
    return int(array.__array_interface__["data"][0])


def test_released_buffer_is_reused_not_reallocated() -> None:
    pool = BufferPool(numpy_allocator, 4 * PAGE)
    with pool.acquire((10, 3), np.float64) as lease:
        first = address(lease.array)
        assert lease.array.shape == (10, 3) and lease.array.dtype == np.float64
    with pool.acquire((3, 10), np.float64) as lease:  # same bytes, another shape
        assert address(lease.array) == first and lease.array.shape == (3, 10)
    stats = pool.stats()
    assert (stats.allocations, stats.reuses, stats.bytes_held, stats.bytes_leased) == (
        1,
        1,
        PAGE,
        0,
    )


def test_group_arrays_are_page_aligned_disjoint_and_writable() -> None:
    pool = BufferPool(host_allocator, 8 * PAGE)
    lease = pool.acquire_group([((5, 7), np.float32), ((7, 3), np.float64)])
    a, b = lease.arrays
    assert (a.shape, a.dtype, b.shape, b.dtype) == ((5, 7), np.float32, (7, 3), np.float64)
    assert address(a) % PAGE == 0 and address(b) % PAGE == 0
    a[...], b[...] = 1, 2  # writing one must not touch the other
    assert (a == 1).all() and (b == 2).all()
    assert pool.stats().bytes_leased == 2 * PAGE
    lease.release()
    with pytest.raises(RuntimeError, match="released twice"):
        lease.release()


def test_exhausted_budget_blocks_until_a_release() -> None:
    pool = BufferPool(numpy_allocator, PAGE)
    held = pool.acquire_group([ONE_PAGE])
    assert pool.try_acquire_group([ONE_PAGE]) is None
    with pytest.raises(TimeoutError, match=f"no {PAGE} bytes free"):
        pool.acquire_group([ONE_PAGE], timeout=0.05)
    got: list[float] = []
    waiter = threading.Thread(
        target=lambda: (pool.acquire_group([ONE_PAGE]).release(), got.append(time.perf_counter()))
    )
    waiter.start()
    deadline = time.monotonic() + 30  # until the thread waits (or wrongly got a buffer)
    while pool.stats().waits < 2 and not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stats().waits == 2 and not got, "acquired beyond the budget"
    released = time.perf_counter()
    held.release()
    waiter.join(timeout=5)
    assert got and got[0] >= released
    stats = pool.stats()
    # the timed-out request and the thread waited; the thread got the released buffer
    assert (stats.waits, stats.allocations, stats.reuses, stats.evictions) == (2, 1, 1, 0)


def test_free_buffers_of_other_sizes_are_evicted_oldest_first() -> None:
    pool = BufferPool(numpy_allocator, 3 * PAGE)

    def use(nbytes: int) -> None:  # a timeout: a missing eviction fails instead of hanging
        pool.acquire_group([((nbytes,), np.uint8)], timeout=5).release()

    use(PAGE)  # oldest free
    use(2 * PAGE - 1)  # two pages, newer
    assert pool.stats().bytes_held == 3 * PAGE
    use(3 * PAGE)  # needs everything: both go
    assert pool.stats().evictions == 2
    use(PAGE)  # evicts the 3-page buffer
    use(PAGE + 1)  # two pages fit beside the one kept
    stats = pool.stats()
    assert (stats.evictions, stats.bytes_held, stats.allocations) == (3, 3 * PAGE, 5)
    with pool.acquire((PAGE,), np.uint8):  # the 1-page buffer was kept
        assert pool.stats().reuses == 1


def test_request_beyond_the_whole_budget_is_refused() -> None:
    pool = BufferPool(numpy_allocator, 2 * PAGE)
    with pytest.raises(
        ValueError,
        match=rf"request of {3 * PAGE} bytes exceeds the whole pool budget of {2 * PAGE}",
    ):
        pool.acquire((3 * PAGE,), np.uint8)
    with pytest.raises(ValueError, match="must be positive"):
        BufferPool(numpy_allocator, 0)


def test_failed_allocation_gives_its_reservation_back() -> None:
    def failing(nbytes: int) -> Any:
        raise MemoryError("no memory")

    pool = BufferPool(failing, PAGE)
    with pytest.raises(MemoryError):
        pool.acquire((8,), np.uint8)
    assert pool.stats().bytes_held == 0
    pool.allocator = numpy_allocator
    pool.acquire((8,), np.uint8).release()


def test_shrinking_the_budget_drops_free_buffers_and_trim_drops_all() -> None:
    pool = BufferPool(numpy_allocator, 4 * PAGE)
    leases = [pool.acquire((PAGE,), np.uint8) for _ in range(3)]
    for lease in leases:
        lease.release()
    pool.set_budget(PAGE)
    assert pool.stats().bytes_held == PAGE
    pool.trim()
    assert pool.stats().bytes_held == 0


def test_process_pool_is_one_per_kind_and_follows_the_budget() -> None:
    first = buffers.process_pool("test-kind", numpy_allocator, 4 * PAGE)
    assert buffers.process_pool("test-kind", numpy_allocator, 4 * PAGE) is first
    assert buffers.process_pool("test-kind", numpy_allocator, 2 * PAGE) is first
    assert first.budget_bytes == 2 * PAGE
    assert buffers.process_pool("other-kind", numpy_allocator, PAGE) is not first


def resident_bytes(start: int) -> int | None:
    """Rss of the mapping holding ``start``, from /proc/self/smaps (None where there is none)."""
    if not os.path.exists("/proc/self/smaps"):
        return None
    found = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                lo, hi = (int(x, 16) for x in first.split("-"))
                found = lo <= start < hi
            elif found and first == "Rss:":
                return int(line.split()[1]) * 1024
    return None


def test_host_allocator_is_aligned_writable_and_prefaulted() -> None:
    nbytes = 64 * PAGE + 5
    array = host_allocator(nbytes)
    assert array.dtype == np.uint8 and array.shape == (nbytes,)
    assert address(array) % PAGE == 0 and array.flags.writeable
    resident = resident_bytes(address(array))
    if resident is not None:  # Linux: every page is already backed, none faults on reuse
        assert resident >= nbytes
    assert not array.any()
    array[-1] = 7
    assert array[-1] == 7


class _RefusingMap:
    def madvise(self, option: int) -> None:
        raise OSError(22, "Invalid argument")


@pytest.mark.parametrize(
    ("target", "want"),
    [
        (_RefusingMap(), False),  # THP off, or a kernel without it: EINVAL
        (object(), False),  # a platform without mmap.madvise
    ],
)
def test_huge_page_advice_degrades_quietly(target: Any, want: bool) -> None:
    assert allocators.advise_huge_pages(target) is want


def test_host_allocator_without_madv_hugepage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)
    mem = mmap.mmap(-1, PAGE)
    assert allocators.advise_huge_pages(mem) is False
    assert host_allocator(2 * PAGE).nbytes == 2 * PAGE


def test_pinned_allocator_serves_a_pool() -> None:
    pool = BufferPool(allocators.pinned_allocator, 2 * PAGE)
    with pool.acquire((4, 4), np.float32) as lease:
        lease.array[...] = 1.5
        assert lease.array.sum() == 24

"""Allocators for the buffer pool: plain numpy, anonymous huge-page memory (touched up front
or lazily), and pinned memory for a GPU's asynchronous copies."""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

Allocator = Callable[[int], NDArray[np.uint8]]
"""Returns a writable, C-contiguous 1-D uint8 array of exactly ``nbytes``."""
PAGE = mmap.PAGESIZE


def numpy_allocator(nbytes: int) -> NDArray[np.uint8]:
    """Plain ``numpy.empty``: for tests and as the portable fallback."""
    return np.empty(nbytes, dtype=np.uint8)


def host_allocator(nbytes: int) -> NDArray[np.uint8]:
    """Page-aligned anonymous memory, advised to use transparent huge pages, touched once per
    page now so that reusing the buffer later never faults."""
    mem = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise_huge_pages(mem)
    array = np.frombuffer(mem, dtype=np.uint8, count=nbytes)  # keeps ``mem`` alive
    array[::PAGE] = 0  # a write: reading would map the shared zero page, not ours
    return array


def lazy_host_allocator(nbytes: int) -> NDArray[np.uint8]:
    """Like ``host_allocator`` but not touched: the pages fault in where the buffer is first
    written (a decode thread, in parallel with the others) instead of in the thread asking
    for it; reuse is free of faults all the same."""
    mem = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise_huge_pages(mem)
    return np.frombuffer(mem, dtype=np.uint8, count=nbytes)


def advise_huge_pages(mem: Any) -> bool:
    """``madvise(MADV_HUGEPAGE)`` where the platform has it; False where it does not or refuses
    (not Linux, THP disabled, a kernel without it): the buffer then just uses small pages."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not hasattr(mem, "madvise"):
        return False
    try:
        mem.madvise(advice)
    except OSError:
        return False
    return True


def pinned_allocator(nbytes: int) -> NDArray[np.uint8]:
    """Page-locked host memory (``cuda.pinned_array``): host-to-device copies from it are
    asynchronous. The CUDA simulator returns ordinary memory."""
    from numba import cuda

    array: NDArray[np.uint8] = cuda.pinned_array((max(nbytes, 1),), dtype=np.uint8)
    return array[:nbytes]  # the driver refuses empty allocations

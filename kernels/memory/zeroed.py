"""Zeroed arrays whose memory goes to the next one once the last view of them is gone.

A task's accumulator is its largest buffer (48 MiB at 12288² float32 in 12 tiles), and a new
one is fresh memory: the kernel zeroes every page on its first write (a page fault each, and
``clear_page`` a visible share of a large job's CPU time). A buffer given back here
when its array and every view of it are gone is zeroed again by ``fill`` in user space instead
(a warm memset, several times faster), for the next accumulator of that size or less.
"""

from __future__ import annotations

import mmap
import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

KEPT = 2
"""Buffers kept for reuse: one per task a worker runs at once on 2 cores; more tasks at once
allocate their own. Any that don't fit the next request are let go first, so what is kept
never adds to what tasks hold."""
MIN_BYTES = 1 << 20
"""Smaller arrays are malloc's business."""

_kept: list[mmap.mmap] = []
_lock = threading.Lock()


def zeros(shape: tuple[int, ...], dtype: Any) -> NDArray[Any]:
    """Like ``numpy.zeros``, reusing the memory of an earlier array of this module."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.zeros(shape, dtype)
    mem = _take(nbytes)
    reused = mem is not None
    mem = mem if mem is not None else mmap.mmap(-1, nbytes)  # fresh: zero pages until written
    raw = np.frombuffer(mem, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)
    array: NDArray[Any] = np.asarray(_Owner(mem, raw))
    if reused:
        array.fill(0)
    return array


class _Owner:
    """Hands the buffer to numpy as a base that is not an array, so every view and slice
    holds this object (numpy collapses bases only through arrays); the buffer is kept for the
    next ``zeros`` exactly when the last of them is gone."""

    def __init__(self, mem: mmap.mmap, raw: NDArray[Any]) -> None:
        self.mem = mem
        self.__array_interface__ = raw.__array_interface__
        self._raw = raw  # the memory's exporter, alive as long as this object

    def __del__(self) -> None:
        _give(self.mem)


def _take(nbytes: int) -> mmap.mmap | None:
    """The smallest kept buffer holding ``nbytes``; when none does, all are let go."""
    with _lock:
        fits = [m for m in _kept if len(m) >= nbytes]
        if not fits:
            _kept.clear()  # closed once numpy lets go of them (they are never in use here)
            return None
        best = min(fits, key=len)
        _kept.remove(best)
        return best


def _give(mem: mmap.mmap) -> None:
    # Called from __del__, which the garbage collector may run inside _take (an allocation
    # there collects a cycle holding an array): waiting for the lock would then wait forever.
    # A buffer not kept is simply freed.
    if not _lock.acquire(blocking=False):
        return
    try:
        if len(_kept) < KEPT:
            _kept.append(mem)
    finally:
        _lock.release()

"""Byte buffers reused across chunk reads in a worker process.

A fresh buffer of a few MiB is new pages to the kernel, which zeroes each one on first touch
(``clear_page``) and unmaps them when freed: reading each large stored chunk into new bytes
and decoding it into a new temporary spends a measurable share of a job's CPU time in the
kernel. Readers take a buffer here and give it back; the pool keeps the few it has seen in use
at once (the readers' peak, which the memory plan already counts) up to KEEP_BYTES.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

KEEP_BYTES = 256 * 2**20
"""Idle bytes the pool keeps at most; a buffer given back past this is freed."""
KEEP_BUFFERS = 8

_lock = threading.Lock()
_idle: list[NDArray[np.uint8]] = []


@contextlib.contextmanager
def scratch(size: int) -> Iterator[NDArray[np.uint8]]:
    """``size`` bytes (uninitialised) for the block's duration, from an idle buffer when one is
    large enough (the smallest such), else new."""
    with _lock:
        fits = [k for k, b in enumerate(_idle) if b.nbytes >= size]
        buffer = _idle.pop(min(fits, key=lambda k: _idle[k].nbytes)) if fits else None
    if buffer is None:
        buffer = np.empty(max(size, 1), dtype=np.uint8)
    try:
        yield buffer[:size]
    finally:
        _give_back(buffer)


def _give_back(buffer: NDArray[np.uint8]) -> None:
    with _lock:
        _idle.append(buffer)
        _idle.sort(key=lambda b: b.nbytes, reverse=True)  # keep the largest: they fit any read
        while len(_idle) > KEEP_BUFFERS or sum(b.nbytes for b in _idle) > KEEP_BYTES:
            _idle.pop()


def idle_bytes() -> int:
    """Bytes the pool holds now (tests, reports)."""
    with _lock:
        return sum(b.nbytes for b in _idle)

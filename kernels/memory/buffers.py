"""A bounded pool of reusable host buffers: one mechanism for the CPU path and the GPU's pinned
staging, differing only in the allocator.

Fresh pages cost a page fault each on first touch (and pinned memory costs a driver call per
allocation), so decoded panels go into buffers that are kept and reused. The pool holds at most
``budget_bytes``; a request that does not fit waits until a lease is released, after evicting
free buffers of other sizes (least recently used first).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

from kernels.memory.allocators import (
    PAGE,
    Allocator,
)

ArraySpec = tuple[tuple[int, ...], DTypeLike]
_NEW = object()  # a claim on budget for a buffer still to be allocated


@dataclass(frozen=True)
class PoolStats:
    allocations: int
    """Buffers the allocator made."""
    reuses: int
    """Requests served by a kept buffer."""
    evictions: int
    """Free buffers dropped to make room for a request of another size."""
    waits: int
    """Requests that had to wait for a release."""
    bytes_held: int
    """Leased plus free buffers, in bytes."""
    bytes_leased: int
    peak_bytes_held: int
    budget_bytes: int


class Lease:
    """Arrays carved from one pooled buffer; give it back with ``release()`` or ``with``."""

    def __init__(
        self, pool: BufferPool, buffer: NDArray[np.uint8], specs: Sequence[ArraySpec]
    ) -> None:
        self._pool: BufferPool | None = pool
        self.buffer = buffer
        self.arrays = tuple(_carve(buffer, specs))

    @property
    def array(self) -> NDArray[Any]:
        """The first (often only) array."""
        return self.arrays[0]

    def release(self) -> None:
        if self._pool is None:
            raise RuntimeError("lease released twice")
        pool, self._pool = self._pool, None
        pool._give_back(self.buffer)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def group_bytes(specs: Sequence[ArraySpec]) -> int:
    """Bytes of one buffer holding all ``specs``, each array starting on a page."""
    return sum(_round_up(_nbytes(shape, dtype), PAGE) for shape, dtype in specs)


class BufferPool:
    """Thread-safe, bounded: at most ``budget_bytes`` of buffers exist at once (leased or free)."""

    def __init__(self, allocator: Allocator, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        self.allocator = allocator
        self.budget_bytes = int(budget_bytes)
        self._cond = threading.Condition()
        self._free: OrderedDict[int, list[NDArray[np.uint8]]] = OrderedDict()
        self._held = self._leased = self._peak = 0
        self._counts = {"allocations": 0, "reuses": 0, "evictions": 0, "waits": 0}

    def acquire(self, shape: tuple[int, ...], dtype: DTypeLike) -> Lease:
        """One array of ``shape`` and ``dtype``; blocks while the budget is exhausted."""
        return self.acquire_group([(shape, dtype)])

    def acquire_group(self, specs: Sequence[ArraySpec], timeout: float | None = None) -> Lease:
        """Several arrays from one buffer, all or nothing (a panel's A and B together, so two
        waiting requests never each hold half). TimeoutError after ``timeout`` seconds."""
        lease = self._acquire(specs, timeout)
        if lease is None:
            raise TimeoutError(f"no {group_bytes(specs)} bytes free in the pool in {timeout} s")
        return lease

    def try_acquire_group(self, specs: Sequence[ArraySpec]) -> Lease | None:
        """Like ``acquire_group`` but None at once when it would have to wait."""
        return self._acquire(specs, 0.0)

    def stats(self) -> PoolStats:
        with self._cond:
            return PoolStats(
                **self._counts,
                bytes_held=self._held,
                bytes_leased=self._leased,
                peak_bytes_held=self._peak,
                budget_bytes=self.budget_bytes,
            )

    def set_budget(self, budget_bytes: int) -> None:
        """Change the bound; free buffers beyond it are dropped (leases keep theirs)."""
        with self._cond:
            self.budget_bytes = int(budget_bytes)
            self._evict(0)
            self._cond.notify_all()

    def trim(self) -> None:
        """Drop every free buffer."""
        with self._cond:
            self._counts["evictions"] += sum(len(kept) for kept in self._free.values())
            self._held -= sum(key * len(kept) for key, kept in self._free.items())
            self._free.clear()

    def _acquire(self, specs: Sequence[ArraySpec], timeout: float | None) -> Lease | None:
        size = group_bytes(specs)
        with self._cond:
            claimed = self._claim(size, timeout)
        if claimed is None:
            return None
        buffer = claimed if isinstance(claimed, np.ndarray) else self._allocate(size)  # unlocked
        return Lease(self, buffer, specs)

    def _claim(self, size: int, timeout: float | None) -> NDArray[np.uint8] | object | None:
        """A kept buffer of ``size``, or _NEW with ``size`` bytes reserved for a new one
        (evicting other sizes as needed), or None after ``timeout``. Lock held."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waited = False
        while True:
            if size > self.budget_bytes:  # checked on every pass: the budget may shrink
                raise ValueError(
                    f"a request of {size} bytes exceeds the whole pool budget of "
                    f"{self.budget_bytes} bytes; raise the budget or use narrower panels"
                )
            kept = self._free.get(size)
            if kept:  # checked again after every wait: a release may have brought one
                self._counts["reuses"] += 1
                self._leased += size
                buffer = kept.pop()
                if not kept:
                    del self._free[size]
                return buffer
            self._evict(size)
            if self._held + size <= self.budget_bytes:
                self._held += size
                self._leased += size
                self._peak = max(self._peak, self._held)
                return _NEW
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._counts["waits"] += int(not waited)
            waited = True
            self._cond.wait(left)

    def _allocate(self, size: int) -> NDArray[np.uint8]:
        try:
            buffer = self.allocator(size)
        except BaseException:
            with self._cond:
                self._held -= size
                self._leased -= size
                self._cond.notify_all()
            raise
        with self._cond:
            self._counts["allocations"] += 1
        return buffer

    def _evict(self, size: int) -> None:
        """Drop least recently freed buffers until ``size`` more bytes fit (lock held)."""
        while self._free and self._held + size > self.budget_bytes:
            key, kept = next(iter(self._free.items()))
            kept.pop(0)
            if not kept:
                del self._free[key]
            self._held -= key
            self._counts["evictions"] += 1

    def _give_back(self, buffer: NDArray[np.uint8]) -> None:
        with self._cond:
            size = buffer.nbytes
            self._leased -= size
            self._free.setdefault(size, []).append(buffer)
            self._free.move_to_end(size)  # most recently used last
            self._evict(0)  # the budget may have shrunk meanwhile
            self._cond.notify_all()


POOLED_MIN_BYTES = 1 << 20
"""Smaller arrays are not worth a pooled buffer."""


class _Owner:
    """Hands a lease's array to numpy; numpy keeps it alive through every view and slice, so
    the buffer goes back to the pool exactly when the last view is gone."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.__array_interface__ = lease.array.__array_interface__

    def __del__(self) -> None:
        self.lease.release()


def owned_array(pool: BufferPool | None, shape: tuple[int, ...], dtype: DTypeLike) -> NDArray[Any]:
    """An array of ``shape`` from ``pool`` that returns itself when no longer referenced; a
    fresh one when the pool is full or the array small (never waits: a cache may hold the
    pool's buffers; small arrays are malloc's business, pages would waste most of them)."""
    specs = [(shape, dtype)]
    pooled = pool is not None and POOLED_MIN_BYTES <= group_bytes(specs) <= pool.budget_bytes
    lease = pool.try_acquire_group(specs) if pool is not None and pooled else None
    if lease is None:
        return np.empty(shape, dtype)
    return np.asarray(_Owner(lease))


_POOLS: dict[str, BufferPool] = {}
_POOLS_LOCK = threading.Lock()


def process_pool(kind: str, allocator: Allocator, budget_bytes: int) -> BufferPool:
    """This process's pool of ``kind`` ("host", "pinned", ...), shared by its task threads;
    a later call with another budget changes the budget of the same pool."""
    with _POOLS_LOCK:
        pool = _POOLS.get(kind)
        if pool is None:
            pool = _POOLS[kind] = BufferPool(allocator, budget_bytes)
    if pool.budget_bytes != budget_bytes:
        pool.set_budget(budget_bytes)
    return pool


def _carve(buffer: NDArray[np.uint8], specs: Sequence[ArraySpec]) -> list[NDArray[Any]]:
    arrays, offset = [], 0
    for shape, dtype in specs:
        nbytes = _nbytes(shape, dtype)
        raw = buffer[offset : offset + nbytes]
        arrays.append(raw.view(np.dtype(dtype)).reshape(shape))
        offset += _round_up(nbytes, PAGE)
    return arrays


def _nbytes(shape: tuple[int, ...], dtype: DTypeLike) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple

"""Where a worker process's CPU-seconds go, by kind of work, summing to its user + system.

Thread-seconds (pipeline.run.timing) count a thread's wall time, so two threads waiting for
one core count twice. Here every region of our code that does one kind of work (the product,
decoding a chunk, our copies, our side of writing) adds the *user* CPU-seconds of the thread
running it (``getrusage(RUSAGE_THREAD)``), wherever that thread is, zarr's threads included.
Regions nest: an inner one's seconds go to its own kind only. zarr's own threads (its event
loop and the pool it decodes and stores in) are read from /proc as a whole, less what our
regions measured in them; so are the CPU backend's shared gemm threads (kernels.cpu), all of
whose seconds are the product. Everything else is "other" (the interpreter, dask, the journal):
``user = Σ kinds + zarr + other`` and the system seconds (page faults, file I/O, munmap) are
one row of their own. Linux splits a thread's time into user and system by sampling at each
scheduler tick (the sum is exact), so a kind is an estimate good to a few ticks: fine for
seconds, noise for a job of milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Iterator

from kernels.cpu import GEMM_THREAD

KINDS = ("product", "decode", "copy", "write")
"""Kinds our code measures: the BLAS/GPU product, decoding stored chunks, our copies (out of
the accumulator, into staging), our side of a write (casting, checksums)."""
ROWS = (*KINDS, "zarr", "system", "other")
"""The accounting's rows: KINDS, zarr's threads (reading and writing stored chunks, its
copies and encoding), system time, everything else."""
ZARR_THREADS = ("zarr_", "asyncio_")
"""Name prefixes of zarr's threads: its event loop (``zarr_io``), its pool or the loop's
default executor, where it fetches, decodes, encodes and stores chunks."""
GEMM_THREADS = (f"{GEMM_THREAD}_",)
"""Name prefix of kernels.cpu's shared gemm threads: a task waits while they compute."""
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Ledger:
    """This process's user CPU-seconds per kind, and how much of it ran on zarr's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = dict.fromkeys(KINDS, 0.0)
        self._in_zarr = 0.0  # of the above, measured on zarr's threads
        self._local = threading.local()

    @contextlib.contextmanager
    def measure(self, kind: str) -> Iterator[None]:
        """Charge the calling thread's user seconds in the block to ``kind`` (an enclosing
        region's kind gets none of them)."""
        stack: list[str] = self._local.__dict__.setdefault("stack", [])
        if stack:
            self._charge(stack[-1])
        self._local.mark = _thread_user()
        stack.append(kind)
        try:
            yield
        finally:
            self._charge(stack.pop())

    def _charge(self, kind: str) -> None:
        now = _thread_user()
        spent = now - self._local.mark
        self._local.mark = now
        on_zarr = threading.current_thread().name.startswith(ZARR_THREADS)
        with self._lock:
            self._seconds[kind] += spent
            self._in_zarr += spent if on_zarr else 0.0

    def totals(self) -> dict[str, float]:
        """Seconds per kind so far, and ``in_zarr``: how many of them ran on zarr's threads."""
        with self._lock:
            return {**self._seconds, "in_zarr": self._in_zarr}


LEDGER = Ledger()
"""The process's ledger: tasks, reads and decodes add to it; the client reads it per job."""


def _thread_user() -> float:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_utime


def thread_seconds(prefixes: tuple[str, ...] = ZARR_THREADS) -> tuple[float, float]:
    """(user, system) CPU-seconds of this process's live threads whose names start with one of
    ``prefixes`` (zarr's by default; Linux /proc; 0 where there is none). Pool threads live as
    long as the process, so deltas over a job hold."""
    user = system = 0.0
    for thread in threading.enumerate():
        if not thread.name.startswith(prefixes) or thread.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11]) / _TICKS  # utime, stime: fields 14 and 15 of stat(5)
        system += int(fields[12]) / _TICKS
    return user, system


def account(
    user: float, system: float, kinds: dict[str, float], zarr_user: float, gemm_user: float = 0.0
) -> dict[str, float]:
    """The rows (ROWS) of a process's (or a job's summed) CPU-seconds: ``kinds`` as measured
    (``in_zarr`` of them on zarr's threads) with the gemm threads' user seconds added to the
    product, zarr's threads' user seconds less those measured in them, the system seconds, and
    the rest of ``user`` as other. The rows sum to ``user + system``."""
    rows = {kind: kinds.get(kind, 0.0) for kind in KINDS}
    rows["product"] += max(gemm_user, 0.0)  # < 0 only when a pool was replaced mid-job
    rows["zarr"] = max(zarr_user - kinds.get("in_zarr", 0.0), 0.0)
    rows["system"] = system
    rows["other"] = user + system - sum(rows.values())
    return rows

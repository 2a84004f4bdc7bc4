"""Where a task's seconds go: thread-seconds per phase, and the worker processes' CPU usage.

Each tile task keeps a ``PhaseTimes`` that its threads add to: the product (BLAS or the GPU
kernel), decoding panels (or, decoded on the GPU, reading them compressed), copying results out
of the accumulator, writing bands, and waiting (the task's thread idle until a panel or a write
is ready). The client sums them per job, and reads user/system seconds, page faults and the
CPU-seconds by kind (pipeline.cputime) of every worker process before and after the job, so a
gap to the peers is explained by a measurement.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterator

from pipeline.cputime import GEMM_THREADS, KINDS, LEDGER, thread_seconds

PHASES = ("product", "decode", "read", "copy", "write", "wait")
"""Phases of a tile task, in thread-seconds (several threads of a task overlap)."""


class PhaseTimes:
    """Thread-safe sums of seconds per phase."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextlib.contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        """The block's wall seconds to ``phase``; its CPU-seconds to the process's ledger too
        when the phase is one of its kinds (decoding is charged where chunks are decoded)."""
        cpu = LEDGER.measure(phase) if phase in KINDS and phase != "decode" else None
        started = time.perf_counter()
        try:
            with cpu or contextlib.nullcontext():
                yield
        finally:
            self.add(phase, time.perf_counter() - started)

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.seconds[phase] += seconds

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return {k: round(v, 4) for k, v in self.seconds.items()}


def add_phases(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    """Phase-wise sum, in PHASES order."""
    return {k: total.get(k, 0.0) + part.get(k, 0.0) for k in PHASES}


USAGE = ("user_seconds", "system_seconds", "page_faults", "zarr_user_seconds", "gemm_user_seconds")
"""What process_usage reads besides the ledger's kinds (pipeline.cputime.Ledger.totals)."""


def process_usage() -> tuple[int, dict[str, float]]:
    """Runs on each worker: (pid, counters) of this process: USAGE and the ledger's kinds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    zarr_user, _ = thread_seconds()
    gemm_user, _ = thread_seconds(GEMM_THREADS)
    values = (usage.ru_utime, usage.ru_stime, usage.ru_minflt, zarr_user, gemm_user)
    counters = dict(zip(USAGE, values, strict=True))
    return os.getpid(), {**counters, **LEDGER.totals()}

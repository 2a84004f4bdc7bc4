"""Where a task's seconds go: thread-seconds per phase, and the worker processes' CPU usage.

Each tile task keeps a ``PhaseTimes`` that its threads add to: the product (BLAS or the GPU
kernel), decoding panels (or, decoded on the GPU, reading them compressed), copying results out
of the accumulator, writing bands, and waiting (the task's thread idle until a panel or a write
is ready). The client sums them per job, and reads user/system seconds and page faults of every
worker process before and after the job, so a gap to the peers is explained by a measurement.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterator

PHASES = ("product", "decode", "read", "copy", "write", "wait")
"""Phases of a tile task, in thread-seconds (several threads of a task overlap)."""


class PhaseTimes:
    """Thread-safe sums of seconds per phase."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextlib.contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
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


def process_usage() -> tuple[int, float, float, int]:
    """Runs on each worker: (pid, user s, system s, minor page faults) of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return os.getpid(), usage.ru_utime, usage.ru_stime, usage.ru_minflt

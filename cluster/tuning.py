"""Keep freed memory in the worker process (glibc malloc settings).

Decoding a panel allocates and frees tens of MiB of codec buffers; glibc returns freed memory
to the kernel (trim, or munmap past its mmap threshold), and touching it again costs a page
fault per 4 KiB — on a VM that reclaims freed pages, seconds of system time in a large job.
These settings keep it in the process for reuse; the RSS stays at its peak, which the memory
plan already budgets for. Linux/glibc only; a no-op elsewhere.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
SETTINGS = {
    "MALLOC_TRIM_THRESHOLD_": 2**31 - 1,  # never give the top of the heap back
    "MALLOC_TOP_PAD_": 64 * 2**20,  # grow the heap in 64 MiB steps
    "MALLOC_MMAP_THRESHOLD_": 32 * 2**20,  # glibc's largest: blocks below come from the heap
    "MALLOC_ARENA_MAX": 2,  # few arenas: freed blocks are found again by the next thread
}
"""As environment variables, for worker processes (set before they start)."""
_OPTIONS = {
    "MALLOC_TRIM_THRESHOLD_": M_TRIM_THRESHOLD,
    "MALLOC_TOP_PAD_": M_TOP_PAD,
    "MALLOC_MMAP_THRESHOLD_": M_MMAP_THRESHOLD,
    "MALLOC_ARENA_MAX": M_ARENA_MAX,
}


@functools.cache
def keep_freed_memory() -> bool:
    """Apply SETTINGS to this process with mallopt; True when glibc took them all."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all(mallopt(_OPTIONS[key], value) == 1 for key, value in SETTINGS.items())


def nanny_environ() -> dict[str, str]:
    """dask config for worker processes started by a nanny: the same settings in their
    environment (distributed's own default trims at 64 KiB, the costliest case)."""
    return {f"distributed.nanny.pre-spawn-environ.{k}": str(v) for k, v in SETTINGS.items()}


PROFILER_DEADLOCKS = sys.version_info < (3, 11, 12)
"""CPython before 3.11.12 can hang a whole worker (gh-106883): ``sys._current_frames()``, which
distributed's profiler calls every 10 ms, holds the thread-list lock through a garbage
collection; a GC callback that lets go of the GIL (distributed's own reads /proc) then deadlocks
with any thread that starts or ends. 3.12 runs the GC only between bytecodes."""


def worker_config() -> dict[str, object]:
    """dask config for the servers of a cluster we start: the event loop's health tick once a
    second, not every 20 ms (it only times the loop, to warn when it is blocked for seconds; at
    20 ms it costs a steady share of a core through the job), and no sampling profiler on an
    interpreter where it can deadlock (the dashboard's Profile page stays empty there)."""
    config: dict[str, object] = {"distributed.admin.tick.interval": "1s"}
    if PROFILER_DEADLOCKS:
        config["distributed.worker.profile.enabled"] = False
    return config

"""A worker's memory limit as ``dask worker --memory-limit`` reads it: bytes, a size ("4GiB"), a
fraction of the memory (0.5) or "auto" (the worker's share of the machine by its threads)."""

from __future__ import annotations

import logging
import math

from dask.system import CPU_COUNT
from distributed.worker_memory import parse_memory_limit

from pipeline.errors import UsageError
from pipeline.settings import parse_size

log = logging.getLogger("pipeline")

MemoryLimit = int | float | str
"""A limit as asked: bytes (int), a fraction of the memory in (0, 1] (float) or "auto"."""

EXAMPLES = "e.g. 16GiB, 0.5 (half of the memory) or auto"


def parse_limit(value: object, flag: str = "--memory-limit") -> MemoryLimit | None:
    """``value`` checked and normalised: bytes (a size read by pipeline.settings.parse_size),
    a fraction, "auto", or None (not asked). Zero, negatives and fractions above 1 written as
    floats are refused: they would plan for no memory, or mean bytes by accident."""
    if value is None:
        return None
    given = value
    if isinstance(value, str):
        value = _number(value.strip().lower(), f"{flag} {value!r}")
        if value == "auto":
            return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{flag} {given!r} is not a memory limit; {EXAMPLES}")
    if isinstance(value, float) and value > 1 and value.is_integer():
        value = int(value)  # 1e9: bytes
    if isinstance(value, float):
        if not (0 < value <= 1) or not math.isfinite(value):
            raise UsageError(
                f"{flag} {given!r}: a fraction of the memory is above 0 and at most 1; {EXAMPLES}"
            )
        return value
    if value <= 0:
        raise UsageError(f"{flag} {given!r}: a memory limit is a positive size; {EXAMPLES}")
    return value


def _number(text: str, named: str) -> int | float | str:
    """ "auto", a number as written ("0.5" a fraction, "1000000" or "1e9" bytes), or a size."""
    if text == "auto":
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return parse_size(text)
    except UsageError:
        raise UsageError(f"{named} is not a memory limit; {EXAMPLES}") from None


def local_limit(asked: MemoryLimit | None, threads_per_worker: int) -> int | None:
    """Bytes a worker started on this machine gets, exactly as ``dask worker --memory-limit``
    computes them (fractions and "auto" of the memory this process may use, cgroups
    included); None when not asked."""
    if asked is None:
        return None
    return parse_memory_limit(asked, threads_per_worker, CPU_COUNT, logger=log)


def worker_limit(asked: MemoryLimit | None, worker_bytes: int | None) -> int | None:
    """Bytes to plan for on a running worker whose own limit is ``worker_bytes`` (None: it has
    none): a fraction is of that limit, "auto" is that limit, bytes are bytes."""
    if asked is None or asked == "auto":
        return worker_bytes
    if isinstance(asked, float):
        return int(asked * worker_bytes) if worker_bytes else None
    return int(asked)

"""A device fault in a task: one clear error, and a worker restarted with a fresh CUDA context.

A CUDA error such as an illegal address is sticky: the context that saw it fails every later
call, so a worker that goes on would fail every task it gets after (nvCOMP documents a corrupt
zstd frame as undefined behaviour, which may be such a fault). The task turns any CUDA error
into a DeviceFaultError naming its worker (pipeline.run.staged); the client, on that error,
restarts the worker (through its nanny) before raising it, so a long-lived cluster
(--scheduler) is not left with a poisoned worker.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from pipeline.errors import DeviceFaultError

log = logging.getLogger("pipeline")

CUDA_ERROR_TYPES = ("CudaAPIError", "CudaDriverError", "CUDARuntimeError", "CUDADriverError")
"""Exception class names of numba-cuda's driver and CuPy's runtime/driver errors."""
CUDA_ERROR_WORDS = ("CUDA_ERROR_", "cudaError", "CUDA error", "illegal memory access")
"""What nvCOMP's RuntimeErrors (and others wrapping a CUDA status) say."""


def is_device_fault(error: BaseException) -> bool:
    """True for an error raised by a failed CUDA call (by its class, or its words)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & set(CUDA_ERROR_TYPES)) or any(w in str(error) for w in CUDA_ERROR_WORDS)


def fault_error(error: BaseException, what: str, found: str = "") -> DeviceFaultError:
    """The one error a task raises for a CUDA error ``error`` in ``what`` (``found``: what
    the host found reading the same chunks, when it names one)."""
    worker = _worker_address()
    return DeviceFaultError(
        f"the GPU of worker {worker or 'here'} failed in {what} ({type(error).__name__}: "
        f"{error}){found}; its CUDA context may be lost, so the worker is restarted. With "
        "--gpu-decode, rerun without it to decode every chunk on the host (where a corrupt "
        "one is named); otherwise run `python -m pipeline doctor` on that machine",
        worker,
    )


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except ValueError:  # not in a worker
        return ""


def restart_faulted(client: Any, error: DeviceFaultError) -> None:
    """Restart the worker whose device faulted (its nanny starts a fresh process); a worker
    without a nanny cannot be restarted and is closed, so it takes no more tasks."""
    if not error.worker:
        return
    try:
        client.restart_workers([error.worker], timeout=120, raise_for_error=True)
    except Exception as e:  # noqa: BLE001 - no nanny, or already gone: close it instead
        log.warning("could not restart worker %s (%s); closing it", error.worker, e)
        with contextlib.suppress(Exception):
            client.retire_workers([error.worker], close_workers=True)

"""Jitting and launching with numba-cuda (or its simulator), shared by every kernel of the
backend. numba is imported lazily."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from kernels.cuda.toolkit import check_link

# The simulator keeps its kernel context in a module global: two host threads launching at
# once (Dask worker threads) would make the second launch run as a device function.
_SIMULATOR_LOCK = threading.Lock()


def simulated() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def launch_lock() -> contextlib.AbstractContextManager[Any]:
    """Held around a kernel launch: the simulator keeps its kernel state in a module global."""
    return _SIMULATOR_LOCK if simulated() else contextlib.nullcontext()


@functools.cache
def jit_kernel(kernel: Callable[..., None], launch_bounds: tuple[int, int] | None) -> Any:
    from numba import config, cuda

    if not config.ENABLE_CUDASIM:
        check_link()  # once per kernel and process: a clear error instead of a failed launch
    if launch_bounds is None or config.ENABLE_CUDASIM:  # the simulator's jit has no bounds
        return cuda.jit(kernel)
    return cuda.jit(kernel, launch_bounds=launch_bounds)

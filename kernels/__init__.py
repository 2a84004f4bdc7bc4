"""Block-product backends. Nothing here knows about Dask or Zarr; numba is imported lazily.

The package's face is lazy (PEP 562): ``import kernels.cuda.launch`` loads no backend.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Accumulator": "kernels.backends",
    "BACKENDS": "kernels.backends",
    "BackendSpec": "kernels.backends",
    "GPU_DTYPES": "kernels.constants",
    "get_backend": "kernels.backends",
    "make_accumulator": "kernels.backends",
    "probe_devices": "kernels.backends",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

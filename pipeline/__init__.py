"""Zarr → Dask tiles → GPU (Numba CUDA) or CPU (BLAS) kernels → Zarr matrix multiply.

    plan (pipeline.plan, pure) → run (pipeline.run: client side, worker side) → kernels
    store (pipeline.store: the inputs read-only, the output's one owner)

The package's face is lazy (PEP 562): ``import pipeline.plan`` loads no dask or zarr.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MatmulJob": "pipeline.job",
    "MultiplyResult": "pipeline.job",
    "PipelineError": "pipeline.errors",
    "VerifyResult": "pipeline.verify.check",
    "gram": "pipeline.gramian",
    "multiply": "pipeline.api",
    "prepare": "pipeline.api",
    "verify_product": "pipeline.verify.check",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

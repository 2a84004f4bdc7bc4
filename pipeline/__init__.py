"""Zarr → Dask tiles → GPU (Numba CUDA) or CPU (BLAS) kernels → Zarr matrix multiply.

    import pipeline

    result = pipeline.multiply("a.zarr", "b.zarr", "c.zarr")  # starts a local cluster, closes it
    result  # <MultiplyResult 4096x4096 float32: 16 tiles computed, 0 skipped, ...>
    job = pipeline.prepare("a.zarr", "b.zarr", "c.zarr", overwrite=True, dtype="float64")
    print(job)  # the plan; nothing started or written yet
    result = job.execute()  # job.execute(client) runs it on a cluster of yours
    g = pipeline.gram("x.zarr", "g.zarr")  # G = Xᵀ·X at about half the work
    pcs = pipeline.pca("x.zarr", "pcs.zarr", components=10)  # pcs.to_xarray()
    help(pipeline.multiply)  # every keyword option and its default

Errors are ``pipeline.PipelineError`` subclasses that also inherit the builtin a caller
expects (``FileExistsError``, ``ValueError``...); their messages name the keywords to pass.

    plan (pipeline.plan, pure) → run (pipeline.run: client side, worker side) → kernels
    store (pipeline.store: the inputs read-only, the output's one owner)

The package's face is lazy (PEP 562): ``import pipeline.plan`` loads no dask or zarr.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

_EXPORTS = {
    "DecompositionJob": "pipeline.decompose",
    "DecompositionResult": "pipeline.decompose",
    "MatmulJob": "pipeline.job",
    "MultiplyResult": "pipeline.job",
    "PipelineError": "pipeline.errors",
    "VerifyResult": "pipeline.verify.check",
    "gram": "pipeline.gramian",
    "multiply": "pipeline.api",
    "pca": "pipeline.decompose",
    "prepare_decomposition": "pipeline.decompose",
    "prepare": "pipeline.api",
    "prepare_gram": "pipeline.gramian",
    "svd": "pipeline.decompose",
    "verify_product": "pipeline.api",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    """The exports before they are loaded (tab completion, ``help(pipeline)``), the dunders and
    the submodules loaded so far."""
    shown = {name for name in globals() if name.startswith("__")}
    shown |= {
        name
        for name, value in globals().items()
        if isinstance(value, ModuleType) and value.__name__.startswith(f"{__name__}.")
    }
    return sorted(shown | set(__all__))

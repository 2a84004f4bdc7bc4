"""``import tilegemm``: the same API as ``import pipeline`` (the distribution is
zarr-tilegemm, the command ``tilegemm``; the code lives in ``pipeline``, ``kernels`` and
``cluster``).

    import tilegemm

    result = tilegemm.multiply("a.zarr", "b.zarr", "c.zarr")
    g = tilegemm.gram(embeddings, "g.zarr", scale=True)  # a numpy or dask array, or Zarr

Lazy as ``pipeline`` is (PEP 562): importing it loads no dask or zarr until a name is used.
"""

from __future__ import annotations

from typing import Any

import pipeline

__all__ = list(pipeline.__all__)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'tilegemm' has no attribute {name!r}")
    return getattr(pipeline, name)


def __dir__() -> list[str]:
    """The exports before they are loaded (tab completion, ``help(tilegemm)``) and the
    dunders."""
    return sorted({name for name in globals() if name.startswith("__")} | set(__all__))

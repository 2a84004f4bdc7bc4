"""Start a local cluster (LocalCUDACluster or LocalCluster) or connect to an existing one.

Lazy (PEP 562): ``import cluster.spec`` stays pure; distributed loads with ``cluster.lifecycle``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ClusterSpec": "cluster.spec",
    "local_cluster_options": "cluster.spec",
    "connect": "cluster.lifecycle",
    "count_gpus": "cluster.lifecycle",
    "start": "cluster.lifecycle",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cluster' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

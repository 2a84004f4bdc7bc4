"""Preloaded into each worker of a local cluster (dask config ``distributed.worker.preload``):
its HTTP server (/health, /metrics, ...) answers only requests whose Host header names a
loopback host, as the dashboard does (cluster.security): a page served under a name that
resolves to 127.0.0.1 (DNS rebinding) can't read it.

distributed runs ``dask_setup`` right after the worker's HTTP server starts listening, before
the worker registers (and so before its port is known to anyone), with no await between.
"""

from __future__ import annotations

from typing import Any

from cluster.security import dashboard_origins, refuse_foreign_hosts
from cluster.spec import LOOPBACK

PRELOAD = __name__
"""The module name to preload."""


def dask_setup(worker: Any) -> None:
    """Refuse requests naming another host on ``worker``'s HTTP server."""
    origins = dashboard_origins(LOOPBACK, worker.http_server.port, [])
    refuse_foreign_hosts(worker.http_application, origins)

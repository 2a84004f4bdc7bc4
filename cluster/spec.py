"""What cluster to start or join, and the pure mapping of that onto cluster keyword arguments."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from pipeline.errors import UsageError

LOOPBACK = "127.0.0.1"
"""Where every listener of a local cluster binds (scheduler, workers, nannies, dashboard)."""


@dataclass(frozen=True)
class ClusterSpec:
    scheduler: str | None = None
    """Address of an existing scheduler; None (and no ``scheduler_file``) starts a local one."""
    scheduler_file: str | None = None
    """The JSON file an existing scheduler wrote its address to (``dask scheduler
    --scheduler-file``, dask-jobqueue, dask-mpi): the HPC way to find it."""
    workers: int | None = None
    """Local worker processes; None means one per GPU, or one on a CPU-only machine."""
    threads_per_worker: int | None = None
    """None means 1 per GPU worker, or every core on the CPU worker."""
    dashboard_address: str = "127.0.0.1:8787"
    """HOST:PORT of a local cluster's dashboard; HOST on loopback (empty means 127.0.0.1)."""

    def __post_init__(self) -> None:
        if self.scheduler and self.scheduler_file:
            # Said without flags or keywords: the command line and Python both build a spec.
            raise UsageError(
                "a scheduler address and a scheduler file both name a scheduler; give one of them"
            )
        host, port = split_dashboard_address(self.dashboard_address)
        if not self.existing and not is_loopback(host):
            raise UsageError(
                f"dashboard address {self.dashboard_address!r} is not on loopback: a local "
                "cluster listens on 127.0.0.1 only; give 127.0.0.1:PORT or localhost:PORT and "
                f"reach it from another machine through SSH: ssh -L {port}:127.0.0.1:{port} HOST"
            )

    @property
    def existing(self) -> bool:
        """Join a running scheduler (by address or scheduler file) rather than start one."""
        return bool(self.scheduler or self.scheduler_file)


def split_dashboard_address(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT``; the host may be empty. UsageError otherwise."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535 or ":" in host or "," in host:
        raise UsageError(
            f"dashboard address {address!r} is not HOST:PORT (an IPv4 address or a name, and "
            "a port from 0 to 65535), e.g. 127.0.0.1:8787, or 127.0.0.1:0 for any free port"
        )
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Empty (taken as 127.0.0.1 here), localhost, or an address in 127.0.0.0/8."""
    if host in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: its addresses are not ours to resolve here
        return False


WORKER_MEMORY = {
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.target": False,
}
"""dask config of the workers we start, CPU and GPU alike. The plan keeps host memory (pinned
staging included, which counts in a GPU worker's RSS) within the limit; distributed's pause (at
80 % of it, measured on the whole process) and spilling would only stall the job. The nanny's
terminate (95 %) stays: the last guard against a plan that is wrong."""


def local_cluster_options(
    spec: ClusterSpec, gpus: int, cpus: int, memory_limit: int | float | str | None = None
) -> tuple[str, dict[str, Any]]:
    """("cuda" | "cpu", keyword arguments for LocalCUDACluster | LocalCluster).

    ``memory_limit`` is per worker as ``dask worker --memory-limit`` takes it (bytes, a
    fraction or "auto"); None lets distributed split the machine's memory.
    Several processes talk TLS with credentials made for this cluster (``security=True``:
    ``Security.temporary()``), so other users of the host can't join it or run code on it.
    """
    host, port = split_dashboard_address(spec.dashboard_address)
    common: dict[str, Any] = {
        "host": LOOPBACK,
        "dashboard_address": f"{host or LOOPBACK}:{port}",  # ":PORT" would bind 0.0.0.0
        # No bokeh pages on the workers: the scheduler's show every worker, and theirs would
        # take websockets from any origin (their ports are unknown until they start).
        "worker_dashboard_address": None,
        "memory_limit": memory_limit or "auto",
        # Bokeh's slow import would hold up the start: the scheduler's dashboard is
        # attached once the cluster runs, for its own origin only (cluster.lifecycle).
        "scheduler_kwargs": {"dashboard": False},
    }
    tls = {**common, "security": True, "protocol": "tls://"}
    if gpus > 0:
        workers = min(spec.workers or gpus, gpus)  # one worker per GPU, never more
        return "cuda", {
            **tls,
            "n_workers": workers,
            "threads_per_worker": spec.threads_per_worker or 1,
            # Our tasks size device memory themselves (tiles, panels, staging): no dask-cuda
            # spilling store between them and the GPU, and no device LRU limit.
            "data": dict,
            "device_memory_limit": 0,
        }
    workers = spec.workers or 1
    threads = spec.threads_per_worker or max(cpus // workers, 1)
    if workers > 1:
        return "cpu", {
            **tls,
            "n_workers": workers,
            "threads_per_worker": threads,
            "processes": True,
        }
    # One worker runs in-process: no spawn (seconds of start-up) and no pickling of tiles; the
    # BLAS calls and zarr codecs release the GIL. The in-process transport opens no socket
    # (and takes no host); the worker's HTTP server is put on loopback by cluster.lifecycle.
    options = {**common, "n_workers": 1, "threads_per_worker": threads, "processes": False}
    del options["host"]
    return "cpu", options

"""What cluster to start or join, and the pure mapping of that onto cluster keyword arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClusterSpec:
    scheduler: str | None = None
    """Address of an existing scheduler; None starts a local cluster."""
    workers: int | None = None
    """Local worker processes; None means one per GPU, or one on a CPU-only machine."""
    threads_per_worker: int | None = None
    """None means 1 per GPU worker, or every core on the CPU worker."""
    dashboard_address: str = "127.0.0.1:8787"


def local_cluster_options(
    spec: ClusterSpec, gpus: int, cpus: int, memory_limit_bytes: int | None = None
) -> tuple[str, dict[str, Any]]:
    """("cuda" | "cpu", keyword arguments for LocalCUDACluster | LocalCluster).

    ``memory_limit_bytes`` is per worker; None lets distributed split the machine's memory.
    """
    common: dict[str, Any] = {
        "host": "127.0.0.1",
        "dashboard_address": spec.dashboard_address,
        "worker_dashboard_address": "127.0.0.1:0",
        "memory_limit": memory_limit_bytes or "auto",
    }
    if gpus > 0:
        workers = min(spec.workers or gpus, gpus)  # one worker per GPU, never more
        return "cuda", {
            **common,
            "n_workers": workers,
            "threads_per_worker": spec.threads_per_worker or 1,
        }
    workers = spec.workers or 1
    threads = spec.threads_per_worker or max(cpus // workers, 1)
    # One worker runs in-process: no spawn (~2 s of start-up) and no pickling of tiles; the
    # BLAS calls and zarr codecs release the GIL. Several workers get processes of their own.
    options = {**common, "n_workers": workers, "threads_per_worker": threads}
    if workers == 1:
        del options["host"]  # in-process transport: nothing listens but the dashboard
        # Bokeh's import (~0.3 s) would hold up the start: the scheduler's dashboard is
        # attached once the cluster runs (cluster.lifecycle); no separate worker dashboard.
        options["scheduler_kwargs"] = {"dashboard": False}
        options["worker_dashboard_address"] = None
    return "cpu", {**options, "processes": workers > 1}

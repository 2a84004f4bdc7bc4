"""cluster.spec.local_cluster_options: the pure mapping of a ClusterSpec onto cluster kwargs."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import ClusterSpec, local_cluster_options

GiB = 2**30


@pytest.mark.parametrize(
    ("workers", "threads", "gpus", "cpus", "want"),
    [
        # GPUs visible: one worker per GPU, one thread each
        (None, None, 1, 8, ("cuda", 1, 1)),
        (None, None, 4, 32, ("cuda", 4, 1)),
        # fewer workers than GPUs asked for: honoured
        (2, None, 4, 32, ("cuda", 2, 1)),
        # more workers than GPUs asked for: capped at one per GPU
        (8, None, 2, 32, ("cuda", 2, 1)),
        (3, None, 1, 2, ("cuda", 1, 1)),
        # threads per GPU worker passed through
        (None, 4, 2, 32, ("cuda", 2, 4)),
        # no GPU: one CPU worker gets every core
        (None, None, 0, 8, ("cpu", 1, 8)),
        (None, None, 0, 1, ("cpu", 1, 1)),
        # CPU workers split the cores between them (floor division)
        (2, None, 0, 8, ("cpu", 2, 4)),
        (3, None, 0, 8, ("cpu", 3, 2)),
        # more workers than cores: still at least one thread each
        (4, None, 0, 2, ("cpu", 4, 1)),
        # explicit threads win over the split
        (2, 3, 0, 8, ("cpu", 2, 3)),
        # a negative GPU count (no driver) is treated as no GPU
        (None, None, -1, 4, ("cpu", 1, 4)),
    ],
)
def test_workers_and_threads(
    workers: int | None, threads: int | None, gpus: int, cpus: int, want: tuple[str, int, int]
) -> None:
    spec = ClusterSpec(workers=workers, threads_per_worker=threads)
    kind, options = local_cluster_options(spec, gpus, cpus)
    assert (kind, options["n_workers"], options["threads_per_worker"]) == want
    if kind == "cuda":
        assert options["n_workers"] <= gpus
    # GPU workers and several CPU workers: a process each (own GIL, own CUDA context);
    # a lone CPU worker runs in-process (no spawn, no pickling of tiles)
    in_process = kind == "cpu" and options["n_workers"] == 1
    assert options.get("processes", True) is not in_process


@pytest.mark.parametrize(
    ("limit", "gpus", "want"),
    [
        # default: let distributed split the host's memory
        (None, 0, "auto"),
        (None, 2, "auto"),
        # bytes passed through unchanged, CPU and GPU
        (4 * GiB, 0, 4 * GiB),
        (123_456_789, 2, 123_456_789),
    ],
)
def test_memory_limit_passthrough(limit: int | None, gpus: int, want: Any) -> None:
    _, options = local_cluster_options(ClusterSpec(), gpus, 8, limit)
    assert options["memory_limit"] == want


@pytest.mark.parametrize(("gpus", "workers"), [(0, 1), (0, 2), (1, 1), (4, None)])
@pytest.mark.parametrize(
    "dashboard",
    [
        # the default
        "127.0.0.1:8787",
        # a random free port, as tests pass
        "127.0.0.1:0",
    ],
)
def test_listens_on_loopback_only(gpus: int, workers: int | None, dashboard: str) -> None:
    spec = ClusterSpec(workers=workers, dashboard_address=dashboard)
    _, options = local_cluster_options(spec, gpus, 4)
    if options.get("processes", True):
        assert options["host"] == "127.0.0.1"
    else:  # in-process transport: no scheduler or worker socket at all
        assert options.get("host", "127.0.0.1") == "127.0.0.1"
    assert options["dashboard_address"] == dashboard
    # worker dashboards (when any: the in-process worker has none) listen on loopback too
    assert options["worker_dashboard_address"] in (None,) or options[
        "worker_dashboard_address"
    ].startswith("127.0.0.1:")


def test_default_spec_starts_a_local_cluster_on_loopback() -> None:
    spec = ClusterSpec()
    assert spec.scheduler is None
    assert spec.dashboard_address.startswith("127.0.0.1:")

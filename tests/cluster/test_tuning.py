"""Workers keep freed memory: glibc settings in the in-process worker and in worker processes."""

from __future__ import annotations

import os

import dask
import pytest

from cluster.lifecycle import start
from cluster.spec import ClusterSpec
from cluster.tuning import PROFILER_DEADLOCKS, SETTINGS, keep_freed_memory


def _environ() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in SETTINGS}


def test_mallopt_takes_the_settings() -> None:
    assert keep_freed_memory() is True


def test_worker_processes_start_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # distributed lets the parent's environment win over the config (a user's own setting);
    # other tests' nannies may have left distributed's defaults in this process's environment
    for key in SETTINGS:
        monkeypatch.delenv(key, raising=False)
    spec = ClusterSpec(workers=2, threads_per_worker=1, dashboard_address=":0")
    with start(spec, 2**30) as client:
        seen = client.run(_environ)
    assert len(seen) == 2
    for environ in seen.values():
        assert environ == {k: str(v) for k, v in SETTINGS.items()}


def _profiling(dask_worker: object) -> bool:
    return "profile" in dask_worker.periodic_callbacks  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "processes"])
def test_no_worker_profiler_where_it_deadlocks(workers: int) -> None:
    # The suite itself turns the profiler off (conftest); switch it back on to see start() do it.
    # 1 worker on 2 cpus runs in this process, 2 workers in processes (local_cluster_options).
    spec = ClusterSpec(workers=workers, threads_per_worker=1, dashboard_address=":0")
    with (
        dask.config.set({"distributed.worker.profile.enabled": True}),
        start(spec, 2**30) as client,
    ):
        profiling = set(client.run(_profiling).values())
    assert profiling == {not PROFILER_DEADLOCKS}


def test_the_suite_runs_its_clusters_as_start_does() -> None:
    assert dask.config.get("distributed.worker.profile.enabled") is not PROFILER_DEADLOCKS


def _tick_ms(dask_worker: object) -> float:
    return float(dask_worker.periodic_callbacks["tick"].callback_time)  # type: ignore[attr-defined]


def _scheduler_tick_ms(dask_scheduler: object) -> float:
    return _tick_ms(dask_scheduler)


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "processes"])
def test_event_loop_ticks_once_a_second(workers: int) -> None:
    # distributed's default (20 ms) costs a steady share of a core on an idle cluster
    spec = ClusterSpec(workers=workers, threads_per_worker=1, dashboard_address=":0")
    with (
        dask.config.set({"distributed.admin.tick.interval": "20ms"}),
        start(spec, 2**30) as client,
    ):
        ticks = set(client.run(_tick_ms).values()) | {client.run_on_scheduler(_scheduler_tick_ms)}
    assert ticks == {1000.0}

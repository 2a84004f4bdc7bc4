"""A job's plan from its options and the machine's facts: the cores and memory this process
may use (a container's limits, as dask and distributed count them) and the cost model."""

from __future__ import annotations

from dataclasses import replace

import dask.system
import distributed.system
import pytest

from cluster.spec import ClusterSpec
from pipeline.facts import host, job_plan
from pipeline.facts.job_plan import plan_for
from pipeline.options.job_options import JobOptions
from pipeline.plan.fitted_costs import COSTS
from pipeline.plan.spec import ArraySpec

GiB = 2**30
SQUARE = ArraySpec((2048, 2048), (256, 256), "float32")


def test_the_host_counts_as_dask_and_distributed_do() -> None:
    """Affinity and cgroup quotas for the cores, cgroup and RLIMIT_RSS limits for memory."""
    assert host.usable_cores() == dask.system.CPU_COUNT
    assert host.usable_memory_bytes() == distributed.system.MEMORY_LIMIT


@pytest.mark.parametrize(
    ("cluster", "threads", "limit"),
    [
        (ClusterSpec(), 3, 6 * GiB),  # one worker: every core, all the memory
        (ClusterSpec(workers=2), 1, 3 * GiB),  # each worker its share
        (ClusterSpec(workers=2, threads_per_worker=4), 4, 3 * GiB),  # threads as asked
    ],
)
def test_a_plan_before_the_cluster_is_sized_to_the_container(
    monkeypatch: pytest.MonkeyPatch, cluster: ClusterSpec, threads: int, limit: int
) -> None:
    """A container of 3 cores and 6 GiB on a larger host: planned for the container."""
    monkeypatch.setattr(job_plan, "usable_cores", lambda: 3)
    monkeypatch.setattr(job_plan, "usable_memory_bytes", lambda: 6 * GiB)
    plan = plan_for(SQUARE, SQUARE, JobOptions(cluster=cluster), None, None)
    assert (plan.workers, plan.threads_per_worker) == (cluster.workers or 1, threads)
    assert plan.memory_limit_bytes == limit


def test_the_live_cluster_without_limits_falls_back_to_this_hosts_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(job_plan, "usable_memory_bytes", lambda: 6 * GiB)
    live = {"workers": 2, "threads": 2, "memory_limit": None}
    plan = plan_for(SQUARE, SQUARE, JobOptions(), None, live)
    assert (plan.workers, plan.threads_per_worker, plan.memory_limit_bytes) == (2, 2, 6 * GiB)


def test_the_cost_model_given_is_the_one_planned_with() -> None:
    """None: this host's (the committed calibration while the host probe is off, as in the
    suite); a model passed in is carried by the plan."""
    assert plan_for(SQUARE, SQUARE, JobOptions(), None, None).costs is COSTS
    slower = replace(COSTS, flops_per_second=COSTS.flops_per_second / 4)
    plan = plan_for(SQUARE, SQUARE, JobOptions(), None, None, costs=slower)
    assert plan.costs is slower

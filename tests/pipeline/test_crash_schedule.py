"""``--accumulate`` stopped at every step boundary of its protocol (SIGKILL to the whole job,
SIGINT or SIGTERM to the command), then verify, a new --accumulate and --resume: C is only ever
the old C, the new C or resumable to the new C (tests/pipeline/crash_schedule.py). A fixed
schedule here; ``make fuzz-crash`` runs a seeded random one for as long as asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from tests.pipeline.crash_schedule import Case, fixed_schedule, run_case


@pytest.fixture(scope="module")
def recovery_client() -> Iterator[Client]:
    """The commands run after each stop: one worker of two threads, as the stopped job had."""
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:  # fmt: skip
        yield client


@pytest.mark.parametrize("case", fixed_schedule(), ids=str)
def test_a_stop_at_every_step_leaves_the_old_c_the_new_c_or_a_resumable_one(
    tmp_path: Path, recovery_client: Client, case: Case
) -> None:
    outcome = run_case(case, tmp_path / "case", recovery_client)
    assert not outcome.violations, "\n".join(outcome.violations)
    assert outcome.reached, f"{case} was never reached: the schedule would test nothing"

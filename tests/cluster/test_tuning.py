"""Workers keep freed memory: glibc settings in the in-process worker and in worker processes."""

from __future__ import annotations

import os

import pytest

from cluster import ClusterSpec, start
from cluster.tuning import SETTINGS, keep_freed_memory


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

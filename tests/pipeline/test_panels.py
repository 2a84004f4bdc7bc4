"""The worker's shared panel cache: one decode per panel, bounded bytes, errors not cached."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

from pipeline.run.panel_cache import PanelCache


def test_concurrent_requests_decode_once() -> None:
    cache, calls = PanelCache(10**6), []
    cache.use("run", 10**6)

    def load() -> np.ndarray:
        calls.append(threading.get_ident())
        time.sleep(0.2)  # the other requests arrive while this decode runs
        return np.ones(10)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: cache.get("k", load), range(4)))
    assert len(calls) == 1
    assert sorted(mine for _, mine in results) == [False, False, False, True]
    assert all(panel is results[0][0] for panel, _ in results)


def test_budget_evicts_least_recently_used() -> None:
    cache = PanelCache()
    cache.use("run", 2 * 800)  # room for two 100-element float64 panels
    for key in ("a", "b", "c"):
        cache.get(key, lambda: np.zeros(100))
    _, mine = cache.get("c", lambda: np.zeros(100))
    assert mine is False  # newest kept
    _, mine = cache.get("a", lambda: np.zeros(100))
    assert mine is True  # oldest evicted, decoded again


def test_zero_budget_disables_caching() -> None:
    cache = PanelCache()
    cache.use("run", 0)
    assert cache.get("k", lambda: np.zeros(3))[1] is True
    assert cache.get("k", lambda: np.zeros(3))[1] is True


def test_a_new_job_drops_old_panels() -> None:
    cache = PanelCache()
    cache.use("job-1", 10**6)
    cache.get("k", lambda: np.zeros(3))
    cache.use("job-2", 10**6)
    assert cache.get("k", lambda: np.ones(3))[0][0] == 1


def test_failed_decode_is_not_cached() -> None:
    cache = PanelCache()
    cache.use("run", 10**6)

    def broken() -> np.ndarray:
        raise OSError("corrupt chunk")

    with pytest.raises(OSError, match="corrupt chunk"):
        cache.get("k", broken)
    assert cache.get("k", lambda: np.zeros(2))[1] is True


def test_release_frees_only_its_own_job() -> None:
    cache = PanelCache()
    cache.use("job-1", 10**6)
    cache.get("k", lambda: np.zeros(100))
    assert cache.release("job-0") == 0  # an older job's release must not drop job-1's panels
    assert cache.release("job-1") == 800
    assert cache.get("k", lambda: np.ones(3))[1] is True


def test_workers_hold_no_panels_after_a_job(tmp_path: Path, client: Client) -> None:
    """A long-lived cluster must not keep a finished job's decoded panels (up to half the
    worker's memory by default) until the next job."""
    from pipeline import multiply
    from tests.helpers import random_matrix, write_array

    rng = np.random.default_rng(2)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (300, 700), "float32"), (100, 100))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (700, 200), "float32"), (100, 100))
    result = multiply(a, b, str(tmp_path / "c.zarr"), client=client)
    assert result.plan.cache_bytes > 0

    def cached_bytes() -> int:  # nested: pickled by value, runs on each worker
        from pipeline.run.panel_cache import CACHE

        return CACHE._bytes

    held = client.run(cached_bytes)
    assert held and all(v == 0 for v in held.values()), held

"""--memory-limit read as `dask worker` reads it: bytes, sizes, fractions and "auto"."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from dask.system import CPU_COUNT
from distributed.system import MEMORY_LIMIT
from distributed.worker_memory import parse_memory_limit

from cluster.memory import local_limit, parse_limit, worker_limit
from cluster.spec import ClusterSpec
from pipeline.api import prepare
from pipeline.errors import UsageError
from pipeline.plan.units import format_bytes
from tests.helpers import random_matrix, run_cli, write_array

DASK = logging.getLogger("test")


@pytest.mark.parametrize(
    ("given", "asked"),
    [
        ("0.5", 0.5),
        (0.5, 0.5),
        ("1.0", 1.0),
        ("auto", "auto"),
        (" AUTO ", "auto"),
        ("4GiB", 4 * 2**30),
        ("512MB", 512 * 10**6),
        ("1e9", 10**9),
        ("100000000", 10**8),
        (2**30, 2**30),
        (None, None),
    ],
)
def test_what_is_asked(given: object, asked: object) -> None:
    assert parse_limit(given) == asked


@pytest.mark.parametrize("given", ["0.5", "auto", "4GiB", "1e9", 2**30, "0.25"])
@pytest.mark.parametrize("threads", [1, 2, 64])
def test_a_local_worker_gets_what_dask_worker_would(given: object, threads: int) -> None:
    """The same call dask worker makes for its --memory-limit: `0.5` is half the memory, not
    zero bytes (and so no limit), `auto` the worker's share by its threads."""
    want = parse_memory_limit(given, threads, CPU_COUNT, logger=DASK)  # type: ignore[arg-type]
    assert local_limit(parse_limit(given), threads) == want
    assert want


def test_half_is_half_of_the_memory() -> None:
    assert local_limit(parse_limit("0.5"), 1) == int(0.5 * MEMORY_LIMIT)
    share = int(MEMORY_LIMIT * min(1, 1 / CPU_COUNT))
    assert local_limit(parse_limit("auto"), 1) == share


def test_a_running_worker_shares_its_own_limit() -> None:
    assert worker_limit(0.5, 8 * 2**30) == 4 * 2**30
    assert worker_limit("auto", 8 * 2**30) == 8 * 2**30
    assert worker_limit(2**30, 8 * 2**30) == 2**30
    assert worker_limit(None, 8 * 2**30) == 8 * 2**30
    assert worker_limit(0.5, None) is None


@pytest.mark.parametrize(
    "given", ["0", "-1", "1.5", "x", "4 parsecs", 0, -5, True, "nan", 2.5, "", "-4GiB"]
)
def test_nonsense_is_refused_with_examples(given: object) -> None:
    with pytest.raises(UsageError, match=r"--memory-limit .*e\.g\. 16GiB, 0\.5"):
        parse_limit(given)


@pytest.mark.parametrize("asked", [0.5, "0.5", "auto", "2GiB"])
def test_the_plan_is_made_for_that_limit(tmp_path: Path, asked: object) -> None:
    """Before a cluster: a local worker's limit, as dask worker would set it for the threads
    the local cluster gives it (here one worker of two threads)."""
    rng = np.random.default_rng(0)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (40, 30), "float32"), (10, 10))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (30, 20), "float32"), (10, 10))
    cluster = ClusterSpec(workers=1, threads_per_worker=2)
    job = prepare(a_url, b_url, str(tmp_path / "c.zarr"), memory_limit=asked, cluster=cluster)  # type: ignore[arg-type]
    want = parse_memory_limit(asked, 2, CPU_COUNT, logger=DASK)  # type: ignore[arg-type]
    assert job.plan.memory_limit_bytes == want


def test_the_command_line_takes_a_fraction(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (8, 6), "float32"), (4, 4))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (6, 5), "float32"), (4, 4))
    out = tmp_path / "c.zarr"
    done = run_cli(
        "multiply", a_url, b_url, str(out), "--memory-limit", "0.5", "--workers", "1",
        "--threads-per-worker", "1", "--dry-run",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert format_bytes(int(0.5 * MEMORY_LIMIT)) in done.stdout, done.stdout
    assert not out.exists()
    bad = run_cli("multiply", a_url, b_url, str(out), "--memory-limit", "1.5", "--dry-run")
    assert bad.returncode == 2 and "at most 1" in bad.stderr, bad.stderr

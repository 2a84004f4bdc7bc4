"""The CPU-seconds ledger: kinds measured where the work runs, nested regions charged once,
and a job's rows summing to its workers' user + system seconds."""

from __future__ import annotations

import re
import resource
import threading
import time
from pathlib import Path

import numpy as np
from distributed import Client

from pipeline import multiply
from pipeline.cputime import GEMM_THREADS, ROWS, Ledger, account, thread_seconds
from tests.helpers import random_matrix, run_cli, write_array


def _spin(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time, however fast the machine or busy its cores
    (a fixed iteration count takes twice as long on one host as on another); the clock is read
    once per 100,000 iterations, so the time is user time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        for _ in range(100_000):
            pass


def _user() -> float:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_utime


def test_nested_regions_are_charged_once() -> None:
    ledger = Ledger()
    started = _user()
    with ledger.measure("product"):
        _spin(0.1)
        with ledger.measure("decode"):
            _spin(0.2)
        _spin(0.1)
    spent, totals = _user() - started, ledger.totals()
    assert abs(totals["product"] + totals["decode"] - spent) < 0.02, (spent, totals)
    assert 0.35 < totals["decode"] / spent < 0.65, (spent, totals)  # half the work, not all
    assert totals["copy"] == 0.0 and totals["in_zarr"] == 0.0


def test_sleeping_and_other_threads_cost_nothing() -> None:
    ledger = Ledger()
    spinner = threading.Thread(target=_spin, args=(0.2,))
    with ledger.measure("copy"):
        spinner.start()
        time.sleep(0.2)  # another thread's CPU is not this one's
        spinner.join()
    assert ledger.totals()["copy"] < 0.02


def test_on_zarrs_threads_is_counted_apart() -> None:
    ledger = Ledger()

    def work() -> None:
        with ledger.measure("decode"):
            _spin(0.1)

    thread = threading.Thread(target=work, name="zarr_pool_0")
    thread.start()
    thread.join()
    assert ledger.totals()["in_zarr"] == ledger.totals()["decode"] > 0.005


def test_rows_sum_to_user_plus_system() -> None:
    kinds = {"product": 5.0, "decode": 1.0, "copy": 0.5, "write": 0.25, "in_zarr": 0.75}
    rows = account(9.0, 2.0, kinds, zarr_user=1.5)
    assert rows == {
        "product": 5.0, "decode": 1.0, "copy": 0.5, "write": 0.25,
        "zarr": 0.75,  # zarr's threads less the decoding measured on them
        "system": 2.0, "other": 1.5,
    }  # fmt: skip
    assert sum(rows.values()) == 11.0


def test_the_shared_gemm_threads_are_the_product() -> None:
    rows = account(9.0, 2.0, {"product": 0.5, "decode": 1.0}, zarr_user=0.0, gemm_user=4.5)
    assert rows["product"] == 5.0 and rows["other"] == 3.0 and sum(rows.values()) == 11.0
    # a pool replaced during a job (another cluster's thread count) loses its threads' seconds
    assert account(9.0, 2.0, {"product": 0.5}, zarr_user=0.0, gemm_user=-1.0)["product"] == 0.5


def test_thread_seconds_reads_the_named_threads_only() -> None:
    before = thread_seconds(GEMM_THREADS)[0]
    named = threading.Thread(target=_spin, args=(0.3,), name=f"{GEMM_THREADS[0]}9")
    other = threading.Thread(target=_spin, args=(0.3,), name="someone_else")
    seen: list[float] = []
    for thread in (named, other):
        thread.start()
    while named.is_alive():  # a thread's seconds are read while it lives
        seen.append(thread_seconds(GEMM_THREADS)[0] - before)
        time.sleep(0.01)
    other.join()
    assert 0.1 < max(seen) < 0.45, max(seen)  # one spinner's, not both


def test_a_job_accounts_its_cpu_seconds(tmp_path: Path, client: Client) -> None:
    # Big enough that every kind spans many scheduler ticks: a thread's user/system split is
    # sampled per tick by Linux (their sum is exact), so a few-ms kind can read 0.
    rng = np.random.default_rng(7)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (1536, 2048), "float32"), (512, 512))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (2048, 1536), "float32"), (512, 512))
    usage = multiply(a, b, str(tmp_path / "c.zarr"), client=client).usage
    rows = {row: usage[f"cpu_{row}"] for row in ROWS}
    total = usage["user_seconds"] + usage["system_seconds"]
    assert abs(sum(rows.values()) - total) < 1e-6, rows
    assert rows["product"] > 0 and rows["decode"] > 0, rows
    assert rows["product"] + rows["decode"] <= usage["user_seconds"] + 0.02, rows


def test_cli_prints_cpu_seconds_by_kind(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (256, 384), "float32"), (128, 128))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (384, 256), "float32"), (128, 128))
    done = run_cli(
        "multiply", a, b, str(tmp_path / "c.zarr"), "--dashboard-address", ":0",
        "--workers", "1", "--threads-per-worker", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("time:")]
    usage = re.search(r"user ([\d.]+) s, system ([\d.]+) s", line)
    kinds = re.search(", ".join(rf"{row} (-?[\d.]+) CPU-s" for row in ROWS), line)
    assert usage and kinds, line
    total = float(usage.group(1)) + float(usage.group(2))
    assert abs(sum(float(x) for x in kinds.groups()) - total) <= 0.005 * len(ROWS) + 1e-9, line

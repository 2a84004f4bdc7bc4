"""The accounting: thread-seconds per phase and the workers' CPU usage of a job."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
from distributed import Client, get_task_stream

from pipeline import multiply
from pipeline.run.timing import PHASES, PhaseTimes, add_phases
from tests.helpers import random_matrix, run_cli, write_array


def test_phase_times_sum_across_threads() -> None:
    clock = PhaseTimes()

    def work() -> None:
        with clock.measure("decode"):
            time.sleep(0.05)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with clock.measure("product"):
        time.sleep(0.02)
    seconds = clock.as_dict()
    assert 0.15 <= seconds["decode"] < 0.5  # three threads' sleeps add up
    assert 0.02 <= seconds["product"] < 0.2
    assert seconds["write"] == 0.0
    assert list(add_phases({"wait": 1.0}, seconds)) == list(PHASES)


def test_a_job_reports_where_its_time_went(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(3)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (400, 600), "float64"), (100, 150))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (600, 300), "float64"), (150, 100))
    with get_task_stream(client) as stream:
        result = multiply(a, b, str(tmp_path / "c.zarr"), client=client)
    assert set(result.phases) == set(PHASES)
    assert result.phases["product"] > 0 and result.phases["decode"] > 0
    assert result.phases["write"] > 0
    assert result.usage["user_seconds"] > 0 and result.usage["page_faults"] > 0
    # Phases are thread-seconds of the job's tasks: at most each task's run time for each
    # thread it runs (its own and its decode threads); a unit slip or a double count exceeds it.
    busy = sum(
        s["stop"] - s["start"]
        for t in stream.data
        if str(t["key"]).startswith("matmul-")
        for s in t["startstops"]
        if s["action"] == "compute"
    )
    assert 0 < sum(result.phases.values()) <= busy * (1 + result.plan.decode_threads), busy


def test_cli_prints_the_accounting(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (64, 48), "float32"), (32, 48))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (48, 40), "float32"), (48, 40))
    done = run_cli(
        "multiply", a, b, str(tmp_path / "c.zarr"), "--dashboard-address", ":0",
        "--workers", "1", "--threads-per-worker", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("time:")]
    phases = re.search(", ".join(rf"{p} ([\d.]+) thread-s" for p in PHASES), line)
    usage = re.search(r"user ([\d.]+) s, system ([\d.]+) s, (\d+) page faults", line)
    wall = re.search(r"^done: .* in ([\d.]+) s", done.stdout, re.M)
    assert phases and usage and wall, done.stdout
    # One worker thread and its decode thread: the thread-seconds fit in twice the wall time
    # (x4 for rounding to 0.01 s and the decode pool), a millisecond slip would not.
    thread_seconds = sum(float(x) for x in phases.groups())
    assert 0 < thread_seconds <= 4 * float(wall.group(1)) + 0.06, line
    assert float(usage.group(1)) > 0 and int(usage.group(3)) > 0, line


def test_report_carries_the_accounting(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (64, 48), "float32"), (32, 48))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (48, 40), "float32"), (48, 40))
    report = tmp_path / "report.html"
    done = run_cli(
        "multiply", a, b, str(tmp_path / "c.zarr"), "--report", str(report),
        "--dashboard-address", ":0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = report.read_text()
    at = page.index('<section id="tilegemm-accounting"')
    assert at < page.index("</body>") and "product " in page[at:] and " thread-s," in page[at:]
    assert "page faults" in page[at:]


def _zarr_concurrency() -> int:
    import zarr

    return int(zarr.config.get("async.concurrency"))


def test_local_reads_decode_few_chunks_at_once(tmp_path: Path, client: Client) -> None:
    """zarr's chunks at once per read, on the workers that ran the tiles: 1 on the GPU feed
    (its decode threads read side by side), 2 on the CPU path (CPU-bound decode)."""
    rng = np.random.default_rng(6)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (300, 200), "float32"), (100, 100))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (200, 300), "float32"), (100, 100))
    for backend, chunks in (("emulated", 1), ("cpu", 2)):
        with get_task_stream(client) as stream:
            multiply(a, b, str(tmp_path / "c.zarr"), client=client, backend=backend, overwrite=True)
        workers = {e["worker"] for e in stream.data if str(e["key"]).startswith("matmul-")}
        assert set(client.run(_zarr_concurrency, workers=list(workers)).values()) == {chunks}


def test_the_time_line_labels_each_product_figure() -> None:
    """Both sets of figures have a ``product``: thread-seconds of the tile tasks (3.3) and the
    workers' CPU-seconds (0.92). Each figure says which it is, not only its set's heading."""
    from pipeline.options.job_options import MultiplyResult
    from pipeline.plan.search import plan_matmul
    from pipeline.plan.spec import ArraySpec
    from pipeline.summary import format_accounting

    spec = ArraySpec((64, 64), (32, 32), "float32")
    plan = plan_matmul(spec, spec, workers=1, threads_per_worker=2, memory_limit_bytes=2**30)
    usage = {"user_seconds": 1.0, "system_seconds": 0.1, "page_faults": 7.0, "cpu_product": 0.92}
    result = MultiplyResult(
        (64, 64), "float32", 1.0, 4, 0, 0, "cpu", plan,
        phases={"product": 3.3, "decode": 0.25}, usage=usage,
    )  # fmt: skip
    line = format_accounting(result)
    products = ["product 3.300 thread-s,", "product 0.92 CPU-s"]
    assert re.findall(r"product [\d.]+ \S+", line) == products
    assert line.startswith("time: tile tasks' thread-seconds (wall time summed over their threads)")
    assert "workers' CPU-seconds by kind: product 0.92 CPU-s" in line

"""The progress line: tiles and K panels, rate, bytes and an ETA from the plan, then from the
measured rate; tasks' panel events (pipeline.run.events) move it within a tile."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from distributed import Client, LocalCluster

from pipeline.plan.units import format_bytes
from pipeline.run import progress
from pipeline.run.progress import ProgressLine
from tests.helpers import cpu_tile_task, random_matrix, write_array


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The progress line's clock, moved by the test alone (a busy machine's delays would
    change the rates): [seconds]."""
    now = [1000.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def test_eta_from_estimate_then_from_rate(clock: list[float]) -> None:
    stream = io.StringIO()
    line = ProgressLine(4, 4 * 10**9, enabled=True, stream=stream, estimate=120.0)
    assert re.search(r"tiles 0/4 .* ETA 02:00$", line.text())  # the estimate: 2 minutes
    clock[0] += 10  # ten seconds later one tile of four is done
    line.add(10**9, 2**20)
    text = line.text()
    assert "tiles 1/4" in text and "read 1.0 MiB" in text
    assert re.search(r"ETA 00:30$", text), text  # 3 more tiles at 10 s each
    line.draw()
    line.close()
    assert stream.getvalue().startswith("\r") and stream.getvalue().endswith("\n")


def test_quiet_when_disabled() -> None:
    stream = io.StringIO()
    line = ProgressLine(1, 10, enabled=False, stream=stream)
    line.draw()
    line.close()
    assert stream.getvalue() == ""


def event(tile: tuple[int, int], k0: int, panels: int, flops: int, nbytes: int) -> dict[str, Any]:
    return {"tile": list(tile), "k0": k0, "panels": panels, "flops": flops, "bytes": nbytes}


def test_moves_within_a_tile(clock: list[float]) -> None:
    """Panel events move the line before any tile is written; a written tile's own stats
    replace its tasks' running totals, and a late event of a written tile is ignored."""
    line = ProgressLine(2, 8 * 10**9, enabled=False, panels=8)
    clock[0] += 10
    assert "tiles 0/2 | panels 0/8 | 0.0 GFLOP/s" in line.text()
    line.task_progress(event((0, 0), 0, 1, 10**9, 100))
    line.task_progress(event((0, 0), 0, 2, 2 * 10**9, 200))  # running totals, not increments
    line.task_progress(event((1, 0), 0, 1, 10**9, 100))
    assert "tiles 0/2 | panels 3/8 | 0.3 GFLOP/s | read 300 B" in line.text()
    line.add(4 * 10**9, 400, (0, 0), 4)
    line.task_progress(event((0, 0), 0, 3, 3 * 10**9, 300))  # late: the tile is written
    assert "tiles 1/2 | panels 5/8 | 0.5 GFLOP/s | read 500 B" in line.text()


def test_split_k_groups_of_a_tile_add_up() -> None:
    line = ProgressLine(1, 4 * 10**9, enabled=False, panels=4)
    line.task_progress(event((0, 0), 0, 2, 2 * 10**9, 10))
    line.task_progress(event((0, 0), 512, 1, 10**9, 5))  # the second K group
    assert line.totals() == (3, 3 * 10**9, 15)
    line.add(4 * 10**9, 20, (0, 0), 4)
    assert line.totals() == (4, 4 * 10**9, 20)


@pytest.fixture(scope="module")
def in_process() -> Iterator[Client]:
    """Workers in this process, so REPORT_SECONDS can be patched for them."""
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as c,
        Client(c) as client,
    ):
        yield client


def test_tasks_report_every_panel(
    tmp_path: Path, in_process: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from pipeline.run import events, worker

    monkeypatch.setattr(events, "REPORT_SECONDS", 0.0)
    rng = np.random.default_rng(1)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (40, 3000), "float32"), (40, 512))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (3000, 30), "float32"), (512, 30))
    plan, spec = cpu_tile_task(a_url, b_url, tmp_path / "c.zarr")
    spec = replace(spec, options=replace(spec.options, progress=True), run_id="test-run")
    tile, panels = next(plan.tiles()), plan.k_panels  # all of K in one task
    assert len(panels) > 2
    seen: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []  # another job listening through the same client
    with (
        events.subscribe(in_process, "other-run", other.append),
        events.subscribe(in_process, "test-run", seen.append),
    ):
        in_process.submit(worker.tile_product_write, spec, tile, panels).result()
        deadline = time.monotonic() + 10
        while len(seen) < len(panels) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert other == [] and events._subscribed == {}
    assert [e["panels"] for e in seen] == list(range(1, len(panels) + 1))
    assert seen[-1]["flops"] == 2 * 40 * 30 * 3000 and seen[-1]["tile"] == [0, 0]
    assert seen[-1]["bytes"] == (40 + 30) * 3000 * 4


def test_resume_counts_only_computed_work(
    tmp_path: Path, in_process: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline import multiply

    rng = np.random.default_rng(2)
    a, b = random_matrix(rng, (600, 40), "float32"), random_matrix(rng, (40, 300), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (300, 40))
    b_url = write_array(tmp_path / "b.zarr", b, (40, 300))
    out = tmp_path / "c.zarr"
    first = multiply(a_url, b_url, str(out), client=in_process, memory_limit="2GiB")
    assert first.plan.n_tiles == 2
    next((out / "journal").iterdir()).unlink()  # one tile to redo
    capsys.readouterr()
    resumed = multiply(a_url, b_url, str(out), client=in_process, resume=True, progress=True)
    line = capsys.readouterr().err.rsplit("\r", 1)[-1]
    assert resumed.tiles_skipped == 1
    assert line.startswith("tiles 1/1 | panels 1/1 | "), line
    assert f"read {format_bytes(resumed.bytes_read)}" in line  # the redone tile's reads only


def test_staged_gpu_tasks_report_panels_too(
    tmp_path: Path, in_process: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulated device's tasks (the staged engine) count a panel once it is staged."""
    from dataclasses import replace

    from pipeline.run import events, worker

    monkeypatch.setattr(events, "REPORT_SECONDS", 0.0)
    rng = np.random.default_rng(2)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (40, 3000), "float32"), (40, 512))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (3000, 30), "float32"), (512, 30))
    plan, spec = cpu_tile_task(a_url, b_url, tmp_path / "c.zarr")
    params = (("tflops", 1.0), ("h2d_gbps", 10.0), ("memory_bytes", 2.0**30))
    spec = replace(
        spec, backend="emulated", device_params=params, staging_bytes=2**26,
        options=replace(spec.options, progress=True), run_id="staged-run",
    )  # fmt: skip
    tile, panels = next(plan.tiles()), plan.k_panels
    seen: list[dict[str, Any]] = []
    with events.subscribe(in_process, "staged-run", seen.append):
        in_process.submit(worker.tile_product_write, spec, tile, panels).result()
        deadline = time.monotonic() + 10
        while (not seen or seen[-1]["panels"] < len(panels)) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert seen and seen[-1]["panels"] == len(panels)
    assert seen[-1]["flops"] == 2 * 40 * 30 * 3000


def test_verify_line_counts_blocks_and_bytes(
    tmp_path: Path, in_process: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify's line is multiply's style: blocks done, bytes read, elapsed, ETA; every block
    of B (one pass) and of A and C (row blocks) is read once and counted."""
    from pipeline import multiply
    from pipeline.verify.check import verify_product

    rng = np.random.default_rng(2)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (50, 70), "float32"), (20, 30))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (70, 40), "float64"), (25, 40))
    out = str(tmp_path / "c.zarr")
    multiply(a_url, b_url, out, client=in_process)
    capsys.readouterr()
    assert verify_product(in_process, a_url, b_url, out, progress=True).passed
    drawn = capsys.readouterr().err.split("\r")
    last = drawn[-1].removesuffix("\x1b[K\n")
    b_blocks, a_blocks = 3, 3  # B's 70 rows by 25, A's 50 rows by 20
    read = 70 * 40 * 8 + 50 * (70 * 4 + 40 * 8)  # B once, then A's and C's rows
    assert last.startswith(f"verify | blocks {b_blocks + a_blocks}/{b_blocks + a_blocks} | ")
    assert f"read {format_bytes(read)} |" in last and "elapsed | ETA" in last
    assert all(d.startswith("verify | blocks ") for d in drawn[1:]), drawn

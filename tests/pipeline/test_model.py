"""The cost model: a fixed cost per chunk and a rate per byte for each resource, the counts a
plan feeds it, the dry run's terms, and the calibration's fit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.calibrate import fit
from pipeline.plan.costs import ChunkCost, CostModel
from pipeline.plan.matmul import MatmulPlan, cpu_resource_seconds, cpu_work
from pipeline.plan.model import chunks_per_pass
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec, OutputSpec
from tests.helpers import random_matrix, run_cli, write_array

GiB = 2**30
COSTS = CostModel(
    read=ChunkCost(20e-6, 0.1e-9),
    decode=ChunkCost(30e-6, 1e-9),
    encode=ChunkCost(150e-6, 0.5e-9),
    encode_compressed=ChunkCost(400e-6, 0.4e-9),
    write=ChunkCost(300e-6, 0.5e-9),
    flops_per_second=100e9,
    accumulate_per_byte=0.2e-9,
    allocate_per_byte=0.15e-9,
    task_seconds=0.007,
    setup_seconds=0.2,
)
"""The plans here are modelled with these constants, not this machine's calibration."""


@pytest.mark.parametrize(
    ("extent", "span", "chunk", "chunks"),
    [
        (4096, 2048, 1024, 4.0),  # aligned: every chunk once
        (4096, 4096, 64, 64.0),  # one run
        (100, 7, 7, 15.0),  # ragged last chunk
        (4096, 1024, 1000, 8.0),  # runs of 1024 over chunks of 1000: about two each
        (10, 20, 3, 4.0),  # a run longer than the axis
    ],
)
def test_chunks_per_pass(extent: int, span: int, chunk: int, chunks: float) -> None:
    assert chunks_per_pass(extent, span, chunk) == pytest.approx(chunks, rel=0.02)


def _plan(chunk: int, out: tuple[int, int] | None = None) -> MatmulPlan:
    spec = ArraySpec((4096, 4096), (chunk, chunk), "float32")
    return plan_matmul(
        spec, spec, workers=1, threads_per_worker=2, memory_limit_bytes=16 * GiB,
        output=OutputSpec(chunks=out), tile_shape=(2048, 4096), panel_width=1024, costs=COSTS,
    )  # fmt: skip


def test_small_chunks_pay_per_chunk() -> None:
    """The same bytes in 64x64 chunks cost 256x the chunks' fixed costs of 1024x1024 ones."""
    small, big = (dict(cpu_resource_seconds(_plan(c, (1024, 1024)))) for c in (64, 1024))
    extra = (4096 * 4096 // 64**2 - 4096 * 4096 // 1024**2) * 2  # A and B, each read once
    for name, cost in (("read", COSTS.read), ("decode", COSTS.decode)):
        assert small[name] - big[name] == pytest.approx(extra * cost.per_chunk)
    assert small["product"] == big["product"]


def test_out_chunks_cost_their_encode_and_write() -> None:
    few, many = (cpu_work(_plan(1024, c)) for c in ((1024, 1024), (64, 64)))
    assert (few.out_chunks, many.out_chunks) == (16, 4096)
    seconds = dict(cpu_resource_seconds(_plan(1024, (64, 64))))
    out_bytes = 4096 * 4096 * 4
    assert seconds["write"] == pytest.approx(COSTS.write.seconds(4096, out_bytes))
    assert seconds["encode"] == pytest.approx(COSTS.encode.seconds(4096, out_bytes))


def test_a_short_k_is_bound_by_writing_out() -> None:
    """100000x32 @ 32x2000: little to multiply, 800 MB to store."""
    a, b = ArraySpec((100_000, 32), (10_000, 32), "f4"), ArraySpec((32, 2000), (32, 1000), "f4")
    kw: dict[str, Any] = {"workers": 1, "threads_per_worker": 2, "memory_limit_bytes": 16 * GiB}
    plan = plan_matmul(a, b, costs=COSTS, **kw)
    assert plan.bound_by == "write"
    square = ArraySpec((4096, 4096), (1024, 1024), "f4")
    big_k = plan_matmul(square, square, costs=COSTS, **kw)
    assert big_k.bound_by == "product"


def test_the_staged_gpu_path_pays_per_chunk_too() -> None:
    """Its decode threads fetch and decode the same chunks on the host."""
    from pipeline.plan.device_model import DEVICE_CLASSES

    def seconds(chunk: int) -> dict[str, float]:
        spec = ArraySpec((8192, 8192), (chunk, chunk), "float32")
        plan = plan_matmul(
            spec, spec, workers=1, threads_per_worker=1, memory_limit_bytes=16 * GiB,
            backend="cuda", device=DEVICE_CLASSES["h100-pcie"], decode_threads=2,
            output=OutputSpec(chunks=(1024, 1024)), tile_shape=(8192, 8192), panel_width=1024,
            costs=COSTS,
        )  # fmt: skip
        return dict(plan.resource_seconds)

    small, big = seconds(64), seconds(1024)
    extra = (8192**2 // 64**2 - 8192**2 // 1024**2) * 2 / 2  # A and B once, two decode threads
    assert small["decode"] - big["decode"] == pytest.approx(extra * COSTS.decode.per_chunk)
    assert small["storage"] - big["storage"] == pytest.approx(extra * COSTS.read.per_chunk)
    assert small["kernel"] == big["kernel"] and small["write"] == big["write"]


def test_dry_run_prints_every_term(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    url = write_array(tmp_path / "a.zarr", random_matrix(rng, (64, 64), "float32"), (16, 16))
    done = run_cli("multiply", url, url, str(tmp_path / "c.zarr"), "--dry-run")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("modelled seconds"))
    for term in ("read", "decode", "product", "encode", "write", "tasks", "setup"):
        assert f"{term} " in line, line
    assert "calibrated on" in done.stdout


def test_fit_recovers_the_constants() -> None:
    truth = ChunkCost(per_chunk=120e-6, per_byte=0.8e-9)
    samples = [(n, 2**24, truth.seconds(n, 2**24)) for n in (4, 16, 256, 1024, 4096)]
    got = fit(samples)
    assert got.per_chunk == pytest.approx(truth.per_chunk, rel=1e-6)
    assert got.per_byte == pytest.approx(truth.per_byte, rel=1e-6)


@pytest.mark.parametrize("chunk", [64, 2048])
def test_in_job_decode_scaling_moves_the_per_chunk_cost_only(chunk: int) -> None:
    """A decode-bound job's excess over one thread's figures is charged per chunk: the plan's
    modelled decode becomes the target, and zstd's per-byte rate is left as measured (a
    target below the per-byte part alone scales both)."""
    from benchmarks.calibrate import per_chunk_scaled
    from pipeline.plan.model import grouped

    plan = _plan(chunk)
    before = grouped(dict(cpu_resource_seconds(plan)))["decode"]
    for target in (3 * before, 0.5 * before):
        costs, factor = per_chunk_scaled(COSTS, plan, target)
        after = grouped(dict(cpu_resource_seconds(replace(plan, costs=costs))))["decode"]
        assert after == pytest.approx(target, rel=1e-9)
        if target > before:  # more per chunk, the same per byte
            assert costs.decode.per_byte == COSTS.decode.per_byte
            assert costs.decode.per_chunk == pytest.approx(COSTS.decode.per_chunk * factor)
            assert factor > 3  # the per-chunk part is under all of it


def test_one_task_still_multiplies_on_every_thread() -> None:
    """The worker's threads share each task's gemm calls (kernels.cpu.share_cores): one tile
    on two threads is modelled at the two threads' rate, not as one thread's chain."""
    from pipeline.plan.model import makespan

    seconds = {"read": 0.0, "decode": 0.1, "product": 8.0, "encode": 0.0, "write": 0.1, "tasks": 0}
    fill, drain = 0.1 / 4, 0.1 / 8
    one, two = (makespan(seconds, threads=t, rounds=1, tasks=1, panels=4, bands=8) for t in (1, 2))
    assert one == pytest.approx(8.2 + fill + drain)
    assert two == pytest.approx(8.2 / 2 + fill + drain)  # not its chain: fill + 8.0 + drain

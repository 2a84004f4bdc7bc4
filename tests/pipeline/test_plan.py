"""The pure planner: tables of cases and hypothesis properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import InputError, MemoryBudgetError
from pipeline.plan.dtypes import result_dtype
from pipeline.plan.memory import WORKER_OVERHEAD_BYTES
from pipeline.plan.search import MIN_TASKS, gemm_block, plan_k_panels, plan_matmul
from pipeline.plan.spec import ArraySpec

GiB = 2**30


def spec(shape: tuple[int, int], chunks: tuple[int, int], dtype: str = "float32") -> ArraySpec:
    return ArraySpec(shape, chunks, dtype)


@pytest.mark.parametrize(
    ("k", "a_chunk", "b_chunk", "target", "expected"),
    [
        (10, 5, 5, 5, ((0, 5), (5, 10))),  # aligned grids, one chunk per panel
        (10, 4, 4, 8, ((0, 8), (8, 10))),  # two chunks merged, ragged last panel
        (12, 4, 6, 6, ((0, 6), (6, 12))),  # cut where B's chunk ends when no common boundary fits
        (12, 4, 6, 12, ((0, 12),)),  # whole K fits one panel
        (12, 3, 4, 7, ((0, 6), (6, 12))),  # no shared cut fits: the largest single-grid cut
        (0, 4, 4, 8, ()),  # empty K: no panels
        (5, 10, 10, 4, ((0, 5),)),  # chunk larger than K
        (13, 3, 3, 8, ((0, 6), (6, 13))),  # a tail within the target joins the last panel
        (20, 4, 6, 10, ((0, 8), (8, 16), (16, 20))),  # no shared cut: A's grid, the wider
    ],
)
def test_k_panels(k: int, a_chunk: int, b_chunk: int, target: int, expected: tuple) -> None:
    panels = plan_k_panels(k, a_chunk, b_chunk, target)
    assert tuple(panels) == expected
    assert [panels[i] for i in range(len(panels))] == list(expected)
    assert panels.widest == max((k1 - k0 for k0, k1 in expected), default=0)


def test_k_panels_are_counted_not_listed() -> None:
    # A 10^12-wide K is a few ints; its slices (split-K groups) too.
    panels = plan_k_panels(10**12, 1000, 1000, 512)
    assert (len(panels), panels.widest, panels[-1]) == (10**9, 1000, (10**12 - 1000, 10**12))
    group = panels[10:20]
    assert (len(group), group[0], list(group)[-1]) == (10, (10_000, 11_000), (19_000, 20_000))
    assert group[1:][0] == (11_000, 12_000) and len(panels[5:5]) == 0


@pytest.mark.parametrize(
    ("a", "b", "out", "compute"),
    [
        ("float32", "float32", "float32", "float32"),  # the common case
        ("float32", "float64", "float64", "float64"),  # mixed: promote
        ("float16", "float16", "float16", "float32"),  # half accumulates in single
        ("int32", "int64", "int64", "int64"),  # integers stay exact
        ("complex64", "float32", "complex64", "complex64"),  # complex
    ],
)
def test_result_dtype(a: str, b: str, out: str, compute: str) -> None:
    assert result_dtype(a, b) == (out, compute)


def test_refuses_non_numeric_dtype() -> None:
    with pytest.raises(InputError, match="not numeric"):
        result_dtype("<U4", "float32")


def test_refuses_non_contracting_shapes() -> None:
    with pytest.raises(InputError, match=r"A's columns \(30\) must equal B's rows \(31\)"):
        plan_matmul(
            spec((20, 30), (10, 10)),
            spec((31, 5), (10, 5)),
            workers=1,
            threads_per_worker=1,
            memory_limit_bytes=GiB,
        )


def test_refuses_impossible_memory_with_numbers() -> None:
    a, b = spec((4096, 4096), (1024, 1024)), spec((4096, 4096), (1024, 1024))
    with pytest.raises(MemoryBudgetError, match=r"smallest needs .* but the limit is 1\.0 MiB"):
        plan_matmul(a, b, workers=1, threads_per_worker=2, memory_limit_bytes=2**20)


@pytest.mark.parametrize(
    ("m", "k", "n", "chunk", "workers", "threads", "tiles"),
    [
        # one chunk per tile: fewer re-reads, no cost per task to speak of; clearly faster
        # than two 8192x4096 tiles
        (8192, 8192, 8192, 2048, 1, 2, 16),
        # 2 workers: 2 tiles each, sharing its 4 gemm threads (kernels.cpu.share_cores), read
        # 1.5x the minimum where 8 tiles (one per thread) read 2x
        (4096, 4096, 4096, 1024, 2, 4, 4),
        (100, 100, 100, 100, 1, 1, 1),  # single chunk
        (1000, 50, 1000, 100, 1, 2, 2),  # small K: few tiles, fewer re-reads
    ],
)
def test_tiles_cover_threads(
    m: int, k: int, n: int, chunk: int, workers: int, threads: int, tiles: int
) -> None:
    plan = plan_matmul(
        spec((m, k), (chunk, chunk)),
        spec((k, n), (chunk, chunk)),
        workers=workers,
        threads_per_worker=threads,
        memory_limit_bytes=16 * GiB,
    )
    assert plan.n_tiles == tiles
    assert plan.split_k == 1


@pytest.mark.parametrize(("workers", "threads"), [(1, 1), (2, 2), (3, 1), (8, 4)])
def test_split_k_depends_on_the_problem_only(workers: int, threads: int) -> None:
    # One output block but a long K: K is split into MIN_TASKS groups on any cluster, so the
    # summation tree (and the output's bytes) never depends on the cluster.
    plan = plan_matmul(
        spec((256, 65536), (256, 4096)),
        spec((65536, 256), (4096, 256)),
        workers=workers,
        threads_per_worker=threads,
        memory_limit_bytes=4 * GiB,
    )
    assert plan.n_tiles == 1
    assert plan.split_k == MIN_TASKS
    groups = plan.k_groups()
    assert [p for g in groups for p in g] == list(plan.k_panels)


@pytest.mark.parametrize(
    ("m", "n", "chunks", "block"),
    [
        (1000, 1000, (100, 300), (300, 300)),  # small chunks merged to >= 256
        (1000, 1000, (512, 512), (512, 512)),  # big chunks kept
        (100, 2000, (30, 2000), (100, 2000)),  # capped at the axis
    ],
)
def test_gemm_block_is_whole_chunks(
    m: int, n: int, chunks: tuple[int, int], block: tuple[int, int]
) -> None:
    assert gemm_block(ArraySpec((m, n), chunks, "float32")) == block


def test_bigger_budget_reads_less() -> None:
    a, b = spec((16384, 16384), (1024, 1024)), spec((16384, 16384), (1024, 1024))
    small = plan_matmul(a, b, workers=1, threads_per_worker=2, memory_limit_bytes=1 * GiB)
    big = plan_matmul(a, b, workers=1, threads_per_worker=2, memory_limit_bytes=16 * GiB)
    assert big.read_bytes < small.read_bytes
    assert small.worker_bytes + WORKER_OVERHEAD_BYTES <= 1 * GiB


dims = st.integers(min_value=0, max_value=5000)
chunk = st.integers(min_value=1, max_value=1200)


@settings(max_examples=200, deadline=None)
@given(
    m=dims,
    k=dims,
    n=dims,
    ca=chunk,
    cb=chunk,
    ck_a=chunk,
    ck_b=chunk,
    workers=st.integers(1, 4),
    threads=st.integers(1, 4),
)
def test_plan_properties(
    m: int, k: int, n: int, ca: int, cb: int, ck_a: int, ck_b: int, workers: int, threads: int
) -> None:
    a, b = spec((m, k), (ca, ck_a)), spec((k, n), (ck_b, cb))
    plan = plan_matmul(
        a, b, workers=workers, threads_per_worker=threads, memory_limit_bytes=64 * GiB
    )
    # Tiles are whole output chunks and cover the output exactly once.
    covered = np.zeros((m, n), dtype=np.int8) if m * n <= 4_000_000 else None
    tm, tn = plan.tile_shape
    assert tm % ca == 0 or tm == m or m == 0
    assert tn % cb == 0 or tn == n or n == 0
    count = 0
    for tile in plan.tiles():
        count += 1
        assert tile.rows[0] % ca == 0 and tile.cols[0] % cb == 0
        if covered is not None:
            covered[tile.rows[0] : tile.rows[1], tile.cols[0] : tile.cols[1]] += 1
    assert count == plan.n_tiles
    if covered is not None:
        assert (covered == 1).all()
    # K panels partition [0, k) in order.
    edges = [p for panel in plan.k_panels for p in panel]
    assert edges[:1] in ([], [0]) and (not edges or edges[-1] == k)
    assert all(
        plan.k_panels[i][1] == plan.k_panels[i + 1][0] for i in range(len(plan.k_panels) - 1)
    )
    assert all(k0 < k1 for k0, k1 in plan.k_panels)
    assert 1 <= plan.split_k <= max(len(plan.k_panels), 1)
    # Reads: at least every element once, and the bound is consistent.
    assert plan.read_bytes >= plan.compulsory_read_bytes or m == 0 or n == 0
    assert plan.lower_bound_read_bytes >= plan.compulsory_read_bytes
    assert plan.flops == 2 * m * n * k
    assert plan.task_bytes > 0 or m * n == 0


@settings(max_examples=100, deadline=None)
@given(
    m=st.integers(1, 3000),
    k=st.integers(1, 3000),
    n=st.integers(1, 3000),
    budget_mib=st.integers(300, 4096),
    threads=st.integers(1, 4),
)
def test_plan_fits_budget_or_refuses(m: int, k: int, n: int, budget_mib: int, threads: int) -> None:
    a, b = spec((m, k), (256, 256)), spec((k, n), (256, 256))
    budget = budget_mib * 2**20
    try:
        plan = plan_matmul(a, b, workers=1, threads_per_worker=threads, memory_limit_bytes=budget)
    except MemoryBudgetError:
        return
    assert plan.worker_bytes + WORKER_OVERHEAD_BYTES <= budget
    tm, tn = plan.tile_shape
    assert plan.task_bytes >= tm * tn * 4  # at least the accumulator
    # No schedule reads less than the I/O lower bound (Smith et al.), nor than each input once.
    assert plan.read_bytes >= plan.lower_bound_read_bytes >= plan.compulsory_read_bytes > 0


def test_huge_chunk_counts_plan_fast() -> None:
    # 2**20 chunks per axis: the candidates are a small subset, found in well under a CPU
    # second (CPU time: other work on the machine does not count).
    import time

    started = time.process_time()
    with pytest.raises(MemoryBudgetError, match="TiB per worker"):
        plan_matmul(
            spec((2**40, 1), (2**20, 1)),
            spec((1, 2**40), (1, 2**20)),
            workers=4,
            threads_per_worker=2,
            memory_limit_bytes=16 * GiB,
        )
    plan = plan_matmul(
        spec((2**26, 64), (64, 64)),
        spec((64, 2**12), (64, 64)),
        workers=4,
        threads_per_worker=2,
        memory_limit_bytes=16 * GiB,
    )
    assert plan.n_tiles >= 8
    assert time.process_time() - started < 5

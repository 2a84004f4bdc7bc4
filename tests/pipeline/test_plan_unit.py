"""The planner's pure core, number by number: the memory model (pipeline/plan/memory.py), a
candidate's figures (pipeline/plan/candidate.py) and the search that picks the tiling
(pipeline/plan/search.py). Tables of exact figures, the first of each derived by hand in its
comment; the mutation targets ``planner`` and ``memory`` of benchmarks/mutate.py run these."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from pipeline.errors import InputError, MemoryBudgetError, PlanLimitError, UsageError
from pipeline.plan import candidate, memory, search
from pipeline.plan.device_model import DEVICE_CLASSES
from pipeline.plan.limits import PlanLimits
from pipeline.plan.spec import ArraySpec, OutputSpec

GiB, MiB = 2**30, 2**20


def spec(shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str = "float32") -> ArraySpec:
    return ArraySpec(shape, chunks, dtype)  # type: ignore[arg-type]


# --- memory.py ------------------------------------------------------------------------------


def test_constants() -> None:
    figures = (memory.WORKER_OVERHEAD_BYTES, memory.ZARR_CONCURRENCY, memory.ZARR_BYTES_PER_CHUNK)
    assert figures == (256 * MiB, 10, 2560)


@pytest.mark.parametrize(
    ("span", "chunk", "extent", "touched"),
    [
        (0, 5, 10, 0),  # nothing read
        (5, 0, 10, 0),  # no chunks
        (-1, 5, 10, 0),
        (4, 4, None, 1),  # aligned runs: one chunk each
        (8, 4, None, 2),
        (6, 4, None, 2),  # a run starts 0 or 2 into a chunk: (6 + 4 - 2) / 4
        (5, 4, None, 2),  # (5 + 4 - 1) / 4
        (3, 4, None, 2),  # (3 + 4 - 1) / 4 = 1.5, rounded up
        (1, 4, None, 1),
        (3, 1, None, 3),  # chunks of one element
        (6, 4, 100, 2),  # a long axis: as unbounded
        (10, 4, 10, 3),  # the whole axis: its chunks
        (12, 4, 10, 3),  # more than the axis: still its chunks
        (5, 3, 6, 2),  # at most the axis' chunks: (5 + 3 - 1) / 3 rounds up to 3, but 6 has 2
        (9, 4, 10, 3),
    ],
)
def test_chunks_touched(span: int, chunk: int, extent: int | None, touched: int) -> None:
    assert memory.chunks_touched(span, chunk, extent) == touched


@pytest.mark.parametrize(
    ("block", "chunk", "extent", "itemsize", "nbytes"),
    [
        # 4 x 1 chunks of 32x8: 2 copies of 4 whole chunks (256 elements, 4 bytes) + 4 x 2560
        ((128, 8), (32, 8), (1000, 640), 4, 2 * 4 * 256 * 4 + 4 * 2560),
        # 12 x 3 = 36 chunks touched: only 10 in flight, bookkeeping for all 36
        ((120, 30), (10, 10), (None, None), 8, 2 * 10 * 100 * 8 + 36 * 2560),
        # a chunk larger than the array is still decoded whole
        ((5, 5), (100, 100), (5, 5), 2, 2 * 1 * 10_000 * 2 + 1 * 2560),
        ((0, 5), (4, 4), (8, 8), 4, 0),
    ],
)
def test_zarr_bytes(
    block: tuple[int, int],
    chunk: tuple[int, int],
    extent: tuple[int | None, int | None],
    itemsize: int,
    nbytes: int,
) -> None:
    assert memory.zarr_bytes(block, chunk, extent, itemsize) == nbytes


def test_zarr_bytes_refuses_mismatched_axes() -> None:
    with pytest.raises(ValueError, match="zip"):
        memory.zarr_bytes((4, 4), (2, 2), (8,), 4)  # type: ignore[arg-type]


STREAMING = {
    "tile_shape": (128, 96),
    "panel_width": 64,
    "dtypes": ("float32",) * 4,
    "chunks": ((32, 100), (64, 32), (64, 48)),
    "split_k": 1,
    "first_band_rows": 64,
    "shape": (1024, 640, 960),
}
"""A task whose K streaming is its peak."""
WRITING = {**STREAMING, "panel_width": 8, "chunks": ((32, 8), (8, 32), (128, 96))}
"""A task whose last panel and first band's write is its peak (narrow panels, big OUT chunks):
panels 128·8·4 = 4096 and 8·96·4 = 3072 bytes; reads 2·4·256·4 + 4·2560 = 18432 of A, 2·3·256·4
+ 3·2560 = 13824 of B; streaming 2·7168 + 32256 = 46592; the accumulator 128·96·4 = 49152; the
first band's write 2·(128·96·4) + 2560 = 100864: host 49152 + max(46592, 7168 + 100864) =
157184; device 49152 + (128·8 + 8·96)·4 = 56320."""


@pytest.mark.parametrize(
    ("base", "change", "host", "device"),
    [
        (WRITING, {}, 157184, 56320),
        (STREAMING, {}, 445952, 106496),
        (STREAMING, {"dtypes": ("float16", "float16", "float32", "float16")}, 376320, 106496),
        (STREAMING, {"dtypes": ("float32", "float64", "float64", "float32")}, 724480, 212992),
        (STREAMING, {"prior": True}, 519680, 106496),
        (STREAMING, {"tile_shape": (128, 90)}, 458752, 101888),
        (WRITING, {"dtypes": ("float16", "float16", "float32", "float16")}, 123904, 56320),
        (WRITING, {"dtypes": ("float32", "float64", "float64", "float32")}, 242176, 112640),
        (WRITING, {"split_k": 3}, 248320, 56320),
        (STREAMING, {"split_k": 3}, 445952, 106496),  # streaming beats the 3 tiles' reduction
        (WRITING, {"prior": True}, 230912, 56320),
        (WRITING, {"prior": True, "split_k": 2}, 322048, 56320),
        (WRITING, {"tile_shape": (128, 90)}, 254784, 53056),
        (STREAMING, {"shape": (40, 640, 50)}, 314368, 106496),  # fewer chunks on small axes
        (STREAMING, {"shape": (1024, 50, 960)}, 333312, 106496),  # a short K
        (STREAMING, {"shape": None}, 445952, 106496),
        (WRITING, {"chunks": ((32, 8), (8, 32), (32, 96))}, 110592, 56320),  # small OUT chunks
        (WRITING, {"chunks": ((32, 8), (8, 32), (32, 96)), "first_band_rows": 128}, 164864, 56320),
        (WRITING, {"chunks": ((32, 8), (8, 32), (32, 96)), "prior": True}, 206848, 56320),
        (WRITING, {"dtypes": ("float64", "float32", "float64", "float64")}, 314880, 112640),
    ],
)
def test_task_bytes(base: dict[str, Any], change: dict[str, Any], host: int, device: int) -> None:
    assert memory.calculate_task_bytes(**{**base, **change}) == (host, device)


def test_worker_bytes() -> None:
    got = memory.calculate_worker_bytes(
        task_bytes=100, busy_threads=3, held_partials=5, partial_bytes=7
    )
    assert got == 3 * 100 + 5 * 7


@pytest.mark.parametrize(
    ("spare", "fraction", "inputs", "cache"),
    [
        (800, 0.5, 10**6, 400),
        (801, 0.3, 10**6, 240),  # int(240.3): rounded down
        (800, 0.5, 300, 300),  # at most both inputs
        (800, 0.0, 10**6, 0),
        (-50, 0.5, 10**6, 0),  # no spare memory: no cache, never a negative one
    ],
)
def test_cache_bytes(spare: int, fraction: float, inputs: int, cache: int) -> None:
    limit = memory.WORKER_OVERHEAD_BYTES + 200 + spare
    got = memory.calculate_cache_bytes(
        memory_limit_bytes=limit, worker_bytes=200, cache_fraction=fraction, inputs_bytes=inputs
    )
    assert got == cache


# --- search.py: refusals, in the user's words ----------------------------------------------


def plan(a: ArraySpec, b: ArraySpec, **options: Any) -> Any:
    settings = {"workers": 1, "threads_per_worker": 2, "memory_limit_bytes": 16 * GiB}
    return search.plan_matmul(a, b, **{**settings, **options})


SQUARE = (spec((4096, 4096), (1024, 1024)), spec((4096, 4096), (1024, 1024)))


@pytest.mark.parametrize(("workers", "threads"), [(0, 1), (1, 0), (-1, 3)])
def test_refuses_no_workers_or_threads(workers: int, threads: int) -> None:
    want = (
        f"need at least one worker and one thread, got {workers} worker(s) with {threads} thread(s)"
    )
    with pytest.raises(UsageError, match=f"^{re.escape(want)}$"):
        plan(*SQUARE, workers=workers, threads_per_worker=threads)
    plan(*SQUARE, workers=1, threads_per_worker=1)  # the least that plans


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        (spec((5,), (5,)), spec((5, 3), (5, 3)), "A has 1 dimension(s) (5,)"),
        (spec((5, 3), (5, 3)), spec((3, 2, 2), (3, 2, 2)), "B has 3 dimension(s) (3, 2, 2)"),
    ],
)
def test_refuses_what_is_not_a_matrix(a: ArraySpec, b: ArraySpec, want: str) -> None:
    full = f"{want}; only 2-D matrices can be multiplied"
    with pytest.raises(InputError, match=f"^{re.escape(full)}$"):
        plan(a, b)


def test_budget_message_names_the_smallest_plan() -> None:
    want = (
        "no plan fits the memory limit: the smallest needs 328.0 MiB per worker (2 thread(s) x "
        "36.0 MiB per task for 1024x1024 tiles, plus 256.0 MiB overhead) but the limit is "
        "1.0 MiB; raise --memory-limit, use fewer threads per worker, or store the inputs with "
        "smaller chunks"
    )  # 2 x 36 + 256 = 328: the 1024² chunks' accumulator, panels and zarr's copies
    with pytest.raises(MemoryBudgetError, match=f"^{re.escape(want)}$"):
        plan(*SQUARE, memory_limit_bytes=MiB)


def test_budget_message_of_a_sharded_out() -> None:
    want = (
        "no plan fits the memory limit: the smallest needs 624.0 MiB per worker (3 thread(s) x "
        "80.0 MiB per task for 2048x2048 tiles, plus 256.0 MiB overhead) but the limit is "
        "512.0 MiB; raise --memory-limit, use fewer threads per worker, or store the inputs "
        "with smaller chunks (or give OUT smaller --shards: a tile holds whole shards)"
    )
    with pytest.raises(MemoryBudgetError, match=f"^{re.escape(want)}$"):
        plan(
            *SQUARE, threads_per_worker=3, memory_limit_bytes=512 * MiB,
            output=OutputSpec(shards=(2048, 2048)),
        )  # fmt: skip


def test_budget_message_when_the_gpu_is_short() -> None:
    device = dataclasses.replace(DEVICE_CLASSES["h100-pcie"], memory_bytes=MiB)
    want = (
        "no plan fits the device memory: the smallest needs 40.0 MiB per GPU (2 task(s) x "
        "20.0 MiB for 1024x1024 tiles) but H100-PCIe has 1.0 MiB; raise "
        "--device-memory-limit, or store the inputs with smaller chunks"
    )  # a 4 MiB accumulator and two pairs of 4 MiB panels per task
    with pytest.raises(MemoryBudgetError, match=f"^{re.escape(want)}$"):
        plan(*SQUARE, backend="cuda", device=device)


WIDE_B = spec((4096, 4096), (1024, 2048))
"""B in 1024x2048 chunks: the smallest tile is 1024x2048 (rows, then columns)."""


def test_budget_messages_name_rows_then_columns() -> None:
    host = (
        "no plan fits the memory limit: the smallest needs 368.0 MiB per worker (2 thread(s) x "
        "56.0 MiB per task for 1024x2048 tiles, plus 256.0 MiB overhead) but the limit is "
        "1.0 MiB; raise --memory-limit, use fewer threads per worker, or store the inputs with "
        "smaller chunks"
    )
    with pytest.raises(MemoryBudgetError, match=f"^{re.escape(host)}$"):
        plan(SQUARE[0], WIDE_B, memory_limit_bytes=MiB)
    device = dataclasses.replace(DEVICE_CLASSES["h100-pcie"], memory_bytes=MiB)
    gpu = (
        "no plan fits the device memory: the smallest needs 64.0 MiB per GPU (2 task(s) x "
        "32.0 MiB for 1024x2048 tiles) but H100-PCIe has 1.0 MiB; raise "
        "--device-memory-limit, or store the inputs with smaller chunks"
    )
    with pytest.raises(MemoryBudgetError, match=f"^{re.escape(gpu)}$"):
        plan(SQUARE[0], WIDE_B, backend="cuda", device=device)


def test_the_gpu_is_short_when_the_host_just_fits() -> None:
    """The smallest GPU plan needs 88 MiB of host memory per worker (no cache): 344 MiB with
    the overhead. A limit of exactly that fits the host, so the device is named."""
    device = dataclasses.replace(DEVICE_CLASSES["h100-pcie"], memory_bytes=MiB)
    need = 88 * MiB + memory.WORKER_OVERHEAD_BYTES
    options = {"backend": "cuda", "device": device, "cache_fraction": 0}
    with pytest.raises(MemoryBudgetError, match="^no plan fits the device memory"):
        plan(*SQUARE, memory_limit_bytes=need, **options)
    with pytest.raises(MemoryBudgetError, match="^no plan fits the memory limit: .* 344.0 MiB"):
        plan(*SQUARE, memory_limit_bytes=need - 1, **options)


def test_budget_message_when_both_are_short() -> None:
    """The host is short too: the host's message, which names --memory-limit."""
    device = dataclasses.replace(DEVICE_CLASSES["h100-pcie"], memory_bytes=MiB)
    with pytest.raises(MemoryBudgetError, match="^no plan fits the memory limit"):
        plan(*SQUARE, backend="cuda", device=device, memory_limit_bytes=MiB)


def test_task_limit_refusal() -> None:
    """The fewest tasks among the plans that fit the memory, against the limit."""
    want = (
        "the plan needs at least 8 tasks (4x2 tiles of 1,024x2,048) within the memory limit, "
        "more than the limit of 7; raise --memory-limit so that bigger tiles fit, multiply "
        "smaller blocks of A and B as separate jobs, or raise the limit "
        "(DASK_TILEGEMM__MAX_TASKS) if the scheduler can take that many tasks"
    )
    with pytest.raises(PlanLimitError, match=f"^{re.escape(want)}$"):
        plan(*SQUARE, limits=PlanLimits(max_tasks=7), memory_limit_bytes=400 * MiB)
    assert plan(*SQUARE, limits=PlanLimits(max_tasks=8), memory_limit_bytes=400 * MiB).n_tasks == 8
    kept = r"^the plan needs at least 16 tasks \(4x4 tiles of 1,024x1,024 kept from OUT\)"
    with pytest.raises(PlanLimitError, match=kept):
        plan(*SQUARE, limits=PlanLimits(max_tasks=15), tile_shape=(1024, 1024))


def test_a_later_candidate_within_the_task_limit_is_found() -> None:
    """Candidates over the task limit are skipped, not the end of the search."""
    a, b = spec((4096, 64), (256, 64)), spec((64, 4096), (64, 256))
    chosen = plan(a, b, limits=PlanLimits(max_tasks=1))
    assert chosen.n_tasks == 1 and chosen.tile_shape == (4096, 4096)


def test_panel_limit_refusal() -> None:
    a, b = spec((64, 4096), (64, 512)), spec((4096, 64), (512, 64))
    with pytest.raises(PlanLimitError, match=r"^K \(4,096\) would be streamed in 8 panels"):
        plan(a, b, limits=PlanLimits(max_panels=7))
    assert len(plan(a, b, limits=PlanLimits(max_panels=8)).k_panels) == 8


# --- search.py: the choice and its figures ------------------------------------------------


def test_panels_are_at_least_min_panel_width() -> None:
    assert search.MIN_PANEL_WIDTH == 512
    small = plan(spec((1000, 1000), (100, 100)), spec((1000, 1000), (100, 100)))
    assert small.k_panels.width == 500  # 512 rounded down to whole chunks of 100
    wide = plan(spec((1000, 1000), (100, 700)), spec((1000, 1000), (300, 100)))
    assert wide.k_panels.width == 700  # the wider chunk
    given = plan(spec((1000, 1000), (100, 100)), spec((1000, 1000), (100, 100)), panel_width=200)
    assert given.k_panels.width == 200


class Recorder:
    """Wraps a function: calls it and keeps the keyword arguments of every call."""

    def __init__(self, function: Any) -> None:
        self.function, self.calls = function, []  # type: ignore[var-annotated]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.function(*args, **kwargs)


@pytest.mark.parametrize(
    ("threads", "workers", "busy", "held"),
    [(4, 1, 2, 2), (1, 1, 1, 2), (4, 2, 2, 1)],  # 1 tile x 2 K groups: 2 partials
)
def test_a_candidates_memory_is_computed_from_its_figures(
    monkeypatch: pytest.MonkeyPatch, threads: int, workers: int, busy: int, held: int
) -> None:
    """A 120x300 OUT in one 120x300 block (120 < 256 rows: the whole axis) and K = 600 in two
    panels of 500 (512 in whole chunks of 100): split in 2 K groups (fewer than MIN_TASKS
    blocks). The memory model gets exactly these figures."""
    task = Recorder(candidate.calculate_task_bytes)
    worker = Recorder(candidate.calculate_worker_bytes)
    cache = Recorder(candidate.calculate_cache_bytes)
    monkeypatch.setattr(candidate, "calculate_task_bytes", task)
    monkeypatch.setattr(candidate, "calculate_worker_bytes", worker)
    monkeypatch.setattr(candidate, "calculate_cache_bytes", cache)
    a, b = spec((120, 600), (50, 100), "float32"), spec((600, 300), (100, 300), "float64")
    got = plan(a, b, workers=workers, threads_per_worker=threads, memory_limit_bytes=GiB)
    assert (got.tile_shape, got.split_k, got.block_shape) == ((120, 300), 2, (120, 300))
    assert task.calls == [((), {
        "tile_shape": (120, 300), "panel_width": 500,
        "dtypes": ("float32", "float64", "float64", "float64"),
        "chunks": ((50, 100), (100, 300), (50, 300)), "split_k": 2, "first_band_rows": 120,
        "shape": (120, 600, 300), "prior": False,
    })]  # fmt: skip
    host = memory.calculate_task_bytes(**task.calls[0][1])[0]
    assert worker.calls == [((), {
        "task_bytes": host, "busy_threads": busy, "held_partials": held,
        "partial_bytes": 120 * 300 * 8,
    })]  # fmt: skip
    projected = busy * host + held * 120 * 300 * 8
    assert cache.calls == [((), {
        "memory_limit_bytes": GiB, "worker_bytes": projected, "cache_fraction": 0.5,
        "inputs_bytes": (120 * 600 + 600 * 300) * 8,
    })]  # fmt: skip
    spare = GiB - memory.WORKER_OVERHEAD_BYTES - projected
    assert got.cache_bytes == min(spare // 2, (120 * 600 + 600 * 300) * 8)
    assert got.worker_bytes == projected + got.cache_bytes
    assert (got.task_bytes, got.device_bytes) == memory.calculate_task_bytes(**task.calls[0][1])


def test_no_split_holds_no_partials(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = Recorder(candidate.calculate_worker_bytes)
    monkeypatch.setattr(candidate, "calculate_worker_bytes", worker)
    a, b = spec((2048, 512), (256, 512)), spec((512, 2048), (512, 256))
    got = plan(a, b, tile_shape=(512, 1024), threads_per_worker=16, workers=2)
    assert got.split_k == 1 and got.n_tiles == 8
    assert worker.calls[0][1]["held_partials"] == 0
    assert worker.calls[0][1]["busy_threads"] == 8  # min(16 threads, 4 x 2 tiles)
    task = Recorder(candidate.calculate_task_bytes)
    monkeypatch.setattr(candidate, "calculate_task_bytes", task)
    plan(a, b, tile_shape=(2048, 512), output=OutputSpec(chunks=(128, 512)), cache_fraction=0)
    assert task.calls[0][1]["first_band_rows"] == 256  # 8 bands of whole 256-row blocks
    assert task.calls[0][1]["chunks"][2] == (128, 512)


def test_the_backends_smallest_gemm_block() -> None:
    """The CPU backend merges chunks into blocks of at least 256 (BLAS's fixed sum order);
    our CUDA kernels sum in K order at any block, so whole chunks do."""
    a, b = spec((1000, 1000), (100, 100)), spec((1000, 1000), (100, 100))
    assert plan(a, b).block_shape == (300, 300)
    gpu = plan(a, b, backend="cuda", device=DEVICE_CLASSES["h100-pcie"])
    assert gpu.block_shape == (100, 100)


def test_a_device_plan_gets_the_backends_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Class defaults are peaks (the backend reaches its flops_fraction of them); calibrated
    and emulated figures are the backend's own."""
    seen = Recorder(candidate.with_device)
    monkeypatch.setattr(candidate, "with_device", seen)
    device = DEVICE_CLASSES["h100-pcie"]
    plan(*SQUARE, backend="cuda", device=device, decode_threads=3, tile_shape=(1024, 1024))
    assert seen.calls[0][0][1:] == (device, 0.25, 3)
    calibrated = dataclasses.replace(device, source="calibrated")
    plan(*SQUARE, backend="cuda", device=calibrated, tile_shape=(1024, 1024))
    assert seen.calls[1][0][1:] == (calibrated, 1.0, 1)
    plan(*SQUARE, backend="cpu", device=device, tile_shape=(1024, 1024))
    assert seen.calls[2][0][1] == device and seen.calls[2][0][2] == 1.0  # no fraction: 1


@pytest.mark.parametrize("budget", [300 * MiB, 2 * GiB])
def test_the_fastest_fitting_plan_is_chosen(budget: int) -> None:
    """Against every candidate planned on its own: the least modelled time, then the fewest
    bytes read, among those that fit. At 300 MiB the 4th candidate (500x3000 tiles) does not
    fit and the best is the 6th: a candidate that does not fit is skipped, not the end."""
    a, b = spec((3000, 2000), (250, 500)), spec((2000, 3000), (500, 250))
    chosen = plan(a, b, memory_limit_bytes=budget)
    block = search.gemm_block(chosen.out)
    scores, skipped = [], []
    for shape in search._tile_shapes(chosen.out, block, False):
        try:
            each = plan(a, b, memory_limit_bytes=budget, tile_shape=shape)
        except MemoryBudgetError:
            skipped.append(shape)
            continue
        scores.append(((each.estimated_seconds, each.read_bytes), shape))
    assert len(scores) > 3
    assert chosen.tile_shape == min(scores)[1]
    if budget == 300 * MiB:
        assert skipped[0] == (500, 3000) and chosen.tile_shape == (1000, 1000)


def test_a_gram_products_tiles_are_square() -> None:
    a = spec((3000, 700), (250, 700))
    got = plan(a, spec((700, 3000), (700, 250)), symmetric=True)
    assert got.tile_shape[0] == got.tile_shape[1]


@pytest.mark.parametrize(
    ("m", "n", "block", "split"),
    [
        (100, 100, (100, 100), 8),  # one block: MIN_TASKS groups (of 10 panels)
        (300, 100, (100, 100), 3),  # 3 blocks: ceil(8 / 3)
        (400, 200, (100, 100), 1),  # 8 blocks: enough
        (0, 100, (1, 100), 1),  # nothing to compute
        (700, 100, (100, 100), 2),  # 7 blocks: ceil(8 / 7)
    ],
)
def test_split_k(m: int, n: int, block: tuple[int, int], split: int) -> None:
    assert search.MIN_TASKS == 8
    assert search._split_k(spec((m, n), (100, 100)), block, 10) == split
    assert search._split_k(spec((m, n), (100, 100)), block, 2) == min(split, 2)


@pytest.mark.parametrize(
    ("count", "multiples"),
    [
        (0, [1]),
        (1, [1]),
        (2, [1, 2]),
        (10, [1, 2, 3, 4, 5, 10]),  # 10 chunks: 10, 5, 4, 3, 2 and 1 tiles
        (7, [1, 2, 3, 4, 7]),
    ],
)
def test_distinct_multiples(count: int, multiples: list[int]) -> None:
    assert search._distinct_multiples(count) == multiples


def test_distinct_multiples_of_long_axes() -> None:
    assert search.MAX_AXIS_CANDIDATES == 48 and search.EXACT_AXIS_CHUNKS == 2**24
    every = search._distinct_multiples(600)  # about 2·√600 distinct tile counts: capped
    assert len(every) == 48 and every[0] == 1 and every[-1] == 600
    many = search._distinct_multiples(2400)  # 97 distinct counts: 33 geometric picks
    assert (len(many), many[:3], many[-3:]) == (33, [1, 2, 3], [127, 240, 2400])
    edge = search._distinct_multiples(2**24)  # the last axis listed exactly: dense at the start
    assert (len(edge), edge[:6], edge[-2:]) == (43, [1, 2, 3, 4, 5, 6], [11725, 2**24])
    huge = search._distinct_multiples(2**30)
    assert 10 < len(huge) <= 48 and huge[0] == 1 and huge[-1] == 2**30
    tiles = {-(-(2**30) // q) for q in huge}
    assert len(tiles) == len(huge)  # each gives its own tile count


def test_tile_candidates() -> None:
    out = spec((1000, 250), (100, 50))
    got = list(search._tile_shapes(out, (200, 100), False))
    # 5 row blocks: 1, 2, 3 or 5 per tile (1000 capped); 3 column blocks: 1, 2, 3
    rows, cols = [200, 400, 600, 1000], [100, 200, 250]
    assert got == [(r, c) for r in rows for c in cols]
    assert list(search._tile_shapes(spec((0, 0), (1, 1)), (1, 1), False)) == [(1, 1)]
    square = list(search._tile_shapes(spec((1000, 1000), (100, 100)), (200, 200), True))
    assert square == [(200, 200), (400, 400), (600, 600), (1000, 1000)]  # a Gram product's


@pytest.mark.parametrize(
    ("shape", "chunks", "least", "block"),
    [
        ((1000, 1000), (100, 300), 256, (300, 300)),
        ((1000, 1000), (100, 300), 1, (100, 300)),  # a GPU kernel: whole chunks only
        ((1000, 1000), (100, 300), 301, (400, 600)),
        ((0, 0), (5, 5), 256, (1, 1)),
        ((50, 2000), (30, 2000), 256, (50, 2000)),
    ],
)
def test_gemm_block(
    shape: tuple[int, int], chunks: tuple[int, int], least: int, block: tuple[int, int]
) -> None:
    assert search.gemm_block(spec(shape, chunks), least) == block


@pytest.mark.parametrize(
    ("k", "a_chunk", "b_chunk", "target", "width"),
    [
        (1000, 300, 100, 200, 300),  # a target below A's chunk: A's chunk whole
        (1000, 100, 300, 200, 300),  # below B's
        (10, 1, 1, 5, 5),  # chunks of one element: any width
        (10, 0, 0, 5, 5),
    ],
)
def test_k_panel_width(k: int, a_chunk: int, b_chunk: int, target: int, width: int) -> None:
    assert search.plan_k_panels(k, a_chunk, b_chunk, target).width == width


def test_k_panels_reach_k() -> None:
    panels = search.plan_k_panels(1000, 100, 100, 400)
    assert (panels.width, len(panels), list(panels)[-1]) == (400, 3, (800, 1000))
    assert len(search.plan_k_panels(1000, 100, 100, 1000)) == 1
    assert len(search.plan_k_panels(-5, 100, 100, 1000)) == 0
    assert search.plan_k_panels(10, 0, 0, 4).width == 4  # chunks of 0 count as 1


def test_the_lower_bound_of_a_plan_with_fewer_tasks_than_threads() -> None:
    """One tile for 4 threads: the one running task has the whole memory, so the I/O lower
    bound (Smith et al., per busy thread) is no more than the inputs read once, which this plan
    reads. It once divided the memory by all 4 threads: 3,813,048 > 3,686,408 bytes, a
    'lower bound' the plan beat (test_plan's hypothesis property found it at random)."""
    a, b = spec((2049, 257), (256, 256)), spec((257, 1537), (256, 256))
    got = plan(a, b, threads_per_worker=4, memory_limit_bytes=300 * MiB)
    assert (got.n_tasks, got.busy_threads) == (1, 1)
    assert got.read_bytes == got.compulsory_read_bytes == 3_686_408
    assert got.read_bytes >= got.lower_bound_read_bytes
    many = plan(a, b, threads_per_worker=4, memory_limit_bytes=300 * MiB, tile_shape=(256, 256))
    assert many.busy_threads == 4  # all threads busy: each a quarter of the memory
    fast = (300 * MiB - memory.WORKER_OVERHEAD_BYTES) // 4
    want = int(2 * 2049 * 1537 * 257 / (fast // 4) ** 0.5) * 4
    assert many.lower_bound_read_bytes == max(want, many.compulsory_read_bytes)

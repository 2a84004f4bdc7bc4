"""The planner: shapes, chunks, dtypes, workers and a memory budget in; a frozen plan out.

Every tile shape with a distinct tile count per axis is tried; the one with the shortest
modelled makespan that fits the memory budget is kept. Pure: no I/O and no dask/zarr/numba.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np

from kernels.backends import CPU, get_backend
from kernels.constants import CPU_GEMM_BLOCK
from pipeline.errors import InputError, MemoryBudgetError, PlanLimitError, UsageError
from pipeline.plan.candidate import BasePlan
from pipeline.plan.costs import CostModel
from pipeline.plan.device_model import VENDOR, DeviceModel
from pipeline.plan.fitted_costs import COSTS
from pipeline.plan.gpu_candidate import fits
from pipeline.plan.layout import output_spec
from pipeline.plan.limits import PlanLimits, check_panels, task_limit_message
from pipeline.plan.matmul import MatmulPlan, ceil_div
from pipeline.plan.memory import WORKER_OVERHEAD_BYTES
from pipeline.plan.operands import check_contraction, symmetric_layout
from pipeline.plan.spec import ArraySpec, KPanels, OutputSpec
from pipeline.plan.units import format_bytes

MIN_TASKS = 8
"""K is split when the output has fewer blocks than this (a property of the problem, not of the
cluster, so the summation tree is the same on any cluster)."""
MAX_AXIS_CANDIDATES = 48
"""Tile sizes tried per axis at most (all of them for up to ~600 chunks)."""
EXACT_AXIS_CHUNKS = 2**24
"""Axes of more chunks get a geometric subset of tile sizes without listing every one (the
exact list takes O(√chunks) time and memory: seconds and hundreds of MB at 10^12)."""
MIN_PANEL_WIDTH = 512
"""Narrower K panels waste BLAS calls and storage requests, so adjacent chunks are merged."""


def plan_k_panels(k: int, a_chunk: int, b_chunk: int, target: int) -> KPanels:
    """K cut every ``width`` elements (about ``target``), the last panel reaching K when it
    is within ``target``; counted, not listed.

    A cut at a boundary of only one grid makes the other array decode that chunk twice, so
    the width is a multiple of both inputs' K chunks when one fits in ``target``, else of
    whichever input's chunk gives the wider panels.
    """
    a_chunk, b_chunk = max(a_chunk, 1), max(b_chunk, 1)
    target = max(target, a_chunk, b_chunk)
    common = math.lcm(a_chunk, b_chunk)
    if common <= target:
        width = target // common * common
    else:
        width = max(target // a_chunk * a_chunk, target // b_chunk * b_chunk)
    k = max(k, 0)
    total = ceil_div(max(k - target, 0), width) + 1 if k else 0
    return KPanels(k, width, total)


def plan_matmul(
    a: ArraySpec,
    b: ArraySpec,
    *,
    workers: int,
    threads_per_worker: int,
    memory_limit_bytes: int,
    panel_width: int | None = None,
    tile_shape: tuple[int, int] | None = None,
    cache_fraction: float = 0.5,
    backend: str = CPU,
    device: DeviceModel | None = None,
    decode_threads: int = 1,
    output: OutputSpec | None = None,
    limits: PlanLimits | None = None,
    transposed: tuple[bool, bool] = (False, False),
    symmetric: bool = False,
    costs: CostModel = COSTS,
) -> MatmulPlan:
    """Choose the tile shape and K split that finish soonest within the memory budget.

    ``tile_shape`` forces a tiling (--resume keeps the one OUT was started with);
    ``cache_fraction`` of the spare memory holds decoded panels for reuse (0 turns it off);
    ``backend`` (a name in kernels.backends) sets the smallest gemm block its rounding allows;
    ``device``: plan a GPU backend's tiles against that device's memory (the accumulator
    lives there; the host holds pinned staging) and its modelled rates, with
    ``decode_threads`` host threads per worker decoding panels;
    ``output``: OUT's dtype, chunks and shards as asked (default: follow the inputs);
    ``limits``: the most tasks and K panels per task (PlanLimitError beyond them);
    ``a`` and ``b`` are the operands as used: ``transposed`` says which are read transposed
    (the memory model counts the copy that places them); ``symmetric``: a Gram product
    (op(B) = op(A)ᵀ), square tiles, only those on and above the diagonal; ``costs``: the
    host's cost model (pipeline.facts.host.host_costs), default the calibration's as committed.
    """
    _check_operands(a, b)
    _check_workers(workers, threads_per_worker)
    output = output or OutputSpec()
    out, compute_dtype = output_spec(a, b, output)
    if symmetric:
        symmetric_layout(out)
    width = panel_width or max(MIN_PANEL_WIDTH, a.chunks[1], b.chunks[0])
    panels = plan_k_panels(a.shape[1], a.chunks[1], b.chunks[0], width)
    limits = limits or PlanLimits()
    check_panels(panels, limits)
    spec = get_backend(backend)
    block = gemm_block(out, spec.min_gemm_block)
    base = BasePlan(
        a=a, b=b, out=out, compute_dtype=compute_dtype, k_panels=panels,
        split_k=_split_k(out, block, len(panels)), workers=workers,
        threads_per_worker=threads_per_worker, memory_limit_bytes=memory_limit_bytes,
        block_shape=block, costs=costs, transposed=transposed, symmetric=symmetric,
        prior=output.accumulate, cache_fraction=cache_fraction, device=device,
        flops_fraction=_flops_fraction(device, spec.flops_fraction), decode_threads=decode_threads,
    )  # fmt: skip
    shapes = [tile_shape] if tile_shape else _tile_shapes(out, block, symmetric)
    return _pick((base.candidate(s) for s in shapes), limits, forced=tile_shape is not None)


def _pick(plans: Iterable[MatmulPlan], limits: PlanLimits, *, forced: bool) -> MatmulPlan:
    """The plan with the shortest modelled makespan (ties: fewer bytes read) among those that
    fit the memory and the task limit; PlanLimitError or MemoryBudgetError when none does."""
    best: tuple[tuple[float, int], MatmulPlan] | None = None
    smallest: MatmulPlan | None = None
    fewest: MatmulPlan | None = None  # the fewest tasks among those that fit the memory
    for plan in plans:
        if smallest is None or plan.worker_bytes < smallest.worker_bytes:
            smallest = plan
        if not fits(plan, plan.memory_limit_bytes):
            continue
        if fewest is None or plan.n_tasks < fewest.n_tasks:
            fewest = plan
        if plan.n_tasks > limits.max_tasks:
            continue
        score = (plan.estimated_seconds, plan.read_bytes)
        if best is None or score < best[0]:
            best = (score, plan)
    if best is not None:
        return best[1]
    if fewest is not None:
        raise PlanLimitError(task_limit_message(fewest, limits, forced))
    assert smallest is not None
    raise MemoryBudgetError(_budget_message(smallest, smallest.memory_limit_bytes))


def _check_workers(workers: int, threads_per_worker: int) -> None:
    if workers < 1 or threads_per_worker < 1:
        raise UsageError(
            f"need at least one worker and one thread, got {workers} worker(s) "
            f"with {threads_per_worker} thread(s)"
        )


def _flops_fraction(device: DeviceModel | None, backend_fraction: float | None) -> float:
    """The share of the device's rate a plan counts on: calibrated and emulated figures are
    the backend's own rates; a device class's defaults are peaks."""
    if device is not None and device.source != VENDOR:
        return 1.0
    return backend_fraction or 1.0


def _check_operands(a: ArraySpec, b: ArraySpec) -> None:
    for name, spec in (("A", a), ("B", b)):
        if len(spec.shape) != 2:
            raise InputError(
                f"{name} has {len(spec.shape)} dimension(s) {spec.shape}; "
                "only 2-D matrices can be multiplied"
            )
    check_contraction(a.shape, b.shape)  # with the transposes that would contract


def gemm_block(out: ArraySpec, min_block: int = CPU_GEMM_BLOCK) -> tuple[int, int]:
    """Whole output chunks (whole shards when sharded: one writer per stored object), at
    least ``min_block`` (or the whole axis) along each axis."""
    (m, n), (cm, cn) = out.shape, out.outer_chunks
    rows = min(cm * ceil_div(min_block, cm), max(m, 1))
    cols = min(cn * ceil_div(min_block, cn), max(n, 1))
    return (max(rows, 1), max(cols, 1))


def _tile_shapes(
    out: ArraySpec, block: tuple[int, int], symmetric: bool
) -> Iterator[tuple[int, int]]:
    """Tile shapes made of whole blocks, one per distinct tile count along each axis; square
    ones only for a Gram product (one grid both ways: a tile's mirror is a tile)."""
    (m, n), (bm, bn) = out.shape, block
    for rows in _distinct_multiples(ceil_div(m, bm)):
        for cols in _distinct_multiples(ceil_div(n, bn)):
            shape = (max(min(rows * bm, m), 1), max(min(cols * bn, n), 1))
            if not symmetric or shape[0] == shape[1]:
                yield shape


def _distinct_multiples(count: int) -> list[int]:
    """Chunks per tile giving every distinct number of tiles along an axis of ``count`` chunks.

    ceil(count / q) takes O(√count) distinct values; past MAX_AXIS_CANDIDATES of them a
    geometric subset is kept, so planning a million-chunk axis stays fast. Past
    EXACT_AXIS_CHUNKS chunks even listing them is too slow: a geometric subset of chunks per
    tile is taken directly, each the fewest giving its tile count.
    """
    if count <= 1:
        return [1]
    if count > EXACT_AXIS_CHUNKS:
        tries = np.geomspace(1, count, MAX_AXIS_CANDIDATES)
        return sorted({ceil_div(count, ceil_div(count, int(q))) for q in tries})
    values, q = set(), 1
    while q <= count:
        value = ceil_div(count, q)
        values.add(value)
        q = (count - 1) // (value - 1) + 1 if value > 1 else count + 1  # next q with a new value
    ordered = sorted(values)
    if len(ordered) <= MAX_AXIS_CANDIDATES:
        return ordered
    picks = np.unique(np.geomspace(1, len(ordered), MAX_AXIS_CANDIDATES).astype(int) - 1)
    return [ordered[i] for i in picks]


def _split_k(out: ArraySpec, block: tuple[int, int], panels: int) -> int:
    """K groups per tile: more only when the output has fewer than MIN_TASKS blocks."""
    (m, n), (bm, bn) = out.shape, block
    blocks = ceil_div(m, bm) * ceil_div(n, bn)
    if blocks == 0 or blocks >= MIN_TASKS:
        return 1
    return max(min(panels, ceil_div(MIN_TASKS, blocks)), 1)


def _budget_message(plan: MatmulPlan, memory_limit_bytes: int) -> str:
    need = plan.worker_bytes + WORKER_OVERHEAD_BYTES
    shards = " (or give OUT smaller --shards: a tile holds whole shards)" if plan.out.shards else ""
    busy = plan.busy_threads
    if plan.device and need <= memory_limit_bytes:  # the GPU is what is short
        return (
            f"no plan fits the device memory: the smallest needs "
            f"{format_bytes(busy * plan.device_bytes)} per GPU ({busy} task(s) x "
            f"{format_bytes(plan.device_bytes)} for {plan.tile_shape[0]}x{plan.tile_shape[1]} "
            f"tiles) but {plan.device.name} has {format_bytes(plan.device.memory_bytes)}; raise "
            f"--device-memory-limit, or store the inputs with smaller chunks{shards}"
        )
    return (
        f"no plan fits the memory limit: the smallest needs {format_bytes(need)} per worker "
        f"({plan.threads_per_worker} thread(s) x {format_bytes(plan.task_bytes)} per task for "
        f"{plan.tile_shape[0]}x{plan.tile_shape[1]} tiles, plus "
        f"{format_bytes(WORKER_OVERHEAD_BYTES)} overhead) but the limit is "
        f"{format_bytes(memory_limit_bytes)}; raise --memory-limit, use fewer threads per "
        f"worker, or store the inputs with smaller chunks{shards}"
    )

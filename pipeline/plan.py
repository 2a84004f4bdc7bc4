"""The pure planner: shapes, chunks, dtypes, workers and a memory budget in; a frozen plan out.

No I/O and no dask/zarr/numba imports. Every size is an int: elements or ``*_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.errors import InputError, MemoryBudgetError, UsageError
from pipeline.memory import WORKER_OVERHEAD_BYTES, calculate_task_bytes
from pipeline.spec import ArraySpec, Tile
from pipeline.units import format_bytes

MIN_GEMM_BLOCK = 256
"""BLAS is called on fixed output blocks (whole chunks, at least this many rows and columns),
whatever the tile: OpenBLAS's result depends on the call's M and N, so fixed blocks give the
same bytes on any cluster. Tiles are whole blocks."""
MIN_TASKS = 8
"""K is split when the output has fewer blocks than this (a property of the problem, not of the
cluster, so the summation tree is the same on any cluster)."""
MAX_AXIS_CANDIDATES = 48
"""Tile sizes tried per axis at most (all of them for up to ~600 chunks)."""
MIN_PANEL_WIDTH = 512
"""Narrower K panels waste BLAS calls and storage requests, so adjacent chunks are merged."""
FLOPS_PER_THREAD = 90e9
"""One thread's float32 multiply rate, in flop/s (OpenBLAS sgemm measured here; float64 half)."""
DECODE_BYTES_PER_THREAD = 0.5e9
"""Planning guess of one thread's read-and-decode (or encode-and-write) rate, in bytes/s."""
TASK_OVERHEAD_SECONDS = 0.05
"""Scheduling, store opening and Python per task: favours fewer, bigger tasks on a tie."""
REDUCE_BYTES_PER_SECOND = 2e9
"""Planning guess of moving and adding split-K partials, in bytes/s."""


@dataclass(frozen=True)
class MatmulPlan:
    """How ``out = a @ b`` is cut into tasks, and what that costs."""

    a: ArraySpec
    b: ArraySpec
    out: ArraySpec
    compute_dtype: str
    """dtype of the accumulator and of the panels given to the kernel."""
    tile_shape: tuple[int, int]
    """Rows and columns of a full tile, in elements (whole output chunks)."""
    k_panels: tuple[tuple[int, int], ...]
    """[k0, k1) ranges that every tile streams, in order."""
    split_k: int
    """Number of K groups per tile; 1 means no split."""
    workers: int
    threads_per_worker: int
    memory_limit_bytes: int
    """Budget of one worker process, in bytes."""
    block_shape: tuple[int, int]
    """Rows and columns of the fixed output blocks each gemm call computes (whole chunks)."""
    task_bytes: int
    """Projected peak host memory of one task, in bytes."""
    worker_bytes: int
    """Projected peak host memory of one worker (its busy threads and held partials), in bytes."""
    device_bytes: int
    """Projected device memory of one task on the cuda backend, in bytes."""
    cache_bytes: int = 0
    """Budget of each worker's shared cache of decoded panels, in bytes (spare memory)."""

    @property
    def grid(self) -> tuple[int, int]:
        """Number of tile rows and tile columns."""
        (m, n), (tm, tn) = self.out.shape, self.tile_shape
        return (_ceil_div(m, tm), _ceil_div(n, tn))

    @property
    def n_tiles(self) -> int:
        rows, cols = self.grid
        return rows * cols

    @property
    def n_tasks(self) -> int:
        return self.n_tiles * self.split_k

    @property
    def flops(self) -> int:
        (m, k), n = self.a.shape, self.b.shape[1]
        return 2 * m * n * k

    @property
    def read_bytes(self) -> int:
        """Planned bytes read from storage.

        Each tile needs its A row block and B column block. Tiles run column by column, T at a
        time per worker, sharing decoded panels through the worker's cache: a B column block is
        decoded once per wave of T tiles when the cache holds their current panels, once per
        worker when it holds the whole block; A once per worker when all of A fits beside it.
        """
        (m, k), n = self.a.shape, self.b.shape[1]
        rows, cols = self.grid
        (tm, tn), c = self.tile_shape, np.dtype(self.compute_dtype).itemsize
        width = max((k1 - k0 for k0, k1 in self.k_panels), default=0)
        threads, workers = self.threads_per_worker, self.workers
        b_block = k * tn * c
        # The LRU also holds the panels the running tasks use and prefetch, and the B blocks
        # of two columns while one column's last tiles overlap the next column's first.
        in_flight = threads * 2 * (tm + tn) * width * c
        if self.cache_bytes >= b_block + in_flight:
            b_times = min(rows, workers)
        elif self.cache_bytes >= in_flight:
            b_times = _ceil_div(rows, threads)
        else:
            b_times = rows
        a_fits = self.cache_bytes >= m * k * c + min(threads, cols) * b_block + in_flight
        a_times = min(cols, workers) if a_fits else cols
        a_bytes = m * k * np.dtype(self.a.dtype).itemsize
        b_bytes = k * n * np.dtype(self.b.dtype).itemsize
        return a_times * a_bytes + b_times * b_bytes

    @property
    def compulsory_read_bytes(self) -> int:
        """Every input element once."""
        (m, k), n = self.a.shape, self.b.shape[1]
        return m * k * np.dtype(self.a.dtype).itemsize + k * n * np.dtype(self.b.dtype).itemsize

    @property
    def lower_bound_read_bytes(self) -> int:
        """Smith et al.: 2·m·n·k/√S elements, S = fast-memory elements per worker thread."""
        (m, k), n = self.a.shape, self.b.shape[1]
        item = max(np.dtype(self.a.dtype).itemsize, np.dtype(self.b.dtype).itemsize)
        per_thread = (self.memory_limit_bytes - WORKER_OVERHEAD_BYTES) // self.threads_per_worker
        s = max(per_thread // np.dtype(self.compute_dtype).itemsize, 1)
        bound = int(2 * m * n * k / math.sqrt(s)) * item
        return max(bound, self.compulsory_read_bytes)

    @property
    def estimated_seconds(self) -> float:
        """The planner's makespan model on this plan's workers (CPU rates; a rough guide)."""
        return _estimated_seconds(self)

    def tiles(self) -> Iterator[Tile]:
        """Tiles column by column: concurrent tiles then share B panels (see read_bytes)."""
        (m, n), (tm, tn) = self.out.shape, self.tile_shape
        rows, cols = self.grid
        for j in range(cols):
            for i in range(rows):
                yield Tile((i, j), (i * tm, min((i + 1) * tm, m)), (j * tn, min((j + 1) * tn, n)))

    def k_groups(self) -> list[tuple[tuple[int, int], ...]]:
        """The K panels split into ``split_k`` contiguous groups (fixed order: deterministic)."""
        return [tuple(g) for g in _split_even(list(self.k_panels), self.split_k)]


def result_dtype(a_dtype: str, b_dtype: str) -> tuple[str, str]:
    """Output dtype (``numpy.result_type``) and accumulator dtype; refuses non-numeric ones."""
    for name, dt in (("A", np.dtype(a_dtype)), ("B", np.dtype(b_dtype))):
        if dt.kind not in "biufc":
            raise InputError(
                f"{name} has dtype {dt}, which is not numeric; "
                "convert it to a float, integer or complex dtype"
            )
    out = np.result_type(a_dtype, b_dtype)
    compute = np.dtype("float32") if out == np.float16 else out
    return str(out), str(compute)


def plan_k_panels(k: int, a_chunk: int, b_chunk: int, target: int) -> tuple[tuple[int, int], ...]:
    """K ranges of about ``target`` wide, cut where both inputs' chunks end when possible.

    A cut at a boundary of only one grid makes the other array decode that chunk twice,
    so boundaries shared by both grids are preferred, then either grid's, then any.
    """
    target = max(target, a_chunk, b_chunk, 1)
    panels, start = [], 0
    while start < k:
        limit = min(start + target, k)
        stop = limit
        if limit < k:
            common = _last_multiple(limit, math.lcm(a_chunk, b_chunk))
            either = max(_last_multiple(limit, a_chunk), _last_multiple(limit, b_chunk))
            stop = common if common > start else either if either > start else limit
        panels.append((start, stop))
        start = stop
    return tuple(panels)


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
    min_block: int = MIN_GEMM_BLOCK,
) -> MatmulPlan:
    """Choose the tile shape and K split that finish soonest within the memory budget.

    ``tile_shape`` forces a tiling (--resume keeps the one OUT was started with);
    ``cache_fraction`` of the spare memory holds decoded panels for reuse (0 turns it off);
    ``min_block`` is the smallest gemm block (1 for kernels whose rounding ignores the launch
    shape, like ours on the GPU).
    """
    _check_operands(a, b)
    if workers < 1 or threads_per_worker < 1:
        raise UsageError(
            f"need at least one worker and one thread, got {workers} worker(s) "
            f"with {threads_per_worker} thread(s)"
        )
    out_dtype, compute_dtype = result_dtype(a.dtype, b.dtype)
    (m, k), n = a.shape, b.shape[1]
    out = ArraySpec((m, n), (a.chunks[0], b.chunks[1]), out_dtype)
    width = panel_width or max(MIN_PANEL_WIDTH, a.chunks[1], b.chunks[0])
    panels = plan_k_panels(k, a.chunks[1], b.chunks[0], width)
    best: tuple[tuple[float, int], MatmulPlan] | None = None
    smallest: MatmulPlan | None = None
    block = gemm_block(out, min_block)
    split = _split_k(out, block, len(panels))
    candidates = [tile_shape] if tile_shape else _tile_candidates(out, block)
    for shape in candidates:
        plan = _candidate(
            a, b, out, compute_dtype, shape, panels, (workers, threads_per_worker), block, split
        )
        plan = _with_budget(plan, memory_limit_bytes, cache_fraction)
        if smallest is None or plan.worker_bytes < smallest.worker_bytes:
            smallest = plan
        if plan.worker_bytes + WORKER_OVERHEAD_BYTES > memory_limit_bytes:
            continue
        score = (_estimated_seconds(plan), plan.read_bytes)
        if best is None or score < best[0]:
            best = (score, plan)
    if best is None:
        assert smallest is not None
        raise MemoryBudgetError(_budget_message(smallest, memory_limit_bytes))
    return best[1]


def _check_operands(a: ArraySpec, b: ArraySpec) -> None:
    for name, spec in (("A", a), ("B", b)):
        if len(spec.shape) != 2:
            raise InputError(
                f"{name} has {len(spec.shape)} dimension(s) {spec.shape}; "
                "only 2-D matrices can be multiplied"
            )
    if a.shape[1] != b.shape[0]:
        raise InputError(
            f"shapes do not contract: A is {a.shape[0]}x{a.shape[1]} and B is "
            f"{b.shape[0]}x{b.shape[1]}; A's columns ({a.shape[1]}) must equal B's rows "
            f"({b.shape[0]})"
        )


WRITE_BANDS = 8
"""A tile's last K panel is multiplied in up to this many bands of whole gemm-block rows, each
written while the next is computed: only the last band's write is left after the product."""


def row_bands(rows: int, block_rows: int | None) -> list[tuple[int, int]]:
    """Up to WRITE_BANDS bands of whole block rows (the last may be short) covering ``rows``."""
    if rows <= 0:
        return [(0, 0)]
    unit = max(block_rows or rows, 1)
    step = unit * _ceil_div(_ceil_div(rows, unit), WRITE_BANDS)  # whole blocks per band
    return [(r, min(r + step, rows)) for r in range(0, rows, step)]


def gemm_block(out: ArraySpec, min_block: int = MIN_GEMM_BLOCK) -> tuple[int, int]:
    """Whole output chunks, at least ``min_block`` (or the whole axis) along each axis."""
    (m, n), (cm, cn) = out.shape, out.chunks
    rows = min(cm * _ceil_div(min_block, cm), max(m, 1))
    cols = min(cn * _ceil_div(min_block, cn), max(n, 1))
    return (max(rows, 1), max(cols, 1))


def _tile_candidates(out: ArraySpec, block: tuple[int, int]) -> Iterator[tuple[int, int]]:
    """Tile shapes made of whole blocks, one per distinct tile count along each axis."""
    (m, n), (bm, bn) = out.shape, block
    for rows in _distinct_multiples(_ceil_div(m, bm)):
        for cols in _distinct_multiples(_ceil_div(n, bn)):
            yield (max(min(rows * bm, m), 1), max(min(cols * bn, n), 1))


def _distinct_multiples(count: int) -> list[int]:
    """Chunks per tile giving every distinct number of tiles along an axis of ``count`` chunks.

    ceil(count / q) takes O(√count) distinct values; past MAX_AXIS_CANDIDATES of them a
    geometric subset is kept, so planning a million-chunk axis stays fast.
    """
    if count <= 1:
        return [1]
    values, q = set(), 1
    while q <= count:
        value = _ceil_div(count, q)
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
    blocks = _ceil_div(m, bm) * _ceil_div(n, bn)
    if blocks == 0 or blocks >= MIN_TASKS:
        return 1
    return max(min(panels, _ceil_div(MIN_TASKS, blocks)), 1)


def _candidate(
    a: ArraySpec,
    b: ArraySpec,
    out: ArraySpec,
    compute_dtype: str,
    tile_shape: tuple[int, int],
    panels: tuple[tuple[int, int], ...],
    cluster: tuple[int, int],
    block: tuple[int, int],
    split: int,
) -> MatmulPlan:
    return MatmulPlan(
        a=a,
        b=b,
        out=out,
        compute_dtype=compute_dtype,
        tile_shape=tile_shape,
        k_panels=panels,
        split_k=split,
        workers=cluster[0],
        threads_per_worker=cluster[1],
        memory_limit_bytes=0,
        block_shape=block,
        task_bytes=0,
        worker_bytes=0,
        device_bytes=0,
    )


def _with_budget(plan: MatmulPlan, memory_limit_bytes: int, cache_fraction: float) -> MatmulPlan:
    """Fill in the projected memory of a task and of a worker."""
    from dataclasses import replace

    task, device = calculate_task_bytes(plan)
    tm, tn = plan.tile_shape
    acc = tm * tn * np.dtype(plan.compute_dtype).itemsize
    # Split-K partials wait in worker memory until their reduction runs.
    held = _ceil_div(plan.n_tasks, plan.workers) * acc if plan.split_k > 1 else 0
    busy = min(plan.threads_per_worker, plan.n_tasks)
    worker = busy * task + held
    # A share of the spare memory (at most all of both inputs) keeps decoded panels for reuse.
    spare = memory_limit_bytes - WORKER_OVERHEAD_BYTES - worker
    c_item = np.dtype(plan.compute_dtype).itemsize
    inputs = (plan.a.shape[0] * plan.a.shape[1] + plan.b.shape[0] * plan.b.shape[1]) * c_item
    cache = max(min(int(spare * cache_fraction), inputs), 0)
    return replace(
        plan,
        memory_limit_bytes=memory_limit_bytes,
        task_bytes=task,
        worker_bytes=worker + cache,
        device_bytes=device,
        cache_bytes=cache,
    )


def _estimated_seconds(plan: MatmulPlan) -> float:
    """Makespan model: rounds of equal tasks, each multiplying and decoding its panels, then
    the split-K tree (three tile buffers moved per level) and the tile's single writer."""
    tm, tn = plan.tile_shape
    k = plan.a.shape[1]
    task_flops = 2 * tm * tn * k / plan.split_k
    task_read = plan.read_bytes / max(plan.n_tasks, 1)
    rounds = _ceil_div(plan.n_tasks, plan.workers * plan.threads_per_worker)
    rate = FLOPS_PER_THREAD * 4 / max(np.dtype(plan.compute_dtype).itemsize, 4)
    task = task_flops / rate + task_read / DECODE_BYTES_PER_THREAD
    product = rounds * (task + TASK_OVERHEAD_SECONDS)
    acc = tm * tn * np.dtype(plan.compute_dtype).itemsize
    levels = math.ceil(math.log2(plan.split_k)) if plan.split_k > 1 else 0
    write_rounds = _ceil_div(plan.n_tiles, plan.workers * plan.threads_per_worker)
    finish = levels * 3 * acc / REDUCE_BYTES_PER_SECOND + acc / DECODE_BYTES_PER_THREAD
    return product + write_rounds * finish


def _budget_message(plan: MatmulPlan, memory_limit_bytes: int) -> str:
    need = plan.worker_bytes + WORKER_OVERHEAD_BYTES
    return (
        f"no plan fits the memory limit: the smallest needs {format_bytes(need)} per worker "
        f"({plan.threads_per_worker} thread(s) x {format_bytes(plan.task_bytes)} per task for "
        f"{plan.tile_shape[0]}x{plan.tile_shape[1]} tiles, plus "
        f"{format_bytes(WORKER_OVERHEAD_BYTES)} overhead) but the limit is "
        f"{format_bytes(memory_limit_bytes)}; raise --memory-limit, use fewer threads per "
        "worker, or store the inputs with smaller chunks"
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _last_multiple(limit: int, step: int) -> int:
    return (limit // step) * step


def _split_even(items: list[tuple[int, int]], groups: int) -> list[list[tuple[int, int]]]:
    size, extra = divmod(len(items), groups)
    out, start = [], 0
    for g in range(groups):
        stop = start + size + (1 if g < extra else 0)
        out.append(items[start:stop])
        start = stop
    return out

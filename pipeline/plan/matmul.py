"""The plan's frozen form: how ``out = a @ b`` is cut into tasks, and the figures that follow
from it (reads, the makespan model). Pure: no I/O and no dask/zarr/numba imports. Every size is
an int: elements or ``*_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kernels import exact
from pipeline.plan.costs import CostModel
from pipeline.plan.device_model import DeviceModel
from pipeline.plan.memory import WORKER_OVERHEAD_BYTES
from pipeline.plan.model import Work, chunks_per_pass, grouped, makespan, resource_seconds
from pipeline.plan.spec import ArraySpec, KPanels, Tile

REDUCE_BYTES_PER_SECOND = 2e9
"""Planning guess of moving and adding split-K partials, in bytes/s."""


@dataclass(frozen=True)
class MatmulPlan:
    """How ``out = a @ b`` is cut into tasks, and what that costs."""

    a: ArraySpec
    b: ArraySpec
    out: ArraySpec
    compute_dtype: str
    """dtype of the accumulator, and of the panels given to the kernel but for integers
    (``panel_dtype``)."""
    tile_shape: tuple[int, int]
    """Rows and columns of a full tile, in elements (whole output chunks, or shards)."""
    k_panels: KPanels
    """[k0, k1) ranges that every tile streams, in order (counted, not listed)."""
    split_k: int
    """Number of K groups per tile; 1 means no split."""
    workers: int
    threads_per_worker: int
    memory_limit_bytes: int
    """Budget of one worker process, in bytes."""
    block_shape: tuple[int, int]
    """Rows and columns of the fixed output blocks each gemm call computes (whole chunks, or
    whole shards when OUT is sharded)."""
    task_bytes: int
    """Projected peak host memory of one task, in bytes."""
    worker_bytes: int
    """Projected peak host memory of one worker (its busy threads and held partials), in bytes."""
    device_bytes: int
    """Projected device memory of one task on the cuda backend, in bytes."""
    costs: CostModel
    """The host's cost model the plan's seconds are modelled with (plan.costs.for_host, or the
    calibration's as committed)."""
    cache_bytes: int = 0
    """Budget of each worker's shared cache of decoded panels, in bytes (spare memory)."""
    device: DeviceModel | None = None
    """The GPU each worker drives (None: a CPU plan, the accumulator on the host)."""
    resource_seconds: tuple[tuple[str, float], ...] = ()
    """A GPU plan's modelled busy seconds per resource of one worker (plan.device_model)."""
    modelled_seconds: float | None = None
    """A GPU plan's modelled makespan, in seconds (None: the CPU model)."""
    decode_threads: int = 1
    """A GPU plan's host threads per worker decoding panels ahead of the device."""
    flops_fraction: float = 1.0
    """A GPU plan's share of the device's rate its backend is taken to reach (1: the rates
    are the backend's own, calibrated or emulated)."""
    transposed: tuple[bool, bool] = (False, False)
    """A and B are read transposed (``a`` and ``b`` are then the specs of op(A) and op(B))."""
    symmetric: bool = False
    """A Gram product (op(B) = op(A)ᵀ): square tiles on one grid, only those on and above the
    diagonal are tasks, each written with its mirror."""
    precision: str = "fp32"
    """The kernel's arithmetic (kernels.backends.PRECISIONS): fp32, or TF32 / 3xTF32 tensor
    cores; stated by --dry-run, fingerprinted, recorded in OUT (the rates stay fp32's)."""
    memory_source: str = ""
    """Where ``memory_limit_bytes`` comes from, as the dry run names it (empty: not said)."""

    @property
    def panel_dtype(self) -> str:
        """The dtype panels are read in: the accumulator's, or for integers the float that
        multiplies them exactly through BLAS (kernels.exact)."""
        return exact.panel_dtype(self.a.dtype, self.b.dtype, self.compute_dtype)

    @property
    def product_dtype(self) -> str:
        """The dtype the product runs in at worst (kernels.exact.product_dtype): the compute
        dtype, or for integers the float of their exact blocks."""
        return exact.product_dtype(self.a.dtype, self.b.dtype, self.compute_dtype)

    @property
    def panel_width(self) -> int:
        """The widest K panel, in elements."""
        return self.k_panels.widest

    @property
    def panel_pair_bytes(self) -> int:
        """One A and one B panel of a full tile as read (``panel_dtype``), in bytes."""
        tm, tn = self.tile_shape
        return (tm + tn) * self.panel_width * np.dtype(self.panel_dtype).itemsize

    @property
    def busy_threads(self) -> int:
        """Tasks a worker runs at once."""
        return min(self.threads_per_worker, self.n_tasks)

    @property
    def grid(self) -> tuple[int, int]:
        """Number of tile rows and tile columns."""
        (m, n), (tm, tn) = self.out.shape, self.tile_shape
        return (ceil_div(m, tm), ceil_div(n, tn))

    @property
    def n_tiles(self) -> int:
        rows, cols = self.grid
        return rows * (rows + 1) // 2 if self.symmetric else rows * cols

    @property
    def n_tasks(self) -> int:
        return self.n_tiles * self.split_k

    @property
    def flops(self) -> int:
        """Useful flops: 2mnk, or for a Gram product those of its upper triangle, k·m·(m+1)
        (the sum of ``tile_flops`` over the tasks' tiles)."""
        (m, k), n = self.a.shape, self.b.shape[1]
        return k * m * (m + 1) if self.symmetric else 2 * m * n * k

    def tile_flops(self, tile: Tile) -> int:
        """One tile's useful flops: a Gram product's diagonal tile counts its upper triangle."""
        (h, w), k = tile.shape, self.a.shape[1]
        if self.symmetric and tile.index[0] == tile.index[1]:
            return k * h * (h + 1)
        return 2 * h * w * k

    @property
    def read_bytes(self) -> int:
        """Planned bytes read from storage.

        Each tile needs its A row block and B column block. Tiles run column by column, T at a
        time per worker, sharing decoded panels through the worker's cache: a B column block is
        decoded once per wave of T tiles when the cache holds their current panels, once per
        worker when it holds the whole block; A once per worker when all of A fits beside it.
        """
        (m, k), n = self.a.shape, self.b.shape[1]
        # Tiles sharing an A row block and a B column block (a Gram product has about half).
        cols, rows = (ceil_div(self.n_tiles, max(g, 1)) for g in self.grid)
        (tm, tn), c = self.tile_shape, np.dtype(self.compute_dtype).itemsize
        width = self.panel_width
        threads, workers = self.threads_per_worker, self.workers
        b_block = k * tn * c
        # The LRU also holds the panels the running tasks use and prefetch, and the B blocks
        # of two columns while one column's last tiles overlap the next column's first.
        in_flight = threads * 2 * (tm + tn) * width * c
        if self.cache_bytes >= b_block + in_flight:
            b_times = min(rows, workers)
        elif self.cache_bytes >= in_flight:
            b_times = ceil_div(rows, threads)
        else:
            b_times = rows
        a_fits = self.cache_bytes >= m * k * c + min(threads, cols) * b_block + in_flight
        a_times = min(cols, workers) if a_fits else cols
        a_bytes = m * k * np.dtype(self.a.dtype).itemsize
        b_bytes = k * n * np.dtype(self.b.dtype).itemsize
        if self.symmetric:  # B's blocks are X's, in the same cache: all of X once per worker
            # when it fits; else each column's diagonal tile reads one block for both operands
            return a_times * a_bytes if a_fits else (a_times + b_times - 1) * a_bytes
        return a_times * a_bytes + b_times * b_bytes

    @property
    def compulsory_read_bytes(self) -> int:
        """Every input element once (a Gram product's one input once)."""
        (m, k), n = self.a.shape, self.b.shape[1]
        a_bytes = m * k * np.dtype(self.a.dtype).itemsize
        return a_bytes if self.symmetric else a_bytes + k * n * np.dtype(self.b.dtype).itemsize

    @property
    def lower_bound_read_bytes(self) -> int:
        """Smith et al.: 2·m·n·k/√S elements, S = fast-memory elements per busy worker thread
        (its share of the GPU's memory on a GPU plan, else of the worker's memory limit: a plan
        of fewer tasks than threads leaves each running task more); for a Gram product its
        flops (about half) over √S."""
        item = max(np.dtype(self.a.dtype).itemsize, np.dtype(self.b.dtype).itemsize)
        fast = (
            self.device.memory_bytes
            if self.device
            else self.memory_limit_bytes - WORKER_OVERHEAD_BYTES
        )
        per_thread = fast // max(self.busy_threads, 1)
        s = max(per_thread // np.dtype(self.compute_dtype).itemsize, 1)
        bound = int(self.flops / math.sqrt(s)) * item
        return max(bound, self.compulsory_read_bytes)

    @property
    def estimated_seconds(self) -> float:
        """The planner's makespan model on this plan's workers (a rough guide)."""
        if self.modelled_seconds is not None:
            return self.modelled_seconds
        return estimated_seconds(self)

    @property
    def bound_by(self) -> str:
        """The resource the model says limits the run (on the CPU: product, decode -- reading
        and decoding the inputs -- or write -- encoding and storing OUT)."""
        seconds = dict(self.resource_seconds) or grouped(dict(cpu_resource_seconds(self)))
        return max(seconds, key=lambda k: seconds[k])

    def tiles(self) -> Iterator[Tile]:
        """Tiles column by column: concurrent tiles then share B panels (see read_bytes); a
        Gram product's on and above the diagonal only."""
        (m, n), (tm, tn) = self.out.shape, self.tile_shape
        rows, cols = self.grid
        for j in range(cols):
            for i in range(min(j + 1, rows) if self.symmetric else rows):
                yield Tile((i, j), (i * tm, min((i + 1) * tm, m)), (j * tn, min((j + 1) * tn, n)))

    def k_groups(self) -> list[KPanels]:
        """The K panels split into ``split_k`` contiguous groups (fixed order: deterministic)."""
        size, extra = divmod(len(self.k_panels), self.split_k)
        starts = [g * size + min(g, extra) for g in range(self.split_k + 1)]
        return [self.k_panels[starts[g] : starts[g + 1]] for g in range(self.split_k)]


def cpu_work(plan: MatmulPlan) -> Work:
    """A plan's chunks, bytes and flops (pipeline.plan.model). Inputs are read as often as
    the read model says (read_bytes over each input once), each read decoding every chunk its
    tile's rows and panels touch, whole; OUT's chunks are each encoded and written once."""
    (m, k), n = plan.a.shape, plan.b.shape[1]
    (tm, tn), width = plan.tile_shape, plan.panel_width
    passes = plan.read_bytes / max(plan.compulsory_read_bytes, 1)
    a_chunks = chunks_per_pass(m, tm, plan.a.chunks[0]) * chunks_per_pass(
        k, width, plan.a.chunks[1]
    )
    b_chunks = chunks_per_pass(k, width, plan.b.chunks[0]) * chunks_per_pass(
        n, tn, plan.b.chunks[1]
    )
    if plan.symmetric:  # one input, X, read for both operands
        b_chunks = 0.0
    a_item, b_item = np.dtype(plan.a.dtype).itemsize, np.dtype(plan.b.dtype).itemsize
    decoded = (
        a_chunks * math.prod(plan.a.chunks) * a_item + b_chunks * math.prod(plan.b.chunks) * b_item
    )
    (om, on), outer = plan.out.chunks, plan.out.outer_chunks
    out_chunks = ceil_div(m, om) * ceil_div(n, on)
    out_objects = ceil_div(m, outer[0]) * ceil_div(n, outer[1])
    acc = plan.flops / max(2 * k, 1) * np.dtype(plan.compute_dtype).itemsize  # a Gram's half
    product = plan.product_dtype
    return Work(
        flops=plan.flops,
        compute_itemsize=np.dtype(product).itemsize,
        integer_product=exact.is_integer(product),
        read_chunks=passes * (a_chunks + b_chunks),
        read_bytes=passes * decoded,
        out_chunks=out_chunks,
        out_objects=out_objects,
        out_bytes=m * n * np.dtype(plan.out.dtype).itemsize,
        compressed=np.dtype(plan.out.dtype).kind not in "fc",
        tasks=plan.n_tasks,
        accumulated_bytes=acc * len(plan.k_panels),
        allocated_bytes=acc * plan.split_k,
    )


def cpu_resource_seconds(plan: MatmulPlan) -> tuple[tuple[str, float], ...]:
    """A CPU plan's modelled thread-seconds per resource of one worker (its threads shared)."""
    seconds = resource_seconds(cpu_work(plan), plan.costs)
    share = ceil_div(plan.n_tasks, plan.workers) / max(plan.n_tasks, 1)  # the busiest worker's
    return tuple((name, value * share) for name, value in seconds.items())


def estimated_seconds(plan: MatmulPlan) -> float:
    """Makespan model (pipeline.plan.model): the tasks' thread-seconds over the threads, then
    the split-K tree (three tile buffers moved per level)."""
    tm, tn = plan.tile_shape
    seconds = dict(cpu_resource_seconds(plan))
    rounds = ceil_div(plan.n_tasks, plan.workers * plan.threads_per_worker)
    run = makespan(
        seconds,
        threads=plan.threads_per_worker,
        rounds=rounds,
        tasks=ceil_div(plan.n_tasks, plan.workers),
        panels=max(len(plan.k_panels) // plan.split_k, 1),
        bands=len(row_bands(tm, plan.block_shape[0])),
    )
    acc = tm * tn * np.dtype(plan.compute_dtype).itemsize
    levels = math.ceil(math.log2(plan.split_k)) if plan.split_k > 1 else 0
    write_rounds = ceil_div(plan.n_tiles, plan.workers * plan.threads_per_worker)
    return run + write_rounds * levels * 3 * acc / REDUCE_BYTES_PER_SECOND


WRITE_BANDS = 8
"""A tile's last K panel is multiplied in up to this many bands of whole gemm-block rows, each
written while the next is computed: only the last band's write is left after the product."""


def row_bands(rows: int, block_rows: int | None) -> list[tuple[int, int]]:
    """Up to WRITE_BANDS bands of whole block rows (the last may be short) covering ``rows``."""
    if rows <= 0:
        return [(0, 0)]
    unit = max(block_rows or rows, 1)
    step = unit * ceil_div(ceil_div(rows, unit), WRITE_BANDS)  # whole blocks per band
    return [(r, min(r + step, rows)) for r in range(0, rows, step)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

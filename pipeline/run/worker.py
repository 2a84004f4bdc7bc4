"""Worker side: the task functions. Read panels, multiply, reduce, write whole chunks."""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from typing import Any

from numpy.typing import NDArray

from kernels.backends import make_accumulator
from kernels.cpu import share_cores
from pipeline.accumulate import crash
from pipeline.accumulate import tasks as accumulate
from pipeline.errors import InputUnreachableError
from pipeline.plan.matmul import row_bands
from pipeline.plan.spec import Tile
from pipeline.plan.standardize import Standardize
from pipeline.run import events, staged
from pipeline.run.band_writer import BandWriter
from pipeline.run.reading import open_task, read_panel
from pipeline.run.spec import TaskSpec, TileStats
from pipeline.run.timing import PhaseTimes, add_phases
from pipeline.store import mirror


def tile_product(
    spec: TaskSpec,
    tile: Tile,
    panels: tuple[tuple[int, int], ...],
    standardize: Standardize | None = None,
) -> Any:
    """``A[rows, K] @ B[K, cols]`` over the given K panels, in one accumulator.

    Returns (partial, bytes_read, phases). The next panel is read while the current one
    multiplies. ``standardize``: a covariance's, correlation's or kinship's (sent once per
    worker, not in ``spec``).
    """
    spec = _given(spec, standardize)
    clock = PhaseTimes()
    if spec.staged:
        with _inputs_named(spec):
            partial, bytes_read = staged.product(spec, tile, panels, clock)
        return partial, bytes_read, clock.as_dict()
    acc = _accumulator(spec, tile)
    with _inputs_named(spec):
        bytes_read = _multiply(spec, tile, panels, acc, clock)
    with clock.measure("copy"):
        partial = acc.result()
    return partial, bytes_read, clock.as_dict()


def sum_partials(x: Any, y: Any) -> Any:
    """One node of the split-K tree: the sum of two (partial, bytes_read, phases) triples."""
    phases = add_phases(x[2], y[2])
    return x[0] + y[0], x[1] + y[1], phases  # new array: a retry must not see a mutated input


def tile_write(
    spec: TaskSpec, tile: Tile, product: Any, standardize: Standardize | None = None
) -> TileStats:
    """Write the tile's whole chunks (this task is their only writer), then journal it."""
    spec = _given(spec, standardize)
    start = time.perf_counter()
    partial, bytes_read, phases = product
    clock = PhaseTimes()
    spec.output.hold(spec.out_folder)
    originals = accumulate.original(spec, tile)
    with clock.measure("write"):
        old = None if originals is None else originals.rows(0, tile.shape[0])
        data = accumulate.combine(spec, partial, old)
        if spec.standardize is not None:
            spec.standardize.finish(data, tile.rows[0], tile.cols[0])
        out = spec.output.writable(spec.fingerprint)
        spec.output.check_fence(spec.lock_token)
        if spec.store.symmetric:  # the tile and its mirror (pipeline.store.mirror)
            crc = mirror.write_tile(out, tile, data, _block_rows(spec))
        else:
            if data.size:
                out[tile.rows[0] : tile.rows[1], tile.cols[0] : tile.cols[1]] = data
            crc = zlib.crc32(data.data)
    phases = add_phases(phases, clock.as_dict())
    return _journal(spec, tile, bytes_read, start, crc, phases)


def tile_product_write(
    spec: TaskSpec,
    tile: Tile,
    panels: tuple[tuple[int, int], ...],
    resume: tuple[int, int] | None = None,
    standardize: Standardize | None = None,
) -> TileStats:
    """The unsplit case: product and write in one task, so the tile never leaves the worker;
    the last panel goes band by band and each finished band is journaled, then written, in a
    thread (pipeline.run.band_writer). ``resume`` (the first row not written, the crc32 of the
    rows before it): a resumed tile computes only its unwritten rows."""
    spec = _given(spec, standardize)
    start = time.perf_counter()
    clock = PhaseTimes()
    with BandWriter(spec, tile, resume, clock) as writer, _inputs_named(spec):
        todo = writer.todo
        if spec.staged:
            bytes_read = staged.product_bands(spec, todo, panels, clock, writer.accept)
        else:
            acc = _accumulator(spec, todo)
            bytes_read = _multiply(spec, todo, panels, acc, clock, writer.accept)
        writer.finish()
    return _journal(spec, tile, bytes_read, start, writer.crc, clock.as_dict())


def _given(spec: TaskSpec, standardize: Standardize | None) -> TaskSpec:
    return spec if standardize is None else replace(spec, standardize=standardize)


@contextlib.contextmanager
def _inputs_named(spec: TaskSpec) -> Iterator[None]:
    """An input this worker cannot read, named as the command names it (A, B or X); OUT is
    claimed by then, so the rerun resumes it."""
    try:
        yield
    except InputUnreachableError as e:
        if e.name:
            raise
        store = spec.store
        name = "X" if store.symmetric else "A" if e.url == store.a_url else "B"
        raise e.named(name, then=", then rerun with --resume") from None


def _block_rows(spec: TaskSpec) -> int | None:
    return spec.block_shape[0] if spec.block_shape else None


def _accumulator(spec: TaskSpec, tile: Tile) -> Any:
    """A zeroed accumulator; a Gram product's diagonal tile needs only its upper part."""
    upper = mirror.is_diagonal(spec.store.symmetric, tile)
    if spec.backend == "cpu":  # a task alone on its worker spreads over the idle threads
        worker = events.current_worker()
        share_cores(worker.state.nthreads if worker is not None else 1)
    return make_accumulator(
        spec.backend, tile.shape, spec.compute_dtype, spec.block_shape, upper, spec.precision
    )


def _multiply(
    spec: TaskSpec,
    tile: Tile,
    panels: tuple[tuple[int, int], ...],
    acc: Any,
    clock: PhaseTimes,
    finished: Callable[[tuple[int, int], NDArray[Any]], None] | None = None,
) -> int:
    """Add every panel's product into ``acc``; returns the bytes decoded. With ``finished``,
    the last panel is added band by band and ``finished(band, result)`` is called as each is
    final."""
    a, b, report = open_task(spec, tile, panels)
    bands = row_bands(tile.shape[0], spec.block_shape[0] if spec.block_shape else None)
    bytes_read = 0
    for i, (a_panel, b_panel, decoded) in enumerate(_prefetched(spec, a, b, tile, panels, clock)):
        bytes_read += decoded
        if finished is None or i < len(panels) - 1:
            with clock.measure("product"):
                acc.add(a_panel, b_panel)
            report.panel_done(events.panel_flops(a_panel, b_panel), decoded)
            continue
        for band in bands:
            with clock.measure("product"):
                acc.add(a_panel[band[0] : band[1]], b_panel, rows=band)
            _hand_over(acc, band, clock, finished)
        report.panel_done(events.panel_flops(a_panel, b_panel), decoded)
    if finished is not None and not panels:  # K == 0: the zero product, written as is
        for band in bands:
            _hand_over(acc, band, clock, finished)
    return bytes_read


def _hand_over(
    acc: Any,
    band: tuple[int, int],
    clock: PhaseTimes,
    finished: Callable[[tuple[int, int], NDArray[Any]], None],
) -> None:
    with clock.measure("copy"):
        partial = acc.result(band)
    finished(band, partial)


def _journal(
    spec: TaskSpec, tile: Tile, bytes_read: int, start: float, crc: int, phases: dict[str, float]
) -> TileStats:
    """Record the written tile in OUT/journal/ (what --resume trusts), with its crc32."""
    stats = TileStats(tile.index, bytes_read, time.perf_counter() - start, crc, phases)
    spec.journal.journal_tile(tile.index, {"fingerprint": spec.fingerprint, **asdict(stats)})
    crash.point("write.tile")
    return stats


def _prefetched(
    spec: TaskSpec,
    a: Any,
    b: Any,
    tile: Tile,
    panels: tuple[tuple[int, int], ...],
    clock: PhaseTimes,
) -> Iterator[tuple[NDArray[Any], NDArray[Any], int]]:
    """Yield (A panel, B panel, bytes decoded here) in K order, reading panel i+1 in a thread
    while panel i is used; panels another task of this worker decoded are reused."""

    def one(array: Any, which: str, rows: tuple[int, int], cols: tuple[int, int]) -> Any:
        return read_panel(spec, array, which, rows, cols, clock)

    if not panels:
        return
    # A and B panels are read side by side (two threads), one K step ahead of the product.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="panel-read") as pool:

        def start(k: tuple[int, int]) -> tuple[Any, Any]:
            return (
                pool.submit(one, a, "A", tile.rows, k),
                pool.submit(one, b, "B", k, tile.cols),
            )

        def finish(pending: tuple[Any, Any]) -> tuple[NDArray[Any], NDArray[Any], int]:
            with clock.measure("wait"):
                (pa, na), (pb, nb) = pending[0].result(), pending[1].result()
            return pa, pb, na + nb

        pending = start(panels[0])
        for nxt in panels[1:]:
            current = finish(pending)
            pending = start(nxt)
            yield current
        yield finish(pending)

"""Worker side, GPU backends: a tile's K loop fed to the device by the staged engine.

Decode threads read the next panels straight into pinned staging buffers (a bounded pool of
the worker process) -- with --gpu-decode, zstd chunks are staged compressed and decoded on the
device instead --, a copy stream moves panel k+1 while the compute stream multiplies panel
k, and the accumulator stays on the device (kernels.device.engine). Every task of the worker drives
the worker's one device. The last panel goes band by band; each finished band is copied back
and handed to the caller's writer while the next band computes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.backends import get_backend
from kernels.device.decode import CompressedPanel
from kernels.device.engine import Panel, StagedProduct, StagedStats
from kernels.memory.buffers import owned_array, process_pool
from pipeline.errors import PipelineError
from pipeline.plan.device_model import STAGED_PANELS
from pipeline.plan.matmul import row_bands
from pipeline.plan.spec import Tile
from pipeline.run.faults import fault_error, is_device_fault
from pipeline.run.reading import host_pool, open_task, read_panel
from pipeline.run.spec import TaskSpec
from pipeline.run.timing import PhaseTimes
from pipeline.store import inputs
from pipeline.store.chunks.raw import device_decodable, read_compressed

Finished = Callable[[tuple[int, int], NDArray[Any]], None]


def product(
    spec: TaskSpec, tile: Tile, panels: tuple[tuple[int, int], ...], clock: PhaseTimes
) -> tuple[NDArray[Any], int]:
    """(the tile's partial product on the host, bytes decoded) over the given K panels."""
    with _named_bad_chunks(spec, tile, panels):
        engine = _engine(spec, tile)
        stats = engine.run(_panels(spec, tile, panels, clock))
        _account(stats, clock)
        with clock.measure("copy"):
            return engine.result(), stats.bytes_decoded


def product_bands(
    spec: TaskSpec,
    tile: Tile,
    panels: tuple[tuple[int, int], ...],
    clock: PhaseTimes,
    finished: Finished,
) -> int:
    """The whole tile, its last panel band by band: ``finished(band, rows)`` gets each band
    as soon as it is final (a copy: the engine reuses its buffer). Returns bytes decoded."""

    def hand_over(band: tuple[int, int], host: NDArray[Any]) -> None:
        with clock.measure("copy"):  # into a pooled buffer, back in the pool once written
            rows = owned_array(host_pool(spec.buffer_bytes), host.shape, host.dtype)
            np.copyto(rows, host)
        finished(band, rows)

    bands = row_bands(tile.shape[0], spec.block_shape[0] if spec.block_shape else None)
    with _named_bad_chunks(spec, tile, panels):
        engine = _engine(spec, tile)
        stats = engine.run(_panels(spec, tile, panels, clock), hand_over, bands)
    _account(stats, clock)
    return stats.bytes_decoded


@contextlib.contextmanager
def _named_bad_chunks(
    spec: TaskSpec, tile: Tile, panels: tuple[tuple[int, int], ...]
) -> Iterator[None]:
    """With --gpu-decode a corrupt chunk may fail on the device, in nvCOMP's words, or as a
    CUDA error: read the task's panels on the host then, so that the error names the chunk as
    the host path does. A CUDA error leaves as one DeviceFaultError (pipeline.run.faults),
    which restarts the worker."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as e:
        fault = is_device_fault(e)
        what = f"tile {tile.index}"
        if spec.options.gpu_decode:
            try:
                _read_on_host(spec, tile, panels)
            except PipelineError as named:
                if fault:
                    raise fault_error(e, what, f"; read on the host: {named}") from named
                raise
        if fault:
            raise fault_error(e, what) from e
        raise


def _read_on_host(spec: TaskSpec, tile: Tile, panels: tuple[tuple[int, int], ...]) -> None:
    a, b, _ = open_task(spec, tile, panels)
    ta, tb = spec.store.transposed  # read where stored
    for k in panels:
        at_a = (k, tile.rows) if ta else (tile.rows, k)
        at_b = (tile.cols, k) if tb else (k, tile.cols)
        inputs.read_block(a, *at_a, spec.read_dtype, "A", spec.store.a_url)
        inputs.read_block(b, *at_b, spec.read_dtype, "B", spec.store.b_url)


def _engine(spec: TaskSpec, tile: Tile) -> StagedProduct:
    make_device = get_backend(spec.backend).make_device
    assert spec.staged and make_device is not None, f"{spec.backend} has no staged engine"
    device = make_device(dict(spec.device_params))
    pool = process_pool(f"staging-{device.name}", device.allocator, spec.staging_bytes)
    return StagedProduct(
        device,
        tile.shape,
        spec.compute_dtype,
        pool,
        decode_threads=spec.decode_threads,
        depth=STAGED_PANELS,  # what the plan's staging memory counts
        serialize=not spec.overlap,
        precision=spec.precision,
        panel_dtype=spec.read_dtype,  # integers: the float that holds them (kernels.exact)
    )


def _panels(
    spec: TaskSpec, tile: Tile, panels: tuple[tuple[int, int], ...], clock: PhaseTimes
) -> list[Panel]:
    a, b, report = open_task(spec, tile, panels)
    m, n = tile.shape

    # An operand read transposed is decoded on the host and placed transposed there.
    on_device = {
        "A": spec.options.gpu_decode and not spec.store.transposed[0] and device_decodable(a),
        "B": spec.options.gpu_decode and not spec.store.transposed[1] and device_decodable(b),
    }

    def fill(array: Any, which: str, rows: tuple[int, int], cols: tuple[int, int]) -> Any:
        def counted(got: int | CompressedPanel) -> int | CompressedPanel:
            read = got.bytes_read if isinstance(got, CompressedPanel) else got
            if which == "A":  # a panel counts when its B half is staged
                report.add(0, 0, read)
            else:
                report.add(1, 2 * m * n * (rows[1] - rows[0]), read)
            return got

        def into(out: NDArray[Any]) -> int | CompressedPanel:
            if on_device[which]:
                with clock.measure("read"):
                    staged = read_compressed(array, rows, cols, out.reshape(-1).view(np.uint8))
                if staged is not None:
                    return counted(staged)
            return counted(read_panel(spec, array, which, rows, cols, clock, out)[1])

        return into

    return [
        Panel(k[1] - k[0], fill(a, "A", tile.rows, k), fill(b, "B", k, tile.cols)) for k in panels
    ]


def _account(stats: StagedStats, clock: PhaseTimes) -> None:
    """The engine's thread: driving the device (product) or waiting for decoded panels and
    free staging buffers (wait). The device's own busy time is on its timeline."""
    waited = stats.decode_wait_seconds + stats.pool_wait_seconds
    clock.add("wait", waited)
    clock.add("product", max(stats.seconds - waited, 0.0))

"""Worker side: a tile task's band writer, which writes finished bands in row order in a thread."""

from __future__ import annotations

import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from numpy.typing import NDArray

from pipeline.accumulate import crash
from pipeline.accumulate import tasks as accumulate
from pipeline.plan.spec import Tile
from pipeline.run.spec import TaskSpec
from pipeline.run.timing import PhaseTimes
from pipeline.store import mirror

QUEUED_BANDS = 2
"""Bands handed over and not yet written before the product waits (host copies on a GPU)."""


class BandWriter:
    """Writes one tile's bands as the product finishes them, one thread in row order, each
    fenced by the job's lock token and combined with C's originals when accumulating; a band
    is journaled, then written (an entry ahead of its bytes: --resume keeps a band only if
    they give its crc32). Opening it holds OUT and moves C's originals aside.

    ``resume`` (the first row not written, the crc32 of the rows before it): only the rows
    from there on, ``todo``, are written. ``crc`` is chained over the bands in row order: once
    ``finish`` returns, the whole tile's crc32."""

    def __init__(
        self, spec: TaskSpec, tile: Tile, resume: tuple[int, int] | None, clock: PhaseTimes
    ) -> None:
        spec.output.hold(spec.out_folder)
        self.out = spec.output.writable(spec.fingerprint)
        self.originals = accumulate.original(spec, tile)  # moved aside before the first write
        first, self.crc = resume or (tile.rows[0], 0)
        self.todo = Tile(tile.index, (first, tile.rows[1]), tile.cols)
        self._spec, self._tile, self._clock = spec, tile, clock
        self._failed: BaseException | None = None
        self._written: list[Future[None]] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="band-write")

    def __enter__(self) -> BandWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)  # no write of this task outlives it

    def accept(self, band: tuple[int, int], partial: NDArray[Any]) -> None:
        """Queue ``band`` (rows of ``todo``), final as ``partial``, for writing."""
        if len(self._written) >= QUEUED_BANDS:
            with self._clock.measure("wait"):
                self._written[-QUEUED_BANDS].result()
        self._written.append(self._pool.submit(self._write_in_order, band, partial))

    def finish(self) -> None:
        """Wait for every queued band; the first write that failed raises here."""
        with self._clock.measure("wait"):
            for future in self._written:
                future.result()

    def _write_in_order(self, band: tuple[int, int], partial: NDArray[Any]) -> None:
        if self._failed is not None:  # rows stay in order: nothing after a band that failed
            raise self._failed
        try:
            self._write(band, partial)
        except BaseException as e:
            self._failed = e
            raise

    def _write(self, band: tuple[int, int], partial: NDArray[Any]) -> None:
        with self._clock.measure("write"):
            data = accumulate.combine(self._spec, partial, self._prior(band))
            if self._spec.standardize is not None:
                first = self.todo.rows[0]
                self._spec.standardize.finish(data, first + band[0], self._tile.cols[0])
            self._spec.output.check_fence(self._spec.lock_token)
            if self._spec.store.symmetric:  # with its mirror (pipeline.store.mirror): no entry
                self.crc = mirror.write_band(self.out, self._tile, band, data, self.crc)
            else:
                first = self.todo.rows[0]
                self._journal_and_write((first + band[0], first + band[1]), data)

    def _prior(self, band: tuple[int, int]) -> NDArray[Any] | None:
        """C's original rows under ``band``, or None unless accumulating."""
        if self.originals is None:
            return None
        offset = self.todo.rows[0] - self._tile.rows[0]
        return self.originals.rows(offset + band[0], offset + band[1])

    def _journal_and_write(self, rows: tuple[int, int], data: NDArray[Any]) -> None:
        chain = zlib.crc32(data.data, self.crc)
        if rows[1] < self._tile.rows[1]:  # not the last band (the tile's own entry covers that)
            # Journaled before the write: a kill between the two leaves an entry whose crc
            # the stored rows do not give (--resume computes them again), and one after the
            # write keeps the band, so no stored band is lost to the journal.
            entry = {"fingerprint": self._spec.fingerprint, "chain": chain}
            self._spec.journal.journal_band(self._tile.index, rows, entry)
        if data.size:
            self.out[rows[0] : rows[1], self._tile.cols[0] : self._tile.cols[1]] = data
        crash.point("write.band")
        self.crc = chain

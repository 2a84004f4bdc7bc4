"""One updating line on a terminal: tiles and K panels done, GFLOP/s, bytes read and an ETA.

Finished tiles count from their own stats; running tasks from the panel events they send
(pipeline.run.events), so the line moves within a tile. Only work computed in this run counts
(tiles a --resume skips are not in it). The ETA is the remaining flops at the rate measured so
far; before any panel is done it is the planner's estimate minus the time spent. The command
line's log handler shows a passing status (a job waiting for its running tasks) the same way.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, TextIO

from pipeline.plan.units import format_bytes

Counts = tuple[int, int, int]
"""K panels, flops, bytes read."""
TRANSIENT = {"transient": True}
"""``extra=`` of a log record that only says what the job does meanwhile (waiting for its
running tasks to stop): ``StatusHandler`` shows it until the next line replaces it."""


class StatusHandler(logging.StreamHandler[TextIO]):
    """The command line's log lines. A TRANSIENT record is drawn on a terminal as a line that
    the next one replaces, and left out elsewhere (``show_all`` keeps it: --debug), so a job
    that stops early ends with its one ``error:`` line."""

    def __init__(self, stream: TextIO, show_all: bool = False) -> None:
        super().__init__(stream)
        self.show_all = show_all
        self.rows = 0
        """Terminal rows the transient line shown now takes (0: none shown)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "transient", False) or self.show_all:
            self.clear()
            super().emit(record)
        elif self.stream.isatty():
            self.clear()
            text = self.format(record)
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()
            self.rows = -(-len(text) // (columns(self.stream) or len(text) or 1))

    def clear(self) -> None:
        """Take a transient line off the terminal (each row it wrapped onto), for the line that
        follows."""
        if self.rows:
            self.stream.write("\r\x1b[K" + "\x1b[A\x1b[K" * (self.rows - 1))
            self.stream.flush()
            self.rows = 0


def columns(stream: TextIO) -> int | None:
    """The width of the terminal ``stream`` writes to; None when not known."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):
        return None


class _Line:
    """One updating line on a terminal: ``draw`` rewrites it from ``text()``, ``close`` ends it;
    both do nothing when disabled."""

    def __init__(self, enabled: bool, stream: TextIO | None) -> None:
        self.enabled, self.stream = enabled, stream or sys.stderr
        self.started = time.perf_counter()

    def text(self) -> str:
        raise NotImplementedError

    def draw(self) -> None:
        if self.enabled:
            width = columns(self.stream)  # a wrapped line would leave a row behind each draw
            text = self.text() if width is None else self.text()[: width - 1]
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()

    def close(self) -> None:
        """End the line (once: later draws and closes do nothing)."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False


class ProgressLine(_Line):
    def __init__(
        self,
        tiles: int,
        flops: int,
        enabled: bool,
        stream: TextIO | None = None,
        estimate: float | None = None,
        panels: int = 0,
    ) -> None:
        super().__init__(enabled, stream)
        self.tiles, self.flops = tiles, max(flops, 1)
        self.panels = panels
        """K panels of every tile to compute, summed."""
        self.estimate = estimate
        self.done_tiles = 0
        self._finished: Counts = (0, 0, 0)
        self._finished_tiles: set[tuple[int, int]] = set()
        self._running: dict[tuple[tuple[int, int], int], Counts] = {}
        """Latest totals of each running task, by (tile, first K of its group)."""
        self._lock = threading.Lock()  # events arrive on the client's event-loop thread

    def add(
        self, flops: int, bytes_read: int, tile: tuple[int, int] | None = None, panels: int = 0
    ) -> None:
        """A tile is written: its stats replace its tasks' running totals."""
        with self._lock:
            self.done_tiles += 1
            if tile is not None:
                self._finished_tiles.add(tile)
                for key in [key for key in self._running if key[0] == tile]:
                    del self._running[key]
            p, f, b = self._finished
            self._finished = (p + panels, f + flops, b + bytes_read)

    def task_progress(self, event: dict[str, Any]) -> None:
        """A running task's totals (an event from pipeline.run.events.PanelReporter)."""
        tile = (int(event["tile"][0]), int(event["tile"][1]))
        counts = (int(event["panels"]), int(event["flops"]), int(event["bytes"]))
        with self._lock:
            if tile not in self._finished_tiles:  # a late event of a written tile
                self._running[(tile, int(event["k0"]))] = counts

    def totals(self) -> Counts:
        """Panels, flops and bytes done so far, running tasks included."""
        with self._lock:
            rows = [self._finished, *self._running.values()]
        return (sum(r[0] for r in rows), sum(r[1] for r in rows), sum(r[2] for r in rows))

    @property
    def done_flops(self) -> int:
        return self.totals()[1]

    @property
    def bytes_read(self) -> int:
        return self.totals()[2]

    def text(self) -> str:
        elapsed = time.perf_counter() - self.started
        panels, flops, bytes_read = self.totals()
        rate = flops / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            eta: float | None = max(self.flops - flops, 0) / rate
        elif self.estimate is not None:
            eta = max(self.estimate - elapsed, 0.0)
        else:
            eta = None
        return (
            f"tiles {self.done_tiles}/{self.tiles} | panels {panels}/{self.panels} | "
            f"{rate / 1e9:.1f} GFLOP/s | {_tail(bytes_read, elapsed, eta)}"
        )


class CheckLine(_Line):
    """verify's line, in the same style: blocks checked (B's passes, then A's and C's row
    blocks), bytes read, and an ETA from the bytes still to read. ``update`` counts the
    watched futures that are done (polled: no callbacks into the client's event loop) and lets
    go of them, so their results leave the cluster when verify is done with them."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        super().__init__(enabled, stream)
        self.blocks = self.bytes = self.done = self.bytes_read = 0
        self._watched: list[tuple[Any, int]] = []

    def expect(self, blocks: int, nbytes: int) -> None:
        """Work to come (submitted later), so that the ETA counts it from the start."""
        self.blocks += blocks
        self.bytes += nbytes

    def watch(self, future: Any, nbytes: int, expected: bool = False) -> None:
        """Count ``future`` (reading ``nbytes``) once done, and in the totals unless
        ``expect`` counted it already."""
        if not expected:
            self.expect(1, nbytes)
        self._watched.append((future, nbytes))

    def update(self) -> None:
        pending = []
        for future, nbytes in self._watched:
            if future.done():
                self.done += 1
                self.bytes_read += nbytes
            else:
                pending.append((future, nbytes))
        self._watched = pending
        self.draw()

    def text(self) -> str:
        elapsed = time.perf_counter() - self.started
        read = self.bytes_read
        eta = max(self.bytes - read, 0) * elapsed / read if read else None
        return f"verify | blocks {self.done}/{self.blocks} | {_tail(read, elapsed, eta)}"

    def close(self) -> None:
        self.draw()  # the final counts
        super().close()


def _tail(bytes_read: int, elapsed: float, eta: float | None) -> str:
    return (
        f"read {format_bytes(bytes_read)} | {_clock(elapsed)} elapsed | "
        f"ETA {_clock(eta) if eta is not None else '--:--'}"
    )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"

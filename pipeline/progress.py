"""One updating line on a terminal: tiles done, GFLOP/s, bytes read and an ETA.

Every tile is the same GEMM (edge tiles smaller), so the ETA is remaining flops at the rate
measured so far; before the first tile finishes it is the planner's estimate minus the time spent.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from pipeline.plan.units import format_bytes


class ProgressLine:
    def __init__(
        self,
        tiles: int,
        flops: int,
        enabled: bool,
        stream: TextIO | None = None,
        estimate: float | None = None,
    ) -> None:
        self.tiles, self.flops, self.enabled = tiles, max(flops, 1), enabled
        self.estimate = estimate
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()
        self.done_tiles = self.done_flops = self.bytes_read = 0

    def add(self, flops: int, bytes_read: int) -> None:
        self.done_tiles += 1
        self.done_flops += flops
        self.bytes_read += bytes_read

    def text(self) -> str:
        elapsed = time.perf_counter() - self.started
        rate = self.done_flops / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            eta: float | None = (self.flops - self.done_flops) / rate
        elif self.estimate is not None:
            eta = max(self.estimate - elapsed, 0.0)
        else:
            eta = None
        return (
            f"tiles {self.done_tiles}/{self.tiles} | {rate / 1e9:.1f} GFLOP/s | "
            f"read {format_bytes(self.bytes_read)} | {_clock(elapsed)} elapsed | "
            f"ETA {_clock(eta) if eta is not None else '--:--'}"
        )

    def draw(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.text() + "\x1b[K")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"

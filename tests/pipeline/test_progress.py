"""The progress line: tiles, rate, bytes and an ETA from the plan, then from the measured rate."""

from __future__ import annotations

import io
import re

from pipeline.progress import ProgressLine


def test_eta_from_estimate_then_from_rate() -> None:
    stream = io.StringIO()
    line = ProgressLine(4, 4 * 10**9, enabled=True, stream=stream, estimate=120.0)
    assert re.search(r"tiles 0/4 .* ETA 0[12]:\d\d$", line.text())  # about 2 minutes
    line.started -= 10  # ten seconds later one tile of four is done
    line.add(10**9, 2**20)
    text = line.text()
    assert "tiles 1/4" in text and "read 1.0 MiB" in text
    assert re.search(r"ETA 00:[23]\d$", text), text  # 3 more tiles at 10 s each
    line.draw()
    line.close()
    assert stream.getvalue().startswith("\r") and stream.getvalue().endswith("\n")


def test_quiet_when_disabled() -> None:
    stream = io.StringIO()
    line = ProgressLine(1, 10, enabled=False, stream=stream)
    line.draw()
    line.close()
    assert stream.getvalue() == ""

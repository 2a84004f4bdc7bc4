"""Sizes and durations as people read them ("4.0 GiB", "22 h 28 min"); the edges read sizes
with dask's own parser (pipeline.settings.parse_size)."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``0.25 s``, ``38.2 s``, ``4 min 12 s``, ``22 h 28 min``, ``3 d 4 h``: two units past
    a minute, each rounded to the smaller one."""
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    if (whole := round(seconds)) < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if (minutes := round(seconds / 60)) < 24 * 60:
        return f"{minutes // 60} h {minutes % 60} min"
    hours = round(seconds / 3600)
    return f"{hours // 24} d {hours % 24} h"

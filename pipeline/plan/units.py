"""Sizes: human strings ("4GiB") at the CLI and config edge, ints of bytes everywhere else."""

from __future__ import annotations

import math

from pipeline.errors import UsageError


def parse_size(text: str) -> int:
    """'4GiB', '512MB', '1e9' or '100' (bytes) to an int number of bytes."""
    units = {
        "": 1,
        "b": 1,
        "k": 10**3,
        "kb": 10**3,
        "m": 10**6,
        "mb": 10**6,
        "g": 10**9,
        "gb": 10**9,
        "t": 10**12,
        "tb": 10**12,
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
    }
    s = text.strip().lower().replace(" ", "")
    number = s.rstrip("kmgtib")
    unit = s[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0 or not math.isfinite(value):
        raise UsageError(
            f"cannot read size {text!r}; write a positive number with an optional unit, "
            "e.g. 4GiB, 512MB or 1000000"
        )
    return int(value * units[unit])


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

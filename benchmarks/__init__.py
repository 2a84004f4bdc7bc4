"""Benchmarks: each a ``python -m benchmarks.NAME`` script (see the Makefile)."""

from __future__ import annotations

import compileall
from pathlib import Path

PACKAGES = ("pipeline", "kernels", "cluster")


def byte_compile() -> None:
    """Byte-compile our packages, as installing a wheel does: a timed CLI start then reads
    them compiled, as a user's does, even where PYTHONDONTWRITEBYTECODE is set (compiling at
    every start would otherwise be timed as the CLI's own)."""
    root = Path(__file__).resolve().parent.parent
    for name in PACKAGES:
        compileall.compile_dir(str(root / name), quiet=1)

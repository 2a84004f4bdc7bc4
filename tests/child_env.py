"""The environment of a child process run from this checkout: the repo prepended to PYTHONPATH,
never put in its place (an offline GPU node brings its dependencies in on PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` plus ``extra``, with the repo first on PYTHONPATH and the rest kept."""
    environ = {**os.environ, **(extra or {})}
    kept = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), kept) if p)
    return environ

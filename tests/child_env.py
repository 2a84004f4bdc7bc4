"""The environment of a child process run from this checkout: the repo prepended to PYTHONPATH,
never put in its place (an offline GPU node brings its dependencies in on PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLOW_INTEGERS = REPO / "tests" / "slow_integers"
"""Put on a child's PYTHONPATH by ``slow_integers=True``: its integer products run numpy's
integer loops (seconds of work from small inputs; see its sitecustomize.py)."""


def child_env(extra: dict[str, str] | None = None, slow_integers: bool = False) -> dict[str, str]:
    """``os.environ`` plus ``extra``, with the repo first on PYTHONPATH and the rest kept."""
    environ = {**os.environ, **(extra or {})}
    kept = environ.get("PYTHONPATH")
    slow = str(SLOW_INTEGERS) if slow_integers else None
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), slow, kept) if p)
    return environ

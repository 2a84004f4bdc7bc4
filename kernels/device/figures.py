"""A GPU's measured figures, saved once (by ``python -m pipeline doctor``, or by a worker's
first calibration) and read instead of measuring again in every job.

One JSON file, ``$XDG_CACHE_HOME/tilegemm/devices.json`` (default ``~/.cache``), holds a record
per GPU keyed by what the figures depend on: the GPU (name, compute capability, memory), the
driver's CUDA, numba-cuda and NVVM versions and our kernels' source. A record whose key differs
in anything is ignored (stale). Written to a temporary file in the same folder and renamed, mode
0600; a file that others may write is not trusted (figures steer the plan's memory use).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

FILE_NAME = "devices.json"


def store_path(name: str = FILE_NAME) -> Path:
    """``name`` (devices.json; hosts.json holds the CPU hosts' figures) in our cache folder."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tilegemm" / name


def kernel_source_hash() -> str:
    """Hash of the generated default kernels' source: a new kernel makes old figures stale."""
    from kernels.cuda.blocked.kernel import generate_source
    from kernels.cuda.blocked.spec import F32_SPEC, F64_SPEC

    text = "".join(generate_source(spec) for spec in (F32_SPEC, F64_SPEC))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_records(path: Path | None = None) -> list[dict[str, Any]]:
    """Every record of the store; none when it is missing, unreadable or writable by others."""
    path = path or store_path()
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            return []  # someone else could have written it
        records = json.loads(path.read_text()).get("records", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("key"), dict)]


def lookup(key: dict[str, Any], path: Path | None = None) -> dict[str, Any] | None:
    """The saved record of exactly this key, or None."""
    for record in load_records(path):
        if record["key"] == key:
            return record
    return None


def save(
    key: dict[str, Any],
    figures: dict[str, Any],
    path: Path | None = None,
    identity: str | None = "gpu",
) -> Path:
    """Merge ``figures`` into the record of ``key`` (replacing a stale record of the same
    machine: the same ``key[identity]``; None: records of exactly this key only) and write
    the store atomically, mode 0600."""
    path = path or store_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    records = [
        r
        for r in load_records(path)
        if (r["key"] != key if identity is None else r["key"].get(identity) != key.get(identity))
    ]
    old = lookup(key, path) or {}
    today = datetime.date.today().isoformat()
    records.append({"key": key, "figures": {**old.get("figures", {}), **figures}, "date": today})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp creates it 0600
            json.dump({"records": records}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

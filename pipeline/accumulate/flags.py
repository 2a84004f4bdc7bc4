"""``--accumulate`` / ``--alpha`` / ``--beta`` before any work: the flags, and C (anyone's
existing array) checked against the product (pipeline/accumulate/state.py runs it)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.accumulate import state as accumulate
from pipeline.errors import InputError, UnsafeOutputError, UsageError
from pipeline.plan.dtypes import check_accumulation
from pipeline.plan.spec import ArraySpec, OutputSpec
from pipeline.store import inputs
from pipeline.store.door import Door
from pipeline.store.fs import local_path, url_to_fs
from pipeline.store.output import Output


def check_flags(
    *,
    accumulate: bool,
    alpha: float,
    beta: float | None,
    overwrite: bool,
    verify: bool,
    layout: OutputSpec,
) -> float:
    """Refuse flags that don't go together; returns β (1 with --accumulate by default)."""
    for name, value in (("--alpha", alpha), ("--beta", beta)):
        if value is not None and not math.isfinite(float(value)):
            raise UsageError(f"{name} {value} is not a finite number")
    if not accumulate:
        if beta is not None:
            raise UsageError("--beta scales C's old values: it needs --accumulate")
        return 0.0
    if overwrite:
        raise UsageError(
            "--accumulate adds into C's values and --overwrite would replace them; pick one"
        )
    asked = {"--dtype": layout.dtype, "--chunks": layout.chunks, "--shards": layout.shards}
    for flag in (f for f, v in asked.items() if v is not None):
        raise UsageError(f"--accumulate keeps C's layout and dtype; drop {flag}")
    return 1.0 if beta is None else float(beta)


def target(
    out: Output, a: ArraySpec, b: ArraySpec, alpha: float, beta: float
) -> tuple[dict[str, Any], OutputSpec]:
    """C as it is (must exist, 2-D, numeric, of the product's shape and a dtype that holds it):
    its snapshot (re-checked under its lock) and its layout, which OUT keeps."""
    fs, path = url_to_fs(out.url, out.storage_options)
    if not fs.exists(path):
        raise InputError(
            f"--accumulate: C ({out.url}) does not exist; it must be an existing Zarr array "
            "(drop --accumulate to write a new product)"
        )
    _check_own_folders(out)
    c = inputs.open_input(out.url, out.storage_options, "C")
    inputs.check_encoding(c, "C", out.url)
    shape = (a.shape[0], b.shape[1])
    if tuple(c.shape) != shape:
        raise InputError(
            f"--accumulate: C ({out.url}) is {c.shape[0]}x{c.shape[1]}, but A @ B is "
            f"{shape[0]}x{shape[1]}; give a C of the product's shape"
        )
    _check_whole_factors(str(c.dtype), alpha, beta)
    check_accumulation(a.dtype, b.dtype, a.shape[1], str(c.dtype), alpha, beta)
    shards = getattr(c, "shards", None)
    layout = OutputSpec(
        str(c.dtype),
        tuple(int(x) for x in c.chunks),  # type: ignore[arg-type]
        tuple(int(x) for x in shards) if shards else None,  # type: ignore[arg-type]
        int(c.metadata.zarr_format),
        accumulate=True,
    )
    return accumulate.snapshot(out), layout


EXACT_FACTOR = 2**53
"""The largest whole --alpha/--beta a float holds exactly (they are read as floats)."""


def _check_whole_factors(c_dtype: str, alpha: float, beta: float) -> None:
    """An integer C takes its factors exactly: past 2**53 the one typed is not the one read."""
    if np.dtype(c_dtype).kind not in "biu":
        return
    for name, value in (("--alpha", alpha), ("--beta", beta)):
        if abs(float(value)) > EXACT_FACTOR:
            raise UsageError(
                f"{name} {float(value):.17g} is past 2**53, where a float no longer holds every "
                f"whole number (what was typed may not be what is read); C is {c_dtype}: "
                "scale in two steps, or accumulate into a float64 C"
            )


def _check_own_folders(out: Output) -> None:
    """C's chunks are rewritten in place: a link inside C (its ``c/`` on another array, its
    accumulation folder elsewhere) or a special file would send the writes somewhere else."""
    local = local_path(out.url)
    if local is None:
        return
    odd = [
        (e.path, "a symbolic link" if e.kind == "link" else "a special file")
        for e in Door(local, "C").walk()
        if e.kind in ("link", "other")
    ]
    if odd:
        path, what = sorted(odd)[0]
        raise UnsafeOutputError(
            f"--accumulate: C ({out.url}) holds {what} at {path} ({len(odd)} such in all); "
            "C's chunks are rewritten in place, only inside C's own folders: copy C without "
            "links (e.g. cp -rL) and accumulate into the copy"
        )

"""`python -m kernels inspect`: compile every CUDA variant with no GPU and read its machine code.

PTX comes from numba's compile_ptx; ptxas -v and cuobjdump -sass come from the nvidia-cuda-*
wheels (the system ptxas may be too old for nvvm's PTX). The hottest loop is the innermost
backward-branch loop with the most FFMA/DFMA. Parsing is pure functions on text.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernels.constants import CUDA_INSTALL
from kernels.inspect.sass import (
    MmaTargets,
    analyse,
    blocks_per_sm,
    check_mma_targets,
    check_targets,
)

# --- compiling (needs numba-cuda and the CUDA wheels, no GPU) ----------------------------------


def find_tool(name: str) -> Path:
    """A CUDA binary (ptxas, cuobjdump) from the nvidia-* wheels: nvidia/cu*/bin/<name>."""
    try:
        import nvidia
    except ImportError:
        nvidia = None
    roots = [Path(p) for p in getattr(nvidia, "__path__", [])]
    found = sorted(path for root in roots for path in root.glob(f"*/bin/{name}"))
    if not found:
        raise FileNotFoundError(
            f"{name} not found under the nvidia wheels ({[str(r) for r in roots]}); "
            f"{CUDA_INSTALL} (the system one may be too old)"
        )
    return found[-1]  # the newest CUDA major (cu13 after cu12)


def parse_cc(text: str) -> tuple[int, int]:
    """ "9.0" -> (9, 0)."""
    match = re.fullmatch(r"(\d+)\.(\d)", text.strip())
    if not match:
        raise ValueError(f"compute capability must look like 9.0 or 8.6, got {text!r}")
    return int(match[1]), int(match[2])


def compile_kernel_ptx(
    kernel: Callable[..., None],
    dtype: str,
    cc: tuple[int, int],
    launch_bounds: Any = None,
    args: Sequence[tuple[str, bool]] | None = None,
) -> str:
    """PTX of kernel(a, b, c) for C-contiguous 2-D arrays of `dtype`, with no GPU; ``args``:
    another kernel's 2-D arguments as (dtype, C-contiguous)."""
    import numba
    from numba.core import config

    if config.ENABLE_CUDASIM:
        raise RuntimeError(
            "kernels inspect compiles real PTX: run it with NUMBA_ENABLE_CUDASIM unset"
        )
    from numba import cuda

    array = getattr(numba, dtype)[:, ::1]
    types = (array, array, array)
    if args is not None:
        element = [numba.from_dtype(np.dtype(name)) for name, _ in args]
        types = tuple(e[:, ::1] if c else e[:, :] for e, (_, c) in zip(element, args, strict=True))
    ptx, _ = cuda.compile_ptx(kernel, types, cc=cc, launch_bounds=launch_bounds)
    return str(ptx)


def _run(args: list[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{Path(args[0]).name} failed ({done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout + done.stderr


def inspect_kernel(
    name: str,
    dtype: str,
    kernel: Callable[..., None],
    cc: tuple[int, int],
    ptx_dir: Path,
    launch_bounds: Any = None,
    default: bool = False,
    precision: str = "fp32",
    hmma_per_k_tile: int | None = None,
    args: Sequence[tuple[str, bool]] | None = None,
) -> dict[str, Any]:
    """Compile, assemble and disassemble one kernel; its report as a flat dict. A tensor-core
    kernel (``hmma_per_k_tile`` given) is held to its own targets (sass.MmaTargets); an
    elementwise helper (``args`` given) to no spills and no local memory only."""
    arch = f"sm_{cc[0]}{cc[1]}"
    ptx = ptx_dir / f"{name}.{arch}.ptx"
    ptx.write_text(compile_kernel_ptx(kernel, dtype, cc, launch_bounds, args))
    cubin = ptx.with_suffix(".cubin")
    info = _run([str(find_tool("ptxas")), "-v", f"-arch={arch}", str(ptx), "-o", str(cubin)])
    sass = _run([str(find_tool("cuobjdump")), "-sass", str(cubin)])
    report: dict[str, Any] = {"name": name, "dtype": dtype, "default": default}
    report.update({"precision": precision, "ptx": str(ptx), "cc": arch})
    report.update(analyse(info, sass, dtype, precision))
    threads = launch_bounds[0] if launch_bounds else None
    report["blocks_per_sm"] = (
        blocks_per_sm(report["regs"], report["shared_bytes"], threads) if threads else None
    )
    report["hmma_per_k_tile"] = hmma_per_k_tile
    if args is not None:
        missed = check_targets(report)
        report["targets_missed"] = [m for m in missed if m.startswith(("spills", "local"))]
    elif hmma_per_k_tile is None:
        report["targets_missed"] = check_targets(report)
    else:
        report["targets_missed"] = check_mma_targets(report, MmaTargets(hmma_per_k_tile))
    return report


def inspect_variants(cc: tuple[int, int], ptx_dir: Path) -> list[dict[str, Any]]:
    """Reports for every registered CUDA variant."""
    from kernels.cuda.host import VARIANTS

    ptx_dir.mkdir(parents=True, exist_ok=True)
    return [
        inspect_kernel(
            v.name,
            v.dtype.name,
            v.make_kernel(),
            cc,
            ptx_dir,
            v.launch_bounds,
            v.default,
            v.precision,
            v.hmma_per_k_tile,
        )
        for v in VARIANTS.values()
    ] + inspect_helpers(cc, ptx_dir)


def inspect_helpers(cc: tuple[int, int], ptx_dir: Path) -> list[dict[str, Any]]:
    """Reports for the integer route's elementwise kernels (kernels.cuda.integer)."""
    from kernels.cuda.integer import inspected_kernels

    ptx_dir.mkdir(parents=True, exist_ok=True)
    return [
        inspect_kernel(name, args[1][0], kernel, cc, ptx_dir, args=args)
        for name, kernel, args in inspected_kernels()
    ]


# --- output -----------------------------------------------------------------------------------

_COLUMNS = [
    ("variant", lambda r: r["name"] + (" *" if r["default"] else "")),
    ("regs", lambda r: r["regs"]),
    ("spill", lambda r: r["spill_bytes"]),
    ("local", lambda r: r["local_bytes"]),
    ("smem", lambda r: r["shared_bytes"]),
    ("prec", lambda r: r.get("precision", "-")),
    ("fma", lambda r: r.get("ffma", r.get("dfma"))),
    ("hmma", lambda r: r.get("hmma", "-")),
    ("blk/SM", lambda r: "-" if r.get("blocks_per_sm") is None else r["blocks_per_sm"]),
    ("lds32", lambda r: r["lds32"]),
    ("lds64", lambda r: r["lds64"]),
    ("lds128", lambda r: r["lds128"]),
    ("loop", lambda r: r["instructions"]),
    ("fma%", lambda r: f"{r['ffma_share']:.1%}"),
    ("fma/lds", lambda r: "-" if r["ffma_per_lds"] is None else f"{r['ffma_per_lds']:g}"),
    ("fp64", lambda r: "-" if r["fp64_instructions"] is None else r["fp64_instructions"]),
    ("targets", lambda r: "met" if not r["targets_missed"] else "; ".join(r["targets_missed"])),
]


def format_table(reports: Sequence[dict[str, Any]]) -> str:
    """Aligned text table, one row per kernel; * marks the default of its dtype."""
    rows = [[name for name, _ in _COLUMNS]]
    rows += [[str(get(r)) for _, get in _COLUMNS] for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
    lines.append(
        "fma: FFMA (float32) or DFMA (float64) in the hottest loop (the one with most HMMA for "
        "tf32/3xtf32), whose length is `loop`; hmma: HMMA there (per K tile); blk/SM: resident "
        "blocks per sm_90 SM by registers and shared memory; * = default at fp32; targets: the "
        "static goals (the FMA kernels': the defaults'; tensor cores': sass.MmaTargets)"
    )
    if reports:
        lines.append(f"PTX and cubins in {Path(reports[0]['ptx']).parent}")
    lines.append("toolchain: " + ", ".join(f"{k} {v}" for k, v in toolchain_versions().items()))
    return "\n".join(lines)


def toolchain_versions() -> dict[str, str]:
    """Versions the numbers depend on (the gate is calibrated on one set)."""
    from importlib import metadata

    names = ("numba", "numba-cuda", "nvidia-nvvm", "nvidia-cuda-nvcc", "nvidia-cuda-cuobjdump")
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def run(cc: str, as_json: bool, ptx_dir: str | None) -> str:
    """The `inspect` command's output text."""
    out_dir = Path(ptx_dir) if ptx_dir else Path(tempfile.mkdtemp(prefix="kernels-inspect-"))
    reports = inspect_variants(parse_cc(cc), out_dir)
    return json.dumps(reports, indent=2) if as_json else format_table(reports)

"""Pure parsing of ptxas and cuobjdump output: the hottest loop's instruction counts, and the
targets the default kernels must meet. Functions on text only (no toolchain, no numba)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# --- pure parsing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str
    """Full opcode with modifiers, e.g. "LDS.128" or "DMMA.16x8x4" (modifiers may hold lower
    case); the predicate is dropped."""
    operands: str


@dataclass(frozen=True, order=True)
class Loop:
    start: int
    """Address of the branch target (the loop head)."""
    end: int
    """Address of the last backward branch to `start`."""


_SASS_LINE = re.compile(
    r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?(?P<op>[A-Z][A-Za-z0-9_.]*)(?P<rest>[^;]*);"
)
_BRANCHES = ("BRA", "JMP")
TENSOR_PRECISIONS = ("tf32", "3xtf32")
_FP64_OPS = {"DADD", "DMUL", "DFMA", "DSETP", "DSET", "DMNMX", "DMMA"}


def parse_sass(text: str) -> list[Instruction]:
    """Instructions of a cuobjdump -sass listing (one kernel), in address order."""
    out = []
    for line in text.splitlines():
        match = _SASS_LINE.match(line)
        if match:
            addr = int(match["addr"], 16)
            out.append(Instruction(addr, match["op"], match["rest"].strip()))
    return out


def branch_target(ins: Instruction) -> int | None:
    """Target address of a direct branch, else None."""
    if ins.opcode.split(".")[0] not in _BRANCHES:
        return None
    found = re.findall(r"0x([0-9a-f]+)", ins.operands)
    return int(found[-1], 16) if found else None


def find_loops(instructions: Sequence[Instruction]) -> list[Loop]:
    """Loops closed by backward branches; branches to the same head merge into one loop."""
    ends: dict[int, int] = {}
    for ins in instructions:
        target = branch_target(ins)
        if target is not None and target < ins.address:  # == is cuobjdump's trailing self-loop
            ends[target] = max(ends.get(target, 0), ins.address)
    return sorted(Loop(start, end) for start, end in ends.items())


def innermost(loops: Sequence[Loop]) -> list[Loop]:
    """Loops that contain no other loop."""

    def contains(outer: Loop, inner: Loop) -> bool:
        return outer != inner and outer.start <= inner.start and inner.end <= outer.end

    return [lp for lp in loops if not any(contains(lp, other) for other in loops)]


def loop_body(instructions: Sequence[Instruction], loop: Loop) -> list[Instruction]:
    return [ins for ins in instructions if loop.start <= ins.address <= loop.end]


def is_fp64(opcode: str) -> bool:
    """FP64 arithmetic (DADD, DFMA, ...) or a conversion to or from float64."""
    return opcode.split(".")[0] in _FP64_OPS or ".F64" in opcode


def lds_width(opcode: str) -> int | None:
    """Bits per thread of a shared-memory load (LDS, LDS.64, LDS.U.128, ...), else None."""
    parts = opcode.split(".")
    if parts[0] != "LDS":
        return None
    for width in (128, 64):
        if str(width) in parts[1:]:
            return width
    return 32


def count_loop(body: Sequence[Instruction], fma: str) -> dict[str, Any]:
    """FMA, shared-load and FP64 counts of a loop body; `fma` is "FFMA" or "DFMA"."""
    n_fma = sum(ins.opcode.split(".")[0] == fma for ins in body)
    widths = [lds_width(ins.opcode) for ins in body]
    lds = {f"lds{w}": widths.count(w) for w in (32, 64, 128)}
    n_lds = sum(lds.values())
    total = len(body)
    return {
        fma.lower(): n_fma,
        **lds,
        "instructions": total,
        "ffma_share": round(n_fma / total, 4) if total else 0.0,
        "ffma_per_lds": round(n_fma / n_lds, 2) if n_lds else None,
    }


def hottest_loop(instructions: Sequence[Instruction], fma: str) -> Loop | None:
    """The innermost loop with the most `fma` instructions.

    Ties (an interior-tile copy and an edge-tile copy of the same K loop) go to the shorter
    loop: the specialised one that runs for every interior tile of a large product.
    """

    def key(lp: Loop) -> tuple[int, int]:
        body = loop_body(instructions, lp)
        return sum(i.opcode.split(".")[0] == fma for i in body), -len(body)

    loops = innermost(find_loops(instructions))
    return max(loops, key=key) if loops else None


def parse_ptxas_info(text: str) -> dict[str, int]:
    """Registers, spills, shared and local bytes from `ptxas -v` output (one kernel)."""

    def grab(pattern: str) -> int:
        match = re.search(pattern, text)
        return int(match.group(1)) if match else 0

    return {
        "regs": grab(r"Used (\d+) registers"),
        "spill_bytes": grab(r"(\d+) bytes spill stores") + grab(r"(\d+) bytes spill loads"),
        "shared_bytes": grab(r"(\d+) bytes smem"),
        "local_bytes": max(grab(r"(\d+) bytes stack frame"), grab(r"(\d+) bytes lmem")),
    }


def analyse(
    ptxas_text: str, sass_text: str, dtype: str, precision: str | None = None
) -> dict[str, Any]:
    """All reported numbers for one kernel from its ptxas -v and SASS text. The hottest loop is
    the one with the most HMMA for a tensor-core kernel (``precision`` tf32 or 3xtf32), else
    the most FFMA (float32) or DFMA (float64)."""
    fma = "FFMA" if dtype == "float32" else "DFMA"
    hot = "HMMA" if precision in TENSOR_PRECISIONS else fma
    instructions = parse_sass(sass_text)
    loop = hottest_loop(instructions, hot)
    body = loop_body(instructions, loop) if loop else []
    report: dict[str, Any] = parse_ptxas_info(ptxas_text)
    report["local_instructions"] = sum(
        i.opcode.split(".")[0] in ("LDL", "STL") for i in instructions
    )
    report["loop"] = f"{loop.start:#06x}-{loop.end:#06x}" if loop else None
    report.update(count_loop(body, fma))
    report["hmma"] = sum(i.opcode.split(".")[0] == "HMMA" for i in body)
    report["fp64_instructions"] = (
        sum(is_fp64(i.opcode) for i in instructions) if dtype == "float32" else None
    )
    return report


# Per-SM limits of sm_90 (H100), CUDA occupancy calculator's numbers.
SM_REGISTERS = 65536
REGISTER_UNIT = 256
"""Registers are given to a warp in units of 256."""
SM_SHARED_BYTES = 233472
"""228 KiB of shared memory per SM, of which each block also reserves BLOCK_RESERVED_BYTES."""
BLOCK_RESERVED_BYTES = 1024
SM_THREADS = 2048
SM_BLOCKS = 32


def blocks_per_sm(regs: int, shared_bytes: int, threads: int) -> int:
    """Resident blocks per SM of sm_90 allowed by registers, shared memory and threads."""
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_regs = (SM_REGISTERS // per_warp) // warps
    by_shared = SM_SHARED_BYTES // (shared_bytes + BLOCK_RESERVED_BYTES)
    return min(by_regs, by_shared, SM_THREADS // threads, SM_BLOCKS)


# --- targets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Static goals for a default kernel's machine code, per dtype."""

    fma_per_lds: float
    fma_share: float
    max_regs: int
    max_shared_bytes: int = 48 * 1024


TARGETS = {
    # 16 FFMA per LDS.128 = 4 FMA per loaded float; <= 128 registers keeps 2 blocks of 256 per SM.
    "float32": Targets(fma_per_lds=16, fma_share=0.80, max_regs=128),
    # Same 4 FMA per loaded element: 8 DFMA per LDS.128 (two doubles). 16 per load would need
    # 16 x 16 outputs per thread (512 registers), so the share target is lower too.
    "float64": Targets(fma_per_lds=8, fma_share=0.75, max_regs=255),
}


def check_targets(report: dict[str, Any]) -> list[str]:
    """What a kernel's report misses of its dtype's targets (empty list: all met)."""
    t = TARGETS[report["dtype"]]
    fma = "ffma" if report["dtype"] == "float32" else "dfma"
    checks = [
        (report["spill_bytes"] == 0, f"spills {report['spill_bytes']} bytes"),
        (
            report["local_bytes"] == 0 and report["local_instructions"] == 0,
            f"local memory ({report['local_bytes']} bytes, {report['local_instructions']} LDL/STL)",
        ),
        (report["regs"] <= t.max_regs, f"{report['regs']} registers > {t.max_regs}"),
        (
            report["shared_bytes"] <= t.max_shared_bytes,
            f"{report['shared_bytes']} bytes shared > {t.max_shared_bytes}",
        ),
        (
            (report["ffma_per_lds"] or 0) >= t.fma_per_lds,
            f"{report['ffma_per_lds']} {fma} per shared load < {t.fma_per_lds}",
        ),
        (
            report["ffma_share"] >= t.fma_share,
            f"{fma} {report['ffma_share']:.0%} of the loop < {t.fma_share:.0%}",
        ),
        (
            report["lds128"] > 0 and report["lds32"] == report["lds64"] == 0,
            f"shared loads not all 128-bit ({report['lds32']} x32, {report['lds64']} x64)",
        ),
        (not report["fp64_instructions"], f"{report['fp64_instructions']} FP64 instructions"),
    ]
    return [message for ok, message in checks if not ok]


@dataclass(frozen=True)
class MmaTargets:
    """Static goals of a tensor-core kernel."""

    hmma_per_k_tile: int
    """HMMA a warp issues per K tile: the design's mma count (3xtf32 = 3 x tf32 per k-step)."""
    max_regs: int = 255
    min_blocks_per_sm: int = 2
    max_shared_bytes: int = 48 * 1024


def check_mma_targets(report: dict[str, Any], t: MmaTargets) -> list[str]:
    """What a tensor-core kernel's report misses (empty list: all met). ``report`` needs
    ``blocks_per_sm`` besides analyse's numbers."""
    checks = [
        (report["spill_bytes"] == 0, f"spills {report['spill_bytes']} bytes"),
        (
            report["local_bytes"] == 0 and report["local_instructions"] == 0,
            f"local memory ({report['local_bytes']} bytes, {report['local_instructions']} LDL/STL)",
        ),
        (report["regs"] <= t.max_regs, f"{report['regs']} registers > {t.max_regs}"),
        (
            report["blocks_per_sm"] >= t.min_blocks_per_sm,
            f"{report['blocks_per_sm']} blocks per SM < {t.min_blocks_per_sm}",
        ),
        (
            report["shared_bytes"] <= t.max_shared_bytes,
            f"{report['shared_bytes']} bytes shared > {t.max_shared_bytes}",
        ),
        (
            report["hmma"] == t.hmma_per_k_tile,
            f"{report['hmma']} HMMA in the hot loop != {t.hmma_per_k_tile} per K tile designed",
        ),
        (report["ffma"] == 0, f"{report['ffma']} FFMA in the hot loop (an FP32 main loop)"),
        (not report["fp64_instructions"], f"{report['fp64_instructions']} FP64 instructions"),
    ]
    return [message for ok, message in checks if not ok]

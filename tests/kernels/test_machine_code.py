"""The static machine-code gate, its self-test, and the pure SASS parsing behind it.

Compiling needs numba without the simulator, which the test session switches on: the compiling
tests run `python -m kernels inspect` (and a script for the bad kernels) in subprocesses with
NUMBA_ENABLE_CUDASIM removed. Both start together so they share the two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernels.inspect import machine_code as ki
from kernels.inspect import sass

REPO = Path(__file__).resolve().parents[2]

BAD_KERNELS = """
import dataclasses, json, sys
from pathlib import Path
from kernels.cuda.blocked import kernel as cuda_blocked
from kernels.inspect import machine_code as ki
from kernels.cuda.blocked.spec import F32_SPEC
reports = []
for name, change in [("bad_acc_float64", {"acc_init": "float64"}),
                     ("bad_divmod_index", {"index_math": "divmod"})]:
    spec = dataclasses.replace(F32_SPEC, **change)
    kernel = cuda_blocked.make_blocked_kernel(spec)
    reports.append(ki.inspect_kernel(name, "float32", kernel, (9, 0), Path(sys.argv[1]),
                                     spec.launch_bounds))
print(json.dumps(reports))
"""


def _compile_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # compile_ptx needs the real numba.cuda
    return env


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Reports of every registered variant (through the CLI) and of the two bad kernels."""
    ptx_dir = tmp_path_factory.mktemp("ptx")
    run = {"cwd": REPO, "env": _compile_env(), "stdout": subprocess.PIPE, "text": True}
    cli = subprocess.Popen(
        [sys.executable, "-m", "kernels", "inspect", "--cc", "9.0", "--json", "--ptx-dir", ptx_dir],
        **run,  # type: ignore[call-overload]
    )
    bad = subprocess.Popen([sys.executable, "-c", BAD_KERNELS, ptx_dir], **run)  # type: ignore[call-overload]
    cli_out, _ = cli.communicate(timeout=280)
    bad_out, _ = bad.communicate(timeout=280)
    assert cli.returncode == 0 and bad.returncode == 0, "compiling failed (see stderr above)"
    by_name = {r["name"]: r for r in json.loads(cli_out) + json.loads(bad_out)}
    yield by_name


def _defaults(reports: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in reports.values() if r["default"]]


def test_cli_lists_every_variant(reports: dict[str, Any]) -> None:
    from kernels.cuda.host import VARIANTS

    assert set(VARIANTS) <= set(reports)
    for name in VARIANTS:
        r = reports[name]
        assert {"name", "dtype", "default", "ptx", "regs", "spill_bytes"} <= set(r)
        assert Path(r["ptx"]).read_text().lstrip().startswith("//")  # a PTX listing
    assert sorted(r["dtype"] for r in _defaults(reports)) == ["float32", "float64"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_default_kernel_meets_static_targets(reports: dict[str, Any], dtype: str) -> None:
    """The gate. Calibrated on the toolchain in the message; other versions may move numbers."""
    (r,) = (r for r in _defaults(reports) if r["dtype"] == dtype)
    target = sass.TARGETS[dtype]
    context = f"{r['name']} on {ki.toolchain_versions()}: {r}"
    assert r["targets_missed"] == [], context
    assert r["spill_bytes"] == 0 and r["local_bytes"] == 0, context
    assert r["local_instructions"] == 0, context
    assert r["regs"] <= target.max_regs, context
    assert r["shared_bytes"] <= 48 * 1024, context
    assert r["ffma_per_lds"] >= target.fma_per_lds, context
    assert r["ffma_share"] >= target.fma_share, context
    assert r["lds128"] > 0 and r["lds32"] == r["lds64"] == 0, context
    if dtype == "float32":
        assert r["fp64_instructions"] == 0, context


@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
def test_tensor_core_kernels_meet_their_targets(reports: dict[str, Any], precision: str) -> None:
    """The tensor-core kernels' static gate: HMMA in the hot loop as designed, no FFMA main
    loop, no spills or local memory, <= 255 registers and >= 2 blocks per SM by ptxas's
    numbers."""
    from kernels.cuda.tensor.kernel import SPECS

    spec = SPECS[precision]
    r = reports[f"mma_{precision}"]
    context = f"{r['name']} on {ki.toolchain_versions()}: {r}"
    assert r["precision"] == precision and r["dtype"] == "float32" and not r["default"], context
    assert r["targets_missed"] == [], context
    assert r["hmma"] == r["hmma_per_k_tile"] == spec.mma_per_k_tile, context
    assert r["ffma"] == 0 and r["spill_bytes"] == 0 and r["local_instructions"] == 0, context
    assert r["regs"] <= 255 and r["blocks_per_sm"] >= 2, context
    assert r["shared_bytes"] == spec.shared_bytes, context
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in Path(r["ptx"]).read_text()


def test_3xtf32_issues_three_times_the_hmma_per_k_step(reports: dict[str, Any]) -> None:
    from kernels.cuda.tensor.kernel import SPECS

    per_step = {p: reports[f"mma_{p}"]["hmma"] // SPECS[p].k_steps for p in SPECS}
    assert per_step == {"tf32": 16, "3xtf32": 48}


def test_every_variant_states_its_precision(reports: dict[str, Any]) -> None:
    from kernels.cuda.host import VARIANTS

    assert {n: reports[n]["precision"] for n in VARIANTS} == {
        "tiled_float32": "fp32",
        "tiled_float64": "fp64",
        "blocked_float32": "fp32",
        "blocked_float64": "fp64",
        "mma_tf32": "tf32",
        "mma_3xtf32": "3xtf32",
    }


def test_default_ptx_assembles_independently(reports: dict[str, Any]) -> None:
    """Re-assemble the written PTX here and re-derive the numbers from text."""
    (r,) = (r for r in _defaults(reports) if r["dtype"] == "float32")
    cubin = Path(r["ptx"]).with_suffix(".again.cubin")
    ptxas = subprocess.run(
        [ki.find_tool("ptxas"), "-v", "-arch=sm_90", r["ptx"], "-o", cubin],
        capture_output=True,
        text=True,
        check=True,
    )
    text = subprocess.run(
        [ki.find_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True
    ).stdout
    again = sass.analyse(ptxas.stderr + ptxas.stdout, text, "float32")
    assert {k: r[k] for k in again} == again


def test_gate_catches_float64_accumulator(reports: dict[str, Any]) -> None:
    r = reports["bad_acc_float64"]
    missed = " | ".join(r["targets_missed"])
    assert r["fp64_instructions"] > 0
    assert "FP64 instructions" in missed
    assert "ffma 0% of the loop" in missed  # the adds became DADD, the FFMA vanished


def test_gate_catches_signed_divmod_indexing(reports: dict[str, Any]) -> None:
    r = reports["bad_divmod_index"]
    missed = " | ".join(r["targets_missed"])
    assert r["lds128"] == 0 and r["lds32"] > 0
    assert "shared loads not all 128-bit" in missed
    assert "per shared load < 16" in missed


def test_tiled_reference_is_the_before(reports: dict[str, Any]) -> None:
    """The seed-fixed kernel: 16 FFMA per 20 shared loads, as measured on the seed."""
    r = reports["tiled_float32"]
    assert (r["ffma"], r["lds32"] + r["lds64"] + r["lds128"]) == (16, 20)
    assert r["fp64_instructions"] == 0 and r["spill_bytes"] == 0


def test_compile_refuses_the_simulator() -> None:
    from numba.core import config

    if not config.ENABLE_CUDASIM:
        pytest.skip("only meaningful with the simulator on")
    with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM unset"):
        ki.compile_kernel_ptx(lambda a, b, c: None, "float32", (9, 0))


def test_cli_rejects_bad_cc() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernels", "inspect", "--cc", "9"],
        cwd=REPO,
        env=_compile_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: compute capability must look like 9.0")


# --- pure parsing on small text ----------------------------------------------------------------

SASS = """
\tcode for sm_90
\t\tFunction : kern
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;       /* 0x00000a00ff017b82 */
                                                                /* 0x000fe20000000800 */
        /*0010*/                   LDS.128 R4, [R2] ;           /* 0x0000000002047984 */
        /*0020*/                   FFMA R8, R4, R5, R8 ;        /* 0x0000000504087223 */
        /*0030*/                   FFMA R9, R6, R7, R9 ;        /* 0x0000000706097223 */
        /*0040*/              @!P0 BRA 0x10 ;                   /* 0xfffffffc00008947 */
        /*0050*/                   LDS R4, [R2+0x4] ;           /* 0x0000040002047984 */
        /*0060*/                   FFMA R8, R4, R4, R8 ;        /* 0x0000000404087223 */
        /*0070*/                   DADD R10, R10, R12 ;         /* 0x0000000c0a0a7229 */
        /*0080*/                   F2F.F64.F32 R10, R4 ;        /* 0x0000000400 0a7310 */
        /*0090*/               @P1 BRA 0x50 ;                   /* 0xfffffffc00001947 */
        /*00a0*/                   EXIT ;                       /* 0x000000000000794d */
        /*00b0*/                   BRA 0xb0;                    /* 0xfffffffc00fc7947 */
"""


def test_parse_sass_reads_addresses_opcodes_and_drops_predicates() -> None:
    ins = sass.parse_sass(SASS)
    assert [i.address for i in ins] == list(range(0, 0xC0, 0x10))
    assert ins[1] == sass.Instruction(0x10, "LDS.128", "R4, [R2]")
    assert ins[4].opcode == "BRA" and sass.branch_target(ins[4]) == 0x10
    assert sass.branch_target(ins[2]) is None


def test_find_loops_ignores_forward_and_self_branches() -> None:
    loops = sass.find_loops(sass.parse_sass(SASS))
    assert loops == [sass.Loop(0x10, 0x40), sass.Loop(0x50, 0x90)]  # not the trailing BRA 0xb0


def test_innermost_drops_enclosing_loops() -> None:
    outer, inner, other = sass.Loop(0, 0x100), sass.Loop(0x20, 0x60), sass.Loop(0x200, 0x300)
    assert sass.innermost([outer, inner, other]) == [inner, other]


def test_hottest_loop_prefers_more_fma_then_the_shorter_loop() -> None:
    ins = sass.parse_sass(SASS)
    assert sass.hottest_loop(ins, "FFMA") == sass.Loop(0x10, 0x40)  # 2 FFMA beat 1
    tied = sass.parse_sass(SASS.replace("DADD R10, R10, R12", "FFMA R10, R10, R12, R10"))
    assert sass.hottest_loop(tied, "FFMA") == sass.Loop(0x10, 0x40)  # 2 each: the shorter wins
    assert sass.hottest_loop([], "FFMA") is None


def test_count_loop_on_text() -> None:
    ins = sass.parse_sass(SASS)
    body = sass.loop_body(ins, sass.Loop(0x10, 0x40))
    assert sass.count_loop(body, "FFMA") == {
        "ffma": 2,
        "lds32": 0,
        "lds64": 0,
        "lds128": 1,
        "instructions": 4,
        "ffma_share": 0.5,
        "ffma_per_lds": 2.0,
    }
    assert sass.count_loop([], "DFMA")["ffma_per_lds"] is None


@pytest.mark.parametrize(
    ("opcode", "width"),
    [("LDS", 32), ("LDS.U8", 32), ("LDS.64", 64), ("LDS.128", 128), ("LDS.U.128", 128)],
)
def test_lds_width(opcode: str, width: int) -> None:
    assert sass.lds_width(opcode) == width


@pytest.mark.parametrize(
    ("opcode", "fp64"),
    [
        ("DADD", True),
        ("DFMA.RM", True),
        ("DSETP.GT.AND", True),
        ("F2F.F64.F32", True),  # float32 -> float64 conversion
        ("FFMA", False),
        ("FADD.FTZ", False),
        ("LDG.E.64", False),  # a 64-bit load is not FP64 math
    ],
)
def test_is_fp64(opcode: str, fp64: bool) -> None:
    assert sass.is_fp64(opcode) is fp64


def test_parse_ptxas_info() -> None:
    text = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
        "ptxas info    : Function properties for k\n"
        "    16 bytes stack frame, 32 bytes spill stores, 28 bytes spill loads\n"
        "ptxas info    : Used 128 registers, used 1 barriers, 16 bytes cumulative stack size, "
        "16640 bytes smem\n"
    )
    assert sass.parse_ptxas_info(text) == {
        "regs": 128,
        "spill_bytes": 60,
        "shared_bytes": 16640,
        "local_bytes": 16,
    }


def test_parse_sass_keeps_lower_case_opcode_parts() -> None:
    text = """
        /*0100*/                   DMMA.16x8x4 R8, R2, R4, R8 ;   /* 0x0000000402087e3f */
        /*0110*/              @!P0 HMMA.1688.F32.TF32 R12, R8, R6, R12 ;  /* 0x00000006080c723c */
"""
    ins = sass.parse_sass(text)
    assert [i.opcode for i in ins] == ["DMMA.16x8x4", "HMMA.1688.F32.TF32"]
    assert sass.is_fp64(ins[0].opcode)


def test_analyse_finds_the_hmma_loop_for_tensor_precisions() -> None:
    text = SASS.replace("FFMA R9, R6, R7, R9", "HMMA.1688.F32.TF32 R12, R8, R6, R12").replace(
        "/*0060*/                   FFMA", "/*0060*/                   HMMA.1688.F32.TF32"
    )
    assert sass.analyse("", text, "float32")["loop"] == "0x0010-0x0040"  # FFMA: 1 against 0
    tensor = sass.analyse("", text, "float32", "tf32")
    assert tensor["loop"] == "0x0010-0x0040" and tensor["hmma"] == 1  # 1 HMMA each: shorter


@pytest.mark.parametrize(
    ("regs", "shared", "threads", "blocks"),
    [
        (128, 16640, 256, 2),  # 128 x 256 = 32768 registers per block
        (130, 16640, 256, 1),  # rounds up to 136 per thread: 2 blocks need 69632 > 65536
        (32, 100_000, 128, 2),  # shared memory: 2 x (100000 + 1024) <= 233472
        (16, 0, 1024, 2),  # threads: 2048 per SM
        (8, 0, 32, 32),  # the block limit
    ],
)
def test_blocks_per_sm(regs: int, shared: int, threads: int, blocks: int) -> None:
    assert sass.blocks_per_sm(regs, shared, threads) == blocks


def _mma_report(**changes: Any) -> dict[str, Any]:
    base = {"regs": 126, "spill_bytes": 0, "local_bytes": 0, "local_instructions": 0}
    base |= {"blocks_per_sm": 2, "shared_bytes": 37888, "hmma": 32, "ffma": 0}
    return base | {"fp64_instructions": 0} | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, None),
        ({"hmma": 16}, "16 HMMA in the hot loop != 32 per K tile designed"),
        ({"ffma": 64}, "64 FFMA in the hot loop"),
        ({"blocks_per_sm": 1}, "1 blocks per SM < 2"),
        ({"regs": 256}, "256 registers > 255"),
        ({"spill_bytes": 4}, "spills 4 bytes"),
        ({"local_bytes": 8}, "local memory"),
        ({"shared_bytes": 60_000}, "60000 bytes shared > 49152"),
    ],
)
def test_check_mma_targets(changes: dict[str, Any], message: str | None) -> None:
    missed = sass.check_mma_targets(_mma_report(**changes), sass.MmaTargets(32))
    assert len(missed) == (0 if message is None else 1) and all(message in m for m in missed)


def test_analyse_counts_fp64_only_for_float32() -> None:
    assert sass.analyse("", SASS, "float32")["fp64_instructions"] == 2
    assert sass.analyse("", SASS, "float64")["fp64_instructions"] is None


@pytest.mark.parametrize(("text", "cc"), [("9.0", (9, 0)), ("8.6", (8, 6)), (" 10.0 ", (10, 0))])
def test_parse_cc(text: str, cc: tuple[int, int]) -> None:
    assert ki.parse_cc(text) == cc


@pytest.mark.parametrize("text", ["9", "sm_90", "9.00", ""])
def test_parse_cc_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="compute capability must look like 9.0"):
        ki.parse_cc(text)


def _report(**changes: Any) -> dict[str, Any]:
    base = {
        "name": "k",
        "dtype": "float32",
        "default": True,
        "ptx": "/tmp/k.ptx",
        "regs": 128,
        "spill_bytes": 0,
        "shared_bytes": 16640,
        "local_bytes": 0,
        "local_instructions": 0,
        "ffma": 512,
        "lds32": 0,
        "lds64": 0,
        "lds128": 32,
        "instructions": 604,
        "ffma_share": 0.8477,
        "ffma_per_lds": 16.0,
        "fp64_instructions": 0,
    }
    return base | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, None),  # all met
        ({"regs": 130}, "130 registers > 128"),
        ({"spill_bytes": 8}, "spills 8 bytes"),
        ({"local_instructions": 2}, "local memory"),
        ({"shared_bytes": 50_000}, "50000 bytes shared > 49152"),
        ({"ffma_per_lds": 4.0}, "4.0 ffma per shared load < 16"),
        ({"ffma_per_lds": None}, "None ffma per shared load"),
        ({"ffma_share": 0.7}, "ffma 70% of the loop < 80%"),
        ({"lds32": 3}, "shared loads not all 128-bit (3 x32, 0 x64)"),
        ({"fp64_instructions": 5}, "5 FP64 instructions"),
    ],
)
def test_check_targets(changes: dict[str, Any], message: str | None) -> None:
    missed = sass.check_targets(_report(**changes))
    assert missed == ([] if message is None else [m for m in missed if message in m])
    assert len(missed) == (0 if message is None else 1)


def test_format_table_aligns_and_marks_default() -> None:
    rows = [_report(), _report(name="slow_one", default=False, ffma_share=0.16)]
    for r in rows:
        r["targets_missed"] = sass.check_targets(r)
    lines = ki.format_table(rows).splitlines()
    assert lines[0].split()[:3] == ["variant", "regs", "spill"]
    assert lines[1].startswith("k *") and lines[1].rstrip().endswith("met")
    assert "ffma 16% of the loop < 80%" in lines[2]
    assert lines[0].index("regs") == lines[1].index("128")  # columns line up
    assert "toolchain: numba" in lines[-1]

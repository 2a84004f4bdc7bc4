"""Mutation score of the modules whose mistakes users feel, each against its own tests.

    python -m benchmarks.mutate [--only NAME ...] [--out benchmarks/results/mutation.md]

For each target: a scratch copy of the checkout (git archive HEAD), mutmut 3 told to mutate that
one module and to run only the named tests (it runs, per mutant, the tests that reach the
mutated function), then its counts and surviving mutants (with their diffs) go into the
report. Not part of CI: minutes per module on 2 cores; run it under ``nice -n 19``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ACCUMULATE_TESTS = ["tests/pipeline/test_accumulate_units.py"]
"""The accumulation's protocol step by step without a cluster (5 s); the cluster and CLI tests
(test_accumulate*.py, the crash schedule) take minutes a mutant, and a CLI job would not see a
mutant of the process that started it."""

SAFE = "tests/pipeline/test_safe_by_construction.py"
OUT_RECORD_UNITS = [
    f"tests/pipeline/test_out_record.py::{name}"
    for name in (
        "test_a_record_round_trips_as_json_text",
        "test_the_stored_fields_are_those_earlier_versions_wrote",
        "test_create_and_mark_write_json_text",
        "test_random_writes_its_seed",
        "test_a_malformed_record_is_no_record",
        "test_an_array_with_a_malformed_record_is_not_ours",
        "test_a_huge_attribute_is_refused_unread",
        "test_an_old_record_is_replaced_by_overwrite",
        "test_an_old_unfinished_product_is_refused_as_an_input",
    )
]
"""test_out_record.py's tests that need no cluster."""
BOUNDED_UNITS = [
    "tests/pipeline/test_hostile.py::test_gpu_decode_sends_a_lying_chunk_to_the_bounded_host_path",
    "tests/pipeline/test_hostile.py::test_honest_chunks_read_as_before",
    *(
        f"tests/pipeline/test_bounded_reads.py::{name}"
        for name in (
            "test_an_input_read_directly_refuses_a_fifo_too",
            "test_a_codec_nothing_bounds_is_refused_by_name",
            "test_a_shard_index_giving_an_inner_chunk_too_much_is_refused",
            "test_input_store_reads_ranges_as_zarrs_local_store",
        )
    ),
]
"""test_hostile.py's and test_bounded_reads.py's bounded-read tests that run in this process."""

TARGETS = {
    "launch": ("kernels/cuda/launch.py", ["tests/kernels/test_launch.py"]),
    "cpu": ("kernels/cpu.py", ["tests/kernels/test_cpu.py"]),
    "tiled": ("kernels/cuda/tiled.py", ["tests/kernels/test_cuda_tiled.py"]),
    "dtypes": ("pipeline/plan/dtypes.py", ["tests/pipeline/test_dtypes.py"]),
    "lock": (
        "pipeline/store/lock.py",
        ["tests/pipeline/test_lock_units.py", "tests/pipeline/test_lock.py"],
    ),
    "journal": (
        "pipeline/store/journal.py",
        ["tests/pipeline/test_journal.py", "tests/pipeline/test_band_resume.py"],
    ),
    "verify": (
        "pipeline/verify/tasks.py",
        ["tests/pipeline/test_verify.py", "tests/pipeline/test_verify_strength.py"],
    ),
    "verify-tasks": ("pipeline/verify/tasks.py", ["tests/pipeline/test_verify_unit.py"]),
    "verify-client": ("pipeline/verify/check.py", ["tests/pipeline/test_verify_unit.py"]),
    "planner": (
        "pipeline/plan/search.py",
        ["tests/pipeline/test_plan.py", "tests/pipeline/test_plan_unit.py"],
    ),
    "memory": ("pipeline/plan/memory.py", ["tests/pipeline/test_plan_unit.py"]),
    "output": ("pipeline/store/output.py", ["tests/pipeline/test_output_unit.py"]),
    "accumulate-state": ("pipeline/accumulate/state.py", ACCUMULATE_TESTS),
    "accumulate-originals": ("pipeline/accumulate/originals.py", ACCUMULATE_TESTS),
    "accumulate-tasks": ("pipeline/accumulate/tasks.py", ACCUMULATE_TESTS),
    "accumulate-flags": ("pipeline/accumulate/flags.py", ACCUMULATE_TESTS),
    "accumulate-room": ("pipeline/accumulate/room.py", ACCUMULATE_TESTS),
    "accumulate-crash": ("pipeline/accumulate/crash.py", ACCUMULATE_TESTS),
    # The store's safety layer: each against its own tests that need no cluster (the
    # cluster tests reaching these modules take minutes per mutant on 2 cores).
    "door": (
        "pipeline/store/door.py",
        [
            "tests/pipeline/test_door.py",
            "tests/pipeline/test_direct.py",
            "tests/pipeline/test_door_guards.py",
            f"{SAFE}::test_a_hard_linked_lock_is_never_written",
            f"{SAFE}::test_a_folder_swapped_in_at_out_s_path_is_never_written",
        ],
    ),
    "owned": (
        "pipeline/store/owned.py",
        [
            *OUT_RECORD_UNITS,
            "tests/pipeline/test_direct.py",
            "tests/pipeline/test_owned_guards.py",
        ],
    ),
    "record": (
        "pipeline/store/record.py",
        [*OUT_RECORD_UNITS, "tests/pipeline/test_record_guards.py"],
    ),
    "links": (
        "pipeline/store/links.py",
        ["tests/pipeline/test_planted_links.py", "tests/pipeline/test_door_guards.py"],
    ),
    "deputy": ("pipeline/store/deputy.py", ["tests/pipeline/test_planted_links.py"]),
    "reach": (
        "pipeline/store/reach.py",
        [
            f"{SAFE}::test_a_link_to_the_root_in_an_input_is_not_walked",
            "tests/pipeline/test_reach_guards.py",
        ],
    ),
    "bounded": (
        "pipeline/store/chunks/bounded.py",
        [
            *BOUNDED_UNITS,
            "tests/pipeline/test_decode_in_place.py",
            "tests/pipeline/test_bounded_guards.py",
        ],
    ),
    "codec-bounds": (
        "pipeline/store/chunks/codec_bounds.py",
        [
            "tests/pipeline/test_hostile.py",
            "tests/pipeline/test_bounded_reads.py",
            "tests/pipeline/test_bounded_guards.py",
        ],
    ),
    "space": (
        "pipeline/store/space.py",
        [
            "tests/pipeline/test_sizing.py::test_compressed_out_is_never_refused_for_space",
            "tests/pipeline/test_sizing.py::test_room_of_a_url_is_not_known",
            "tests/pipeline/test_space_guards.py",
        ],
    ),
    "standardize": (
        "pipeline/plan/standardize.py",
        ["tests/pipeline/test_standardize_unit.py", "tests/pipeline/test_standardize_guards.py"],
    ),
    "moments": ("pipeline/run/moments.py", ["tests/pipeline/test_moments_guards.py"]),
    "coordinates": (
        "pipeline/store/coordinates.py",
        [
            "tests/pipeline/test_coordinates.py",
            "tests/pipeline/test_coordinates_guards.py",
            "tests/pipeline/test_coordinates_labels.py",
        ],
    ),
    "labels": ("pipeline/store/labels.py", ["tests/pipeline/test_coordinates_labels.py"]),
    "band-writer": ("pipeline/run/band_writer.py", ["tests/pipeline/test_band_writer_fence.py"]),
    "verify-standardized": (
        "pipeline/verify/tasks.py",
        [
            "tests/pipeline/test_verify_unit.py",
            "tests/pipeline/test_verify_standardized_tolerance.py",
            "tests/pipeline/test_verify_bad_chunks.py",
        ],
    ),
}
"""name: (module, its tests)."""

SETUP_CFG = """[mutmut]
source_paths=
  pipeline
  kernels
  cluster
only_mutate={module}
pytest_add_cli_args_test_selection=
{tests}
pytest_add_cli_args=
  -p
  no:cacheprovider
process_isolation=forkserver
"""
# forkserver: the suite's conftest requires numba unimported, which a forked worker of
# mutmut's main process (stats run) would break.


def run_target(
    name: str, module: str, tests: list[str], children: int, worktree: bool = False
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"mutate-{name}-") as scratch:
        work = Path(scratch)
        _copy_checkout(work, worktree)
        lines = "\n".join(f"  {t}" for t in tests)
        (work / "setup.cfg").write_text(SETUP_CFG.format(module=module, tests=lines))
        mutmut = [sys.executable, "-m", "mutmut"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")]),
        }
        started = time.perf_counter()
        subprocess.run([*mutmut, "run", "--max-children", str(children)], cwd=work, env=env,
                       capture_output=True, check=False)  # fmt: skip
        seconds = time.perf_counter() - started
        listing = subprocess.run([*mutmut, "results", "--all", "true"], cwd=work, env=env,
                                 capture_output=True, text=True, check=False).stdout  # fmt: skip
        statuses = dict(re.findall(r"^\s*(\S+): (.+)$", listing, re.M))
        survivors = {f"`{m}` ({s})": _diff(mutmut, work, env, m)
                     for m, s in statuses.items() if s != "killed"}  # fmt: skip
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    return {"module": module, "tests": tests, "seconds": seconds, "counts": counts,
            "survivors": survivors}  # fmt: skip


def _copy_checkout(work: Path, worktree: bool) -> None:
    """HEAD (git archive), or with ``worktree`` the files as they are now, tracked and
    untracked but not ignored (tests written since the last commit)."""
    if not worktree:
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True,
                                 check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        return
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout  # fmt: skip
    tar = ["tar", "-c", "--null", "--ignore-failed-read", "-T", "-"]
    packed = subprocess.run(tar, cwd=REPO, input=names, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=packed, check=True)


def _diff(mutmut: list[str], work: Path, env: dict[str, str], mutant: str) -> str:
    shown = subprocess.run([*mutmut, "show", mutant], cwd=work, env=env, capture_output=True,
                           text=True, check=False).stdout  # fmt: skip
    return "\n".join(x for x in shown.splitlines() if re.match(r"^[-+](?![-+])", x))


DETECTED = ("killed", "segfault", "timeout")
"""Statuses a test run told apart from the unmutated code: a failed test, a crashed test process
(mutmut's "segfault", which also covers SIGKILL) and a hang past mutmut's time limit (check
these by hand: on a loaded machine a slow test can time out under a harmless mutant)."""


def report(results: dict[str, dict[str, object]]) -> str:
    rows = ["| target | module | mutants | killed | crashed | timed out | not detected | "
            "detected | minutes |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        counts: dict[str, int] = r["counts"]  # type: ignore[assignment]
        total = sum(counts.values())
        found = [counts.get(status, 0) for status in DETECTED]
        score = f"{100 * sum(found) / total:.0f} %" if total else "-"
        rows.append(f"| {name} | {r['module']} | {total} | {found[0]} | {found[1]} | "
                    f"{found[2]} | {total - sum(found)} | {score} | "
                    f"{float(r['seconds']) / 60:.1f} |")  # type: ignore[arg-type]  # fmt: skip
    out = ["# Mutation score (mutmut 3, python -m benchmarks.mutate)", "", *rows, ""]
    for name, r in results.items():
        survivors: dict[str, str] = r["survivors"]  # type: ignore[assignment]
        out += [f"## {name}: not killed ({len(survivors)}: each with its status), tests: "
                f"{', '.join(r['tests'])}", ""]  # type: ignore[arg-type]  # fmt: skip
        for mutant, diff in survivors.items():
            out += [f"- {mutant}", "", "  ```diff", *(f"  {x}" for x in diff.splitlines()),
                    "  ```", ""]  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(TARGETS), help="targets to run")
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--out", type=Path, help="write the report here (default: print it)")
    parser.add_argument("--worktree", action="store_true",
                        help="mutate the files as they are now, not HEAD")  # fmt: skip
    args = parser.parse_args(argv)
    results = {}
    for name in args.only or TARGETS:
        module, tests = TARGETS[name]
        results[name] = run_target(name, module, tests, args.children, args.worktree)
        print(f"{name}: {results[name]['counts']} in {results[name]['seconds']:.0f} s", flush=True)
        if args.out:  # after each target: a long run stopped midway keeps what it measured
            args.out.write_text(report(results))
    if not args.out:
        print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

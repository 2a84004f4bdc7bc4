"""Hostile-tree fuzzing for a while: random seeds of tests/pipeline/fuzz_tree.py and, as root,
of its second user (tests/pipeline/fuzz_planter.py), alternating, until time is up.

    python -m benchmarks.fuzz --minutes 30 [--jobs 2] [--commands 3] [--fuzzer both]
    python -m benchmarks.fuzz --seeds 1234 5678      # rerun seeds (a failure's report names it)
    python -m benchmarks.fuzz --fuzzer planter --seeds 1234

Each case builds a sandbox of small arrays, plants hostile things (links, FIFOs, devices, sparse
3 GiB files, look-alike names, planted sidecars, hard links) and runs random CLI commands on it,
checking after each that nothing outside what the command may write changed, that the exit code
and stderr keep the contract, that exit 0 left the right numbers, and that it ended within its
time bound and RSS limit. A planter case has another uid (65534) plant links, folders, files
and archives in a shared 1777 or 2775 folder before and during root's jobs, and checks that
nothing only root could change changes, no secret value reaches anything that uid can read and
exit 0 never follows its links. Prints the cases run, each failure's report (seed, planted
things, command, violated invariant), max RSS and max seconds against a clean run's, and the
planter's attack kinds with their failing seeds; writes the same summary to --out; keeps the
sandboxes of failing cases. Exit 1 on any invariant failure.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from tests.pipeline import fuzz_planter, fuzz_tree
from tests.pipeline.fuzz_tree import TIMEOUT_S, CaseResult, MiB, Run, clean_run

FUZZERS = {"tree": fuzz_tree.run_case, "planter": fuzz_planter.run_case}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="how long to draw new seeds")
    p.add_argument("--seeds", type=int, nargs="*", help="run exactly these seeds (no time limit)")
    p.add_argument("--jobs", type=int, default=1, help="cases at once (each runs ~1 CPU)")
    p.add_argument("--commands", type=int, default=3, help="commands per sandbox")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per command")
    p.add_argument("--work", type=Path, help="sandboxes' folder (default: a new temporary one)")
    p.add_argument("--out", type=Path, help="summary file (default: WORK/summary.md)")
    p.add_argument(
        "--fuzzer",
        choices=["tree", "planter", "both"],
        default="both",
        help="both: seeds alternate between the two (the planter's only as root)",
    )
    return p.parse_args(argv)


Case = tuple[str, CaseResult]
"""A result and the fuzzer that made it."""


def _case(fuzzer: str, seed: int, work: Path, args: argparse.Namespace) -> Case:
    folder = work / f"{fuzzer}-{seed}"
    try:
        result = FUZZERS[fuzzer](seed, folder, commands=args.commands, timeout_s=args.timeout)
    except Exception as e:  # noqa: BLE001 - the fuzzer's own failure is a failing case too
        result = CaseResult(seed, [], [], [f"the fuzzer failed: {type(e).__name__}: {e}"])
    if not result.violations:
        shutil.rmtree(folder, ignore_errors=True)
    return fuzzer, result


def _fuzzers(args: argparse.Namespace) -> list[str]:
    """The planter needs root (it drops to another uid); without it, the tree fuzzer alone."""
    if os.geteuid() != 0 and args.fuzzer == "planter":
        raise SystemExit("--fuzzer planter needs root: its planter drops to uid 65534")
    if args.fuzzer != "both":
        return [args.fuzzer]
    if os.geteuid() == 0:
        return ["tree", "planter"]
    print("not root: the planter's cases are left out (they drop to uid 65534)", flush=True)
    return ["tree"]


def _draw(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """The seeds given (each for every fuzzer), else random ones until --minutes are up, the
    fuzzers taking turns."""
    fuzzers = _fuzzers(args)
    if args.seeds:
        yield from ((f, s) for s in args.seeds for f in fuzzers)
        return
    draw, deadline = random.Random(), time.monotonic() + args.minutes * 60
    for fuzzer in itertools.cycle(fuzzers):
        if time.monotonic() >= deadline:
            return
        yield fuzzer, draw.randrange(2**31)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tilegemm-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)  # the planter reaches the shared folders by path, as users do
    baseline = clean_run(work / "clean", args.timeout)
    shutil.rmtree(work / "clean", ignore_errors=True)
    rss = baseline.max_rss_bytes / MiB
    print(f"clean multiply: {baseline.seconds:.1f} s, peak RSS {rss:.0f} MiB", flush=True)
    results: list[Case] = []
    seeds, jobs = _draw(args), max(args.jobs, 1)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        pending = {pool.submit(_case, *fs, work, args) for fs in itertools.islice(seeds, jobs)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                fuzzer, result = future.result()
                results.append((fuzzer, result))
                text = result.report() if result.violations else f"seed {result.seed}: ok"
                print(f"{fuzzer} {text}", flush=True)
                pending |= {
                    pool.submit(_case, *fs, work, args) for fs in itertools.islice(seeds, 1)
                }
    summary = _summary(results, baseline, work)
    out = args.out or work / "summary.md"
    out.write_text(summary)
    print(summary + f"(summary in {out})")
    return 1 if any(r.violations for _, r in results) else 0


def _summary(results: list[Case], baseline: Run, work: Path) -> str:
    steps = [s for _, r in results for s in r.steps]
    failing = [(f, r) for f, r in results if r.violations]
    rss = max((s.run.max_rss_bytes for s in steps), default=0)
    codes = collections.Counter(s.run.rc for s in steps)
    seconds = max((s.run.seconds for s in steps), default=0.0)
    cases = collections.Counter(f for f, _ in results)
    lines = [
        "# Hostile-tree fuzz",
        f"cases {len(results)} ({', '.join(f'{f} {n}' for f, n in sorted(cases.items()))}), "
        f"commands {len(steps)}, failing cases {len(failing)}",
        "exit codes: " + ", ".join(f"{rc}: {n}" for rc, n in sorted(codes.items(), key=str)),
        f"max RSS {rss / MiB:.0f} MiB (clean multiply {baseline.max_rss_bytes / MiB:.0f} MiB), "
        f"max seconds {seconds:.1f} (clean {baseline.seconds:.1f})",
        *_attack_kinds(results),
    ]
    if failing:
        lines.append("failing seeds: " + " ".join(f"{f}:{r.seed}" for f, r in failing))
        lines.append("rerun one: python -m benchmarks.fuzz --fuzzer FUZZER --seeds SEED")
        lines.append(f"their sandboxes are kept under {work}")
        lines += ["", *(f"{f} {r.report()}" for f, r in failing)]
    return "\n".join(lines) + "\n"


def _attack_kinds(results: list[Case]) -> list[str]:
    """The planter's attack kinds: steps run, steps failing and a failing seed, by kind."""
    runs: collections.Counter[str] = collections.Counter()
    failed: dict[str, list[int]] = collections.defaultdict(list)
    for fuzzer, result in results:
        for step in result.steps if fuzzer == "planter" else []:
            runs[step.command.kind] += 1
            if step.violations:
                failed[step.command.kind].append(result.seed)
    if not runs:
        return []
    rows = [
        f"  {kind}: {n} steps, {len(failed[kind])} failing"
        + (f" (seed {failed[kind][0]})" if failed[kind] else "")
        for kind, n in sorted(runs.items())
    ]
    return ["planter attack kinds:", *rows]


if __name__ == "__main__":
    sys.exit(main())

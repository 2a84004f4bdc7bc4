"""Hostile-tree fuzzing for a while: random seeds of tests/pipeline/fuzz_tree.py until time is up.

    python -m benchmarks.fuzz --minutes 30 [--jobs 2] [--commands 3]
    python -m benchmarks.fuzz --seeds 1234 5678      # rerun seeds (a failure's report names it)

Each case builds a sandbox of small arrays, plants hostile things (links, FIFOs, devices, sparse
3 GiB files, look-alike names, planted sidecars, hard links) and runs random CLI commands on it,
checking after each that nothing outside what the command may write changed, that the exit code
and stderr keep the contract, that exit 0 left the right numbers, and that it ended within its
time bound and RSS limit. Prints the cases run, each failure's report (seed, planted things,
command, violated invariant), max RSS and max seconds against a clean run's; writes the same
summary to --out; keeps the sandboxes of failing cases. Exit 1 on any invariant failure.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from tests.pipeline.fuzz_tree import TIMEOUT_S, CaseResult, MiB, Run, clean_run, run_case


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="how long to draw new seeds")
    p.add_argument("--seeds", type=int, nargs="*", help="run exactly these seeds (no time limit)")
    p.add_argument("--jobs", type=int, default=1, help="cases at once (each runs ~1 CPU)")
    p.add_argument("--commands", type=int, default=3, help="commands per sandbox")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per command")
    p.add_argument("--work", type=Path, help="sandboxes' folder (default: a new temporary one)")
    p.add_argument("--out", type=Path, help="summary file (default: WORK/summary.md)")
    return p.parse_args(argv)


def _case(seed: int, work: Path, args: argparse.Namespace) -> CaseResult:
    folder = work / f"case-{seed}"
    try:
        result = run_case(seed, folder, commands=args.commands, timeout_s=args.timeout)
    except Exception as e:  # noqa: BLE001 - the fuzzer's own failure is a failing case too
        result = CaseResult(seed, [], [], [f"the fuzzer failed: {type(e).__name__}: {e}"])
    if not result.violations:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _draw(args: argparse.Namespace) -> Iterator[int]:
    """The seeds given, else random ones until --minutes are up."""
    if args.seeds:
        yield from args.seeds
        return
    draw, deadline = random.Random(), time.monotonic() + args.minutes * 60
    while time.monotonic() < deadline:
        yield draw.randrange(2**31)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tilegemm-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    baseline = clean_run(work / "clean", args.timeout)
    shutil.rmtree(work / "clean", ignore_errors=True)
    rss = baseline.max_rss_bytes / MiB
    print(f"clean multiply: {baseline.seconds:.1f} s, peak RSS {rss:.0f} MiB", flush=True)
    results: list[CaseResult] = []
    seeds, jobs = _draw(args), max(args.jobs, 1)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        pending = {pool.submit(_case, s, work, args) for s in itertools.islice(seeds, jobs)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                result = future.result()
                results.append(result)
                print(
                    result.report() if result.violations else f"seed {result.seed}: ok", flush=True
                )
                pending |= {pool.submit(_case, s, work, args) for s in itertools.islice(seeds, 1)}
    summary = _summary(results, baseline, work)
    out = args.out or work / "summary.md"
    out.write_text(summary)
    print(summary + f"(summary in {out})")
    return 1 if any(r.violations for r in results) else 0


def _summary(results: list[CaseResult], baseline: Run, work: Path) -> str:
    steps = [s for r in results for s in r.steps]
    failing = [r for r in results if r.violations]
    rss = max((s.run.max_rss_bytes for s in steps), default=0)
    codes = collections.Counter(s.run.rc for s in steps)
    seconds = max((s.run.seconds for s in steps), default=0.0)
    lines = [
        "# Hostile-tree fuzz",
        f"cases {len(results)}, commands {len(steps)}, failing cases {len(failing)}",
        "exit codes: " + ", ".join(f"{rc}: {n}" for rc, n in sorted(codes.items(), key=str)),
        f"max RSS {rss / MiB:.0f} MiB (clean multiply {baseline.max_rss_bytes / MiB:.0f} MiB), "
        f"max seconds {seconds:.1f} (clean {baseline.seconds:.1f})",
    ]
    if failing:
        lines.append("failing seeds: " + " ".join(str(r.seed) for r in failing))
        lines.append(f"their sandboxes are kept under {work}")
        lines += ["", *(r.report() for r in failing)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

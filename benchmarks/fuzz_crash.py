"""The crash schedule of ``--accumulate`` for a while: seeded random stops until time is up.

    python -m benchmarks.fuzz_crash --minutes 30 [--seed 1]
    python -m benchmarks.fuzz_crash --cases add:move.object:7:KILL    # rerun one case

Each case makes fresh data, runs the CLI with a crash point set (tests/pipeline/crash_schedule.py:
a named step boundary of the protocol, its N-th hit, SIGKILL to the job's process group or
SIGINT/SIGTERM to the command), then verify, a new --accumulate and --resume, and checks that C
was only ever the old C, the new C, or resumable to the new C. Prints the counts (by scenario,
step, signal and what the stop left) and every violation with its case; writes the same
summary to --out. Exit 1 on any violation.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client, LocalCluster

from tests.pipeline.crash_schedule import Case, Outcome, random_case, run_case


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="how long to draw new cases")
    p.add_argument("--seed", type=int, default=1, help="the schedule's seed")
    p.add_argument(
        "--cases", nargs="*", help="run exactly these SCENARIO:STEP:N:SIGNAL[:WORKERS[:LAYOUT]]"
    )
    p.add_argument("--work", type=Path, help="cases' folder (default: a new temporary one)")
    p.add_argument("--out", type=Path, help="summary file (default: WORK/summary.md)")
    return p.parse_args(argv)


def _cases(args: argparse.Namespace) -> list[Case] | random.Random:
    if args.cases:
        return [
            Case(s, step, int(n), sig) for s, step, n, sig in (c.split(":") for c in args.cases)
        ]
    return random.Random(args.seed)


def summary(outcomes: list[Outcome], seconds: float, seed: int) -> str:
    failing = [o for o in outcomes if o.violations]
    left = collections.Counter(o.state for o in outcomes)
    signals = collections.Counter(o.case.signal for o in outcomes)
    steps = collections.Counter(f"{o.case.scenario}:{o.case.step}" for o in outcomes)
    lines = [
        f"cases {len(outcomes)} in {seconds / 60:.1f} min (seed {seed}), violations "
        f"{sum(len(o.violations) for o in outcomes)} in {len(failing)} case(s)",
        "what the stop left: " + ", ".join(f"{k} {v}" for k, v in sorted(left.items())),
        "signals: " + ", ".join(f"{k} {v}" for k, v in sorted(signals.items())),
        "steps: " + ", ".join(f"{k} {v}" for k, v in sorted(steps.items())),
    ]
    for o in failing:
        lines += [f"FAILED {o.case}:", *(f"  {v}" for v in o.violations)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="fuzz-crash-"))
    schedule = _cases(args)
    deadline = time.monotonic() + args.minutes * 60
    started, outcomes = time.monotonic(), []
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:  # fmt: skip
        for i in range(sys.maxsize):
            if isinstance(schedule, list):
                if i >= len(schedule):
                    break
                case = schedule[i]
            elif time.monotonic() > deadline:
                break
            else:
                case = random_case(schedule)
            folder = work / f"case-{i}"
            try:
                outcome = run_case(case, folder, client)
            except Exception as e:  # noqa: BLE001 - the harness's own failure counts too
                outcome = Outcome(case, -1, "?", [f"the harness failed: {type(e).__name__}: {e}"])
            outcomes.append(outcome)
            print(f"{case}: exit {outcome.exit_code}, left {outcome.state}"
                  + (" VIOLATION" if outcome.violations else ""), flush=True)  # fmt: skip
            if not outcome.violations:
                shutil.rmtree(folder, ignore_errors=True)
    text = summary(outcomes, time.monotonic() - started, args.seed)
    print(text)
    out = args.out or work / "summary.md"
    out.write_text(text + "\n")
    return 1 if any(o.violations for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

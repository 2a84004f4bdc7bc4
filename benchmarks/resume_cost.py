"""What --resume costs after a kill -9 at about half of OUT's chunks written (ratios in one run).

    python -m benchmarks.resume_cost --size 6144 --chunk 2048 --repeats 2

Times the whole CLI: a fresh ``multiply A B OUT``; then the same job SIGKILLed (its process
group) once half of OUT's chunks are stored, and ``--resume`` of it. Tiles in flight keep the
bands they wrote (DESIGN.md, "Journal, resume, lock"), so the resume computes only the rest.
Target: resume ≤ 0.6x fresh. The job's own seconds (its ``done:`` line) are printed too:
both runs also pay the same start-up (the interpreter and its imports).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import byte_compile
from pipeline.generate import write_random


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "multiply", *args, "--no-progress"]


CPU = re.compile(r"workers' CPU: user ([0-9.]+) s, system ([0-9.]+) s")
JOB = re.compile(r"^done: \S+ \S+ in ([0-9.]+) s", re.M)


def _timed(argv: list[str]) -> tuple[float, float, float]:
    """(wall seconds of the whole CLI, the workers' CPU seconds it reports, the job's own
    seconds on its ``done:`` line: the CLI less its start-up and exit)."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr}")
    found, job = CPU.search(done.stdout + done.stderr), JOB.search(done.stdout + done.stderr)
    cpu = float(found.group(1)) + float(found.group(2)) if found else float("nan")
    return time.perf_counter() - started, cpu, float(job.group(1)) if job else float("nan")


def _stored(out: Path) -> int:
    if not (out / "c").exists():
        return 0
    return sum(1 for p in (out / "c").rglob("*") if p.is_file() and p.suffix != ".partial")


def _kill_at(argv: list[str], out: Path, chunks: int) -> int:
    """Run the job and SIGKILL its process group once ``chunks`` of OUT's chunks are stored."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    while _stored(out) < chunks:
        if proc.poll() is not None:
            raise SystemExit("the job finished before it was killed")
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return _stored(out)


def main() -> None:
    byte_compile()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=6144)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--out-chunk", type=int, default=512, help="OUT's chunks (--chunks)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    n, oc = args.size, args.out_chunk
    total = (-(-n // oc)) ** 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a, b = str(root / "a.zarr"), str(root / "b.zarr")
        write_random(a, (n, n), (args.chunk, args.chunk), "float32", 1)
        write_random(b, (n, n), (args.chunk, args.chunk), "float32", 2)
        fresh, resumed, kept = [], [], []
        for i in range(args.repeats):
            chunks = ("--chunks", f"{oc}x{oc}")
            fresh.append(_timed(_cli(a, b, str(root / f"fresh{i}.zarr"), *chunks)))
            out = root / f"c{i}.zarr"
            kept.append(_kill_at(_cli(a, b, str(out), *chunks), out, total // 2))
            resumed.append(_timed(_cli(a, b, str(out), *chunks, "--resume")))
    print(f"# {platform.processor() or platform.machine()}, {n}² float32, {args.chunk}² input "
          f"chunks, OUT {oc}² chunks ({total}); medians of {args.repeats}")  # fmt: skip
    print(f"killed at          {kept} of {total} chunks stored")
    for unit, k in (("wall s", 0), ("workers' CPU s", 1), ("job s (done:)", 2)):
        f, r = (statistics.median(x[k] for x in runs) for runs in (fresh, resumed))
        target = "; target <= 0.6" if k == 0 else ""
        print(f"{unit:15} fresh {f:6.2f}  --resume {r:6.2f}  ({r / f:.2f}x fresh{target})")


if __name__ == "__main__":
    main()

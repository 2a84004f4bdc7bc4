"""Where the workers' CPU-seconds go, by kind, beside in-memory numpy BLAS on the same data.

Each repeat runs the whole CLI (``python -m pipeline multiply``) and reads its ``time:`` line
(CPU-seconds by kind, pipeline.cputime: they sum to the workers' user + system), then one
in-memory ``a @ b`` of the same matrices in a fresh process (its CPU-seconds and wall time
around the matmul alone). The run with the fewest CPU-seconds of the CLI is reported beside
the median BLAS: "not the product" is the workers' CPU-seconds less the product row. With
``--baseline DIR`` (another checkout, e.g. ``git archive`` of an older commit) its CLI runs in
turn with this one's, so both see the same load, and the table has a column for each.

    python -m benchmarks.cpu_account --size 12288 --repeats 2   # the recorded case
    python -m benchmarks.cpu_account --size 8192                # a quicker look
    python -m benchmarks.cpu_account --size 8192 --baseline /tmp/before   # before/after
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_peers import make_inputs
from pipeline.cputime import ROWS
from pipeline.facts.host import cpu_name

RESULTS = Path(__file__).parent / "results"
BLAS_SCRIPT = """
import json, resource, sys, time
import zarr
x, y = zarr.open_array(sys.argv[1], mode="r")[:], zarr.open_array(sys.argv[2], mode="r")[:]
r, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
x @ y
wall, s = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
cpu = s.ru_utime - r.ru_utime + s.ru_stime - r.ru_stime
print(json.dumps({"seconds": wall, "cpu_seconds": cpu}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=12288, help="square size (default 12288)")
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default="bench-data", help="scratch folder for the Zarr data")
    parser.add_argument("--name", default=None, help="results file stem (default: no file)")
    parser.add_argument("--baseline", default=None, help="another checkout to run in turn")
    args = parser.parse_args(argv)
    data = Path(args.data)
    a, b = make_inputs(data, args.size, args.chunk, args.dtype)
    runs: dict[str, list[dict[str, Any]]] = {"this": []}
    if args.baseline:
        runs["baseline"] = []
    blas = []
    for _ in range(args.repeats):  # alternate, so a noisy neighbour slows all alike
        for which in runs:
            checkout = args.baseline if which == "baseline" else None
            runs[which].append(run_cli(a, b, data / "out-account.zarr", checkout))
        blas.append(run_blas(a, b))
    table = format_table(args, runs, blas)
    print(table)
    if args.name:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{args.name}.md").write_text(table)
        (RESULTS / f"{args.name}.json").write_text(json.dumps({"runs": runs, "blas": blas}))
    return 0


def run_cli(a: str, b: str, out: Path, checkout: str | None = None) -> dict[str, Any]:
    """One whole CLI run (of ``checkout``'s pipeline when given): wall seconds and its
    CPU-seconds by kind (ROWS)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipeline", "multiply", a, b, str(out), "--no-progress",
           "--dashboard-address", "127.0.0.1:0"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": checkout} if checkout else None
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=checkout)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the CLI failed: {done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    line = next((x for x in lines if x.startswith("time:")), "")
    return {"wall": wall, "rows": parse_rows(line), "line": line, "summary": lines[-1]}


def parse_rows(line: str) -> dict[str, float]:
    """The ``CPU-seconds by kind`` of a ``time:`` line."""
    found = re.search(", ".join(rf"{row} (-?[\d.]+)(?: CPU-s)?" for row in ROWS), line)
    if found is None:
        raise RuntimeError(f"no CPU-seconds by kind in: {line!r}")
    return {row: float(x) for row, x in zip(ROWS, found.groups(), strict=True)}


def run_blas(a: str, b: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", BLAS_SCRIPT, a, b],
                          capture_output=True, text=True, check=True)  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def format_table(
    args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], blas: list[Any]
) -> str:
    best = {which: min(r, key=lambda x: sum(x["rows"].values())) for which, r in runs.items()}
    names = {"this": "this checkout", "baseline": f"baseline ({args.baseline})"}
    blas_cpu = statistics.median(x["cpu_seconds"] for x in blas)
    blas_wall = statistics.median(x["seconds"] for x in blas)
    columns = list(reversed(runs))  # baseline first: before, after
    baseline = f" --baseline {args.baseline}" if args.baseline else ""
    lines = [
        f"# CPU-seconds by kind, {args.size}² {args.dtype} ({args.chunk}² chunks)",
        "",
        f"Command: `python -m benchmarks.cpu_account --size {args.size} --chunk {args.chunk} "
        f"--dtype {args.dtype} --repeats {args.repeats}{baseline}`; "
        f"{time.strftime('%Y-%m-%d %H:%M')}; CPU: {_cpu_model()}, load average {_load()} at "
        "the end. Each column: the run with the fewest CPU-seconds (each run's figures after /).",
        "",
        "| kind | " + " | ".join(names[c] for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in [*ROWS, "total", "not the product"]:
        cells = []
        for c in columns:
            each = [_cell(r["rows"], row) for r in runs[c]]
            cells.append(
                f"{_cell(best[c]['rows'], row):.2f} / {', '.join(f'{x:.2f}' for x in each)}"
            )
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += [
        f"| numpy BLAS in memory (median) | {blas_cpu:.2f} / "
        + ", ".join(f"{x['cpu_seconds']:.2f}" for x in blas)
        + " |"
        + " |" * (len(columns) - 1),
        "",
        f"Wall (best run's CLI, whole command) against in-memory BLAS {blas_wall:.2f} s: "
        + "; ".join(
            f"{names[c]} {best[c]['wall']:.2f} s = **{blas_wall / best[c]['wall']:.2f} of BLAS**"
            for c in columns
        ),
        "",
    ]
    for c in columns:
        lines += [f"{names[c]}, best run: {best[c]['summary']}", f"  {best[c]['line']}", ""]
    return "\n".join(lines)


def _cell(rows: dict[str, float], row: str) -> float:
    total = sum(rows.values())
    if row == "total":
        return total  # the workers' user + system
    return total - rows["product"] if row == "not the product" else rows[row]


def _cpu_model() -> str:
    return f"{cpu_name()} x{_cores()}"


def _cores() -> int:
    return os.cpu_count() or 1


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())

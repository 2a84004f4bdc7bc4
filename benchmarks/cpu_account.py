"""Where the workers' CPU-seconds go, by kind, beside in-memory numpy BLAS on the same data.

Each repeat runs the whole CLI (``python -m pipeline multiply``) and reads its ``time:`` line
(CPU-seconds by kind, pipeline.cputime: they sum to the workers' user + system), then one
in-memory ``a @ b`` of the same matrices in a fresh process (its CPU-seconds and wall time
around the matmul alone). The run with the fewest CPU-seconds of the CLI is reported beside
the median BLAS: "not the product" is the workers' CPU-seconds less the product row.

    python -m benchmarks.cpu_account --size 12288 --repeats 2   # the issue's fixed case
    python -m benchmarks.cpu_account --size 8192                # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_peers import make_inputs, run_tool
from pipeline.cputime import ROWS

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
    args = parser.parse_args(argv)
    data = Path(args.data)
    a, b = make_inputs(data, args.size, args.chunk, args.dtype)
    runs, blas = [], []
    for _ in range(args.repeats):  # alternate, so a noisy neighbour slows both alike
        runs.append(run_cli(a, b, data / "out-account.zarr"))
        blas.append(run_blas(a, b))
    table = format_table(args, runs, blas)
    print(table)
    if args.name:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{args.name}.md").write_text(table)
        (RESULTS / f"{args.name}.json").write_text(json.dumps({"runs": runs, "blas": blas}))
    return 0


def run_cli(a: str, b: str, out: Path) -> dict[str, Any]:
    """One whole CLI run: wall seconds and its CPU-seconds by kind (ROWS)."""
    result = run_tool("pipeline", a, b, out)
    return {"wall": result["seconds"], "rows": parse_rows(result["accounting"]),
            "line": result["accounting"], "summary": result["summary"]}  # fmt: skip


def parse_rows(line: str) -> dict[str, float]:
    """The ``CPU-seconds by kind`` of a ``time:`` line."""
    found = re.search(", ".join(rf"{row} (-?[\d.]+)" for row in ROWS), line)
    if found is None:
        raise RuntimeError(f"no CPU-seconds by kind in: {line!r}")
    return {row: float(x) for row, x in zip(ROWS, found.groups(), strict=True)}


def run_blas(a: str, b: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", BLAS_SCRIPT, a, b],
                          capture_output=True, text=True, check=True)  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def format_table(args: argparse.Namespace, runs: list[dict[str, Any]], blas: list[Any]) -> str:
    best = min(runs, key=lambda r: sum(r["rows"].values()))
    total = sum(best["rows"].values())
    blas_cpu = statistics.median(x["cpu_seconds"] for x in blas)
    blas_wall = statistics.median(x["seconds"] for x in blas)
    lines = [
        f"# CPU-seconds by kind, {args.size}² {args.dtype} ({args.chunk}² chunks)",
        "",
        f"Command: `python -m benchmarks.cpu_account --size {args.size} --chunk {args.chunk} "
        f"--dtype {args.dtype} --repeats {args.repeats}`; {time.strftime('%Y-%m-%d %H:%M')}; "
        f"CPU: {_cpu_model()}, load average {_load()}.",
        "",
        "| kind | CPU-s (best of runs) | each run |",
        "|---|---|---|",
    ]
    for row in ROWS:
        each = ", ".join(f"{r['rows'][row]:.2f}" for r in runs)
        lines.append(f"| {row} | {best['rows'][row]:.2f} | {each} |")
    each = ", ".join(f"{sum(r['rows'].values()):.2f}" for r in runs)
    blas_each = ", ".join(f"{x['cpu_seconds']:.2f}" for x in blas)
    walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
    lines += [
        f"| **workers' user + system** | **{total:.2f}** | {each} |",
        f"| not the product | {total - best['rows']['product']:.2f} | |",
        f"| numpy BLAS in memory (median) | {blas_cpu:.2f} | {blas_each} |",
        "",
        f"Wall: the whole CLI {best['wall']:.2f} s (runs {walls}), in-memory BLAS "
        f"{blas_wall:.2f} s: **{blas_wall / best['wall']:.2f} of BLAS**.",
        "",
        f"Best run: {best['summary']}",
        f"  {best['line']}",
        "",
    ]
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{_cores()}"
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cores() -> int:
    return os.cpu_count() or 1


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())

"""General products against our general product and dask threads, CPU only: ``make bench-general``.

- gram: ``python -m pipeline gram X G`` (only the tiles on and above the diagonal);
- general: ``python -m pipeline multiply X X G --transpose-a`` (every tile);
- dask-threads (gram): ``(X.T @ X).to_zarr(G)`` from ``da.from_zarr``;
- xty: ``python -m pipeline multiply X Y C --transpose-a`` and dask threads' ``(X.T @ Y)``.

Runs are fresh subprocesses, round-robin, with the process tree's peak RSS sampled (see
benchmarks/cpu_peers.py); ours are timed as the whole CLI (start-up included), dask's from
graph construction to the last chunk written. Medians are reported.

    python -m benchmarks.general_products --shape 32768x4096 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_peers import RESULTS, run_sampled
from pipeline.facts.host import cpu_name

DASK = """
import sys, time, json
import dask.array as da
if __name__ == "__main__":
    left, right, out = sys.argv[1:4]
    t = time.perf_counter()
    (da.from_zarr(left).T @ da.from_zarr(right)).to_zarr(out, overwrite=True)
    print(json.dumps({"seconds": time.perf_counter() - t}))
"""
CASES = {
    "gram": ("gram", "X", None),
    "general": ("multiply", "X", "X"),
    "dask-threads": ("dask", "X", "X"),
    "xty": ("multiply", "X", "Y"),
    "xty-dask-threads": ("dask", "X", "Y"),
}
"""Case: (how, left, right); a multiply reads its left operand transposed."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="32768x4096", help="X's and Y's shape, MxN")
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--data", default="bench-data", help="scratch folder for the Zarr data")
    args = parser.parse_args(argv)
    data = Path(args.data)
    inputs = {name: make_input(data, name, args.shape, args.chunk, seed) for name, seed in
              (("X", 1), ("Y", 2))}  # fmt: skip
    cases = args.cases.split(",")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for case in cases:
            runs[case].append(run_case(case, inputs, data / f"out-{case}.zarr"))
    write_results(summarize(runs), args)
    return 0


def make_input(data: Path, name: str, shape: str, chunk: int, seed: int) -> str:
    path = data / f"{name.lower()}-{shape}-{chunk}.zarr"
    if not path.exists():  # zarr's default codec (zstd), as `random` writes it
        cmd = [sys.executable, "-m", "pipeline", "random", str(path), "--shape", shape]
        subprocess.run([*cmd, "--chunks", f"{chunk}x{chunk}", "--seed", str(seed)], check=True)
    return str(path)


def run_case(case: str, inputs: dict[str, str], out: Path) -> dict[str, Any]:
    how, left, right = CASES[case]
    shutil.rmtree(out, ignore_errors=True)
    ours = [sys.executable, "-m", "pipeline", how, inputs[left]]
    if how == "gram":
        cmd = [*ours, str(out)]
    elif how == "multiply":
        cmd = [*ours, inputs[right or left], str(out), "--transpose-a"]
    else:
        cmd = [sys.executable, "-c", DASK, inputs[left], inputs[right or left], str(out)]
    if how != "dask":
        cmd += ["--no-progress", "--dashboard-address", "127.0.0.1:0"]
    started = time.perf_counter()
    proc, peak, usage = run_sampled(cmd)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{case} failed: {proc.stderr[-2000:]}")
    lines = proc.stdout.strip().splitlines()
    seconds = json.loads(lines[-1])["seconds"] if how == "dask" else wall
    return {"seconds": seconds, "peak_bytes": peak, "cpu": usage["user"] + usage["system"],
            "summary": "" if how == "dask" else lines[-1]}  # fmt: skip


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    median = {c: statistics.median(r["seconds"] for r in rs) for c, rs in runs.items()}
    versus = {"gram": ("general", "dask-threads"), "xty": ("xty-dask-threads",)}
    rows = []
    for case, results in runs.items():
        ratios = {other: median[case] / median[other] for other in versus.get(case, ())
                  if other in median}  # fmt: skip
        rows.append({
            "case": case, "seconds": median[case],
            "runs": [round(r["seconds"], 2) for r in results],
            "peak_gib": max(r["peak_bytes"] for r in results) / 2**30,
            "cpu_seconds": statistics.median(r["cpu"] for r in results),
            "ratios": ratios, "summary": results[-1]["summary"],
        })  # fmt: skip
    return rows


def write_results(rows: list[dict[str, Any]], args: Any) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.general_products " + " ".join(sys.argv[1:])
    lines = [
        f"# General products ({args.shape} float32, {args.chunk}² zstd chunks, medians of "
        f"{args.repeats})",
        "",
        f"Command: `{command}`, {time.strftime('%Y-%m-%d %H:%M')}; CPU: {cpu_name()}.",
        "",
        "| case | median s | runs | ratio | peak tree GiB | CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = ", ".join(f"{v:.2f}x {k}" for k, v in r["ratios"].items()) or "-"
        lines.append(
            f"| {r['case']} | {r['seconds']:.2f} | {r['runs']} | {ratio} | {r['peak_gib']:.2f} "
            f"| {r['cpu_seconds']:.1f} |"
        )
    lines += ["", "Our summaries (last run):", *(f"- {r['case']}: {r['summary']}" for r in rows
                                                  if r["summary"]), ""]  # fmt: skip
    stem = f"general_products_{args.shape}"
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    (RESULTS / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())

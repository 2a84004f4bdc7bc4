"""This pipeline against its peers on the same Zarr data, CPU only: ``make bench``.

Every run is a fresh subprocess whose process tree's peak RSS is sampled. Runs alternate between
tools (round-robin) so a noisy neighbour slows all of them alike; medians are reported.

- pipeline: the whole ``python -m pipeline multiply`` (interpreter, cluster start-up included);
- dask-threads / dask-distributed: ``(a @ b).to_zarr(out)`` from ``da.from_zarr`` (timed from
  graph construction, or from cluster start for distributed, to the last chunk written);
- numpy: one in-memory ``a @ b`` of the same matrices (loading them is not timed): the limit.

    python -m benchmarks.cpu_peers --sizes 4096,8192,12288 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from pipeline.facts.host import cpu_name

RESULTS = Path(__file__).parent / "results"
TOOLS = ("pipeline", "dask-threads", "dask-distributed", "numpy")
PEER_SCRIPT = """
import sys, time, json
tool, a, b, out = sys.argv[1:5]
import numpy as np, zarr
if tool == "numpy":
    x, y = zarr.open_array(a, mode="r")[:], zarr.open_array(b, mode="r")[:]
    t = time.perf_counter(); x @ y; print(json.dumps({"seconds": time.perf_counter() - t}))
    sys.exit()
import dask, dask.array as da
if __name__ == "__main__":
    t = time.perf_counter()
    if tool == "dask-distributed":
        from distributed import Client, LocalCluster
        cluster = LocalCluster(host="127.0.0.1", dashboard_address=":0"); client = Client(cluster)
    (da.from_zarr(a) @ da.from_zarr(b)).to_zarr(out, overwrite=True)
    print(json.dumps({"seconds": time.perf_counter() - t}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4096,8192,12288", help="square sizes, comma-separated")
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--data", default="bench-data", help="scratch folder for the Zarr data")
    parser.add_argument("--name", default=None, help="results file stem")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    tools = args.tools.split(",")
    data = Path(args.data)
    rows = []
    startup = measure_startup(data)
    for size in sizes:
        a, b = make_inputs(data, size, args.chunk, args.dtype)
        runs: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
        for _ in range(args.repeats):
            for tool in tools:
                runs[tool].append(run_tool(tool, a, b, data / f"out-{tool}.zarr"))
        rows.extend(summarize(size, args.dtype, runs))
    stem = args.name or f"cpu_peers_{args.dtype}"
    write_results(stem, rows, startup, args)
    return 0


def make_inputs(data: Path, size: int, chunk: int, dtype: str) -> tuple[str, str]:
    paths = []
    for name, seed in (("a", 1), ("b", 2)):
        path = data / f"{name}-{size}-{chunk}-{dtype}.zarr"
        if not path.exists():
            subprocess.run([sys.executable, "-m", "pipeline", "random", str(path), "--shape",
                            f"{size}x{size}", "--chunks", f"{chunk}x{chunk}", "--dtype", dtype,
                            "--seed", str(seed)], check=True)  # fmt: skip
        paths.append(str(path))
    return paths[0], paths[1]


def run_tool(tool: str, a: str, b: str, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    if tool == "pipeline":
        cmd = [sys.executable, "-m", "pipeline", "multiply", a, b, str(out), "--no-progress",
               "--dashboard-address", "127.0.0.1:0"]  # fmt: skip
    else:
        cmd = [sys.executable, "-c", PEER_SCRIPT, tool, a, b, str(out)]
    started = time.perf_counter()
    proc, peak, usage = run_sampled(cmd)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed: {proc.stderr[-2000:]}")
    seconds = (
        wall if tool == "pipeline" else json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
    )
    result = {"seconds": seconds, "wall": wall, "peak_bytes": peak, **usage}
    result["cpu_seconds"] = usage["user"] + usage["system"]
    if tool == "pipeline":
        lines = proc.stdout.strip().splitlines()
        result["summary"] = lines[-1]
        result["accounting"] = next((x for x in lines if x.startswith("time:")), "")
    return result


def run_sampled(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str], int, dict[str, float]]:
    """Run cmd; sample the RSS of its whole process tree every 50 ms. Returns the process, its
    peak tree RSS and the tree's user and system seconds and minor page faults."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(_rss(p) for p in tree))
            except psutil.Error:
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    stdout, stderr = proc.communicate()
    thread.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    usage = {
        name: float(getattr(after, field) - getattr(before, field))
        for name, field in (("user", "ru_utime"), ("system", "ru_stime"), ("faults", "ru_minflt"))
    }
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), peak[0], usage


def _rss(p: psutil.Process) -> int:
    try:
        return int(p.memory_info().rss)
    except psutil.Error:
        return 0


def measure_startup(data: Path) -> float:
    """Median wall time of the whole CLI on a 64x64 product: start-up dominates it."""
    a, b = make_inputs(data, 64, 64, "float32")
    return statistics.median(run_tool("pipeline", a, b, data / "out-startup.zarr")["wall"]
                             for _ in range(3))  # fmt: skip


def summarize(size: int, dtype: str, runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    flops = 2 * size**3
    base = statistics.median(r["seconds"] for r in runs["numpy"]) if "numpy" in runs else None
    threads = (
        statistics.median(r["seconds"] for r in runs["dask-threads"])
        if "dask-threads" in runs
        else None
    )
    rows = []
    for tool, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        rows.append({
            "size": size, "dtype": dtype, "tool": tool, "seconds": seconds,
            "runs": [round(r["seconds"], 3) for r in results],
            "gflops": flops / seconds / 1e9,
            "speed_vs_numpy": base / seconds if base else None,
            "time_vs_dask_threads": seconds / threads if threads else None,
            "peak_gib": max(r["peak_bytes"] for r in results) / 2**30,
            "cpu_seconds": statistics.median(r["cpu_seconds"] for r in results),
            "user_seconds": statistics.median(r["user"] for r in results),
            "system_seconds": statistics.median(r["system"] for r in results),
            "page_faults": statistics.median(r["faults"] for r in results),
            "summary": results[-1].get("summary", ""),
            "accounting": results[-1].get("accounting", ""),
        })  # fmt: skip
    return rows


def write_results(stem: str, rows: list[dict[str, Any]], startup: float, args: Any) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.cpu_peers " + " ".join(sys.argv[1:])
    lines = [
        f"# CPU peers ({args.dtype}, chunks {args.chunk}, medians of {args.repeats})",
        "",
        f"Command: `{command}` on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}.",
        f"Start-up (whole CLI on a 64x64 product): {startup:.2f} s.",
        "",
        "| size | tool | median s | runs | GFLOP/s | speed vs numpy | time vs dask threads "
        "| peak tree GiB | user s | system s | minor faults |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['tool']} | {r['seconds']:.2f} | {r['runs']} | {r['gflops']:.1f} "
            f"| {_fmt(r['speed_vs_numpy'])} | {_fmt(r['time_vs_dask_threads'])} "
            f"| {r['peak_gib']:.2f} | {r['user_seconds']:.1f} | {r['system_seconds']:.2f} "
            f"| {r['page_faults']:.0f} |"
        )
    summaries = [
        f"- {r['size']}: {r['summary']}\n  {r['accounting']}"
        for r in rows
        if r["tool"] == "pipeline"
    ]
    lines += [
        "",
        "user s, system s, minor faults: the whole run's process tree (medians), loading and "
        "start-up included (numpy's loading is not in its time but is in its CPU). "
        f"CPU: {cpu_name()}.",
        "",
        "Pipeline summaries (last run):",
        *summaries,
        "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    (RESULTS / f"{stem}.json").write_text(json.dumps({"startup": startup, "rows": rows}, indent=1))
    plot(stem, rows)
    print("\n".join(lines))


def plot(stem: str, rows: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for tool in dict.fromkeys(r["tool"] for r in rows):
        pts = [(r["size"], r["gflops"]) for r in rows if r["tool"] == tool]
        ax.plot(*zip(*pts, strict=True), marker="o", label=tool)
    ax.set_xlabel("matrix size (n for n x n)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"Zarr -> Zarr matmul, {rows[0]['dtype']}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    sys.exit(main())

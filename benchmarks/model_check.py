"""The plan's modelled seconds against the clock, on a fixed set of cases.

    python -m benchmarks.model_check [--repeats 3] [--data bench-data/model] [--cases a,b]

Each case's inputs are written once (zstd, float32, seeded) under ``--data``; sharded-64's in
1024² shards of 64² chunks. The model is the
dry run's text (``--dry-run``: the constants of pipeline/plan/fitted_costs.py); each run is
the CLI, ``python -m pipeline multiply A B OUT --overwrite``, in a fresh process with its own
local cluster. Printed per case, medians over the runs: the dry run's estimate (of the whole
command, the interpreter and the local cluster included), the whole CLI's wall seconds, the
job's (the summary line's: no interpreter), and per
resource the modelled and the measured thread-seconds (the job's ``time:`` line: product;
decode = fetching and decoding the inputs; write = encoding and storing OUT), then the
resource each names as the largest, and the load average when the runs started. Measured
thread-seconds are wall time in each thread, so they grow when more threads than cores are
busy (a task reads its next panels in two threads while it multiplies) and when other work
loads the machine; the workers' CPU seconds (user + system) against the model's sum of
thread-seconds do not. So each resource's CPU-seconds (the ``time:`` line's CPU-seconds by
kind: product; decode + our copies; our write side + zarr's threads) are printed too, with the
resource that spent the most: the demand on the cores, which waiting does not inflate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from benchmarks import byte_compile
from pipeline.generate import write_random

RESOURCES = ("product", "decode", "write")
CPU_KINDS = {"product": ("product",), "decode": ("decode", "copy"), "write": ("write", "zarr")}
"""The run's CPU-seconds by kind (pipeline.cputime) per resource: our copies are the reads'
(blocks of small chunks copied into panels); zarr's threads encode and store OUT."""


@dataclass(frozen=True)
class Case:
    name: str
    a: tuple[tuple[int, int], tuple[int, int]]  # shape, chunks
    b: tuple[tuple[int, int], tuple[int, int]]
    note: str
    shards: tuple[int, int] | None = None
    """Both inputs' chunks stored in shards of this shape (written through zarr)."""
    workers: int | None = None
    """Local worker processes (--workers, in the dry run and the run; None: the default one)."""

    @property
    def flags(self) -> list[str]:
        return ["--workers", str(self.workers)] if self.workers else []


CASES = (
    Case("square-2048", ((8192, 8192), (2048, 2048)), ((8192, 8192), (2048, 2048)), "8192²"),
    Case("chunks-1024", ((4096, 4096), (1024, 1024)), ((4096, 4096), (1024, 1024)), "4096²"),
    Case("chunks-256", ((4096, 4096), (256, 256)), ((4096, 4096), (256, 256)), "4096²"),
    Case("chunks-64", ((4096, 4096), (64, 64)), ((4096, 4096), (64, 64)), "4096²"),
    Case("tall-skinny", ((100000, 32), (10000, 32)), ((32, 2000), (32, 1000)), "100000x32"),
    Case("short-fat", ((2000, 65536), (1000, 4096)), ((65536, 2000), (4096, 1000)), "K 65536"),
    Case("prime", ((4096, 4096), (997, 1009)), ((4096, 4096), (1013, 991)), "4096², prime chunks"),
    Case("sharded-64", ((4096, 4096), (64, 64)), ((4096, 4096), (64, 64)), "4096², 64² chunks",
         (1024, 1024)),  # in 1024² shards
    # Two worker processes of one thread each: the model's share of the tasks per worker.
    Case("square-2048-w2", ((8192, 8192), (2048, 2048)), ((8192, 8192), (2048, 2048)),
         "8192², 2 workers", workers=2),
    Case("chunks-256-w2", ((4096, 4096), (256, 256)), ((4096, 4096), (256, 256)),
         "4096², 2 workers", workers=2),
    Case("tall-skinny-w2", ((100000, 32), (10000, 32)), ((32, 2000), (32, 1000)),
         "100000x32, 2 workers", workers=2),
)  # fmt: skip


def inputs(case: Case, data: Path) -> tuple[str, str]:
    urls = []
    stem = case.name.removesuffix(f"-w{case.workers}")  # the same data on more workers
    for name, (shape, chunks), seed in (("a", case.a, 1), ("b", case.b, 2)):
        url = data / f"{stem}-{name}.zarr"
        if (url / "zarr.json").exists():
            pass
        elif case.shards is None:
            write_random(str(url), shape, chunks, "float32", seed, overwrite=True)
        else:  # `pipeline random` writes no shards
            values = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
            zarr.create_array(str(url), data=values, chunks=chunks, shards=case.shards)
        urls.append(str(url))
    return urls[0], urls[1]


def modelled(a: str, b: str, out: str, flags: list[str]) -> dict[str, Any]:
    """The dry run's figures, read from its text (so an older checkout, on PYTHONPATH, can be
    measured the same way): the estimated time, and the terms grouped as the run measures them
    (product; decode = read + decode; write = encode + write)."""
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "multiply", a, b, out, "--overwrite", "--dry-run",
         *flags],
        capture_output=True, text=True, check=True, cwd=Path(a).parent,
    )  # fmt: skip
    text = done.stdout
    found = re.search(r"^modelled seconds\s+(.*?) \(", text, re.M)
    terms = {k: float(v) for k, v in re.findall(r"([\w-]+) ([0-9.]+)", found.group(1))}  # type: ignore[union-attr]
    grouped = {
        "product": terms.get("product", 0.0),
        "decode": terms.get("read", 0.0) + terms.get("decode", 0.0),
        "write": terms.get("encode", 0.0) + terms.get("write", 0.0),
    }
    return {
        "job": estimated_seconds(text),
        "cpu": sum(grouped.values()),
        **grouped,
        "bound": re.search(r"^bound by: (\S+)", text, re.M).group(1),  # type: ignore[union-attr]
        "out_chunks": re.search(r"^output chunks\s+(\S+)", text, re.M).group(1),  # type: ignore[union-attr]
    }


def estimated_seconds(text: str) -> float:
    """The dry run's estimate in seconds: ``4 min 12 s (252.0 s) on ...`` or ``38.2 s on``."""
    line = re.search(r"^estimated time\s+(.*)$", text, re.M).group(1)  # type: ignore[union-attr]
    exact = re.search(r"\(([0-9.]+) s\)", line) or re.match(r"([0-9.]+) s\b", line)
    return float(exact.group(1))  # type: ignore[union-attr]


def measured(a: str, b: str, out: str, flags: list[str]) -> dict[str, float]:
    load = os.getloadavg()[0]  # other work on the machine: the figures are noisy above ~2
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "multiply", a, b, out, "--overwrite", "--no-progress",
         *flags],
        capture_output=True, text=True, check=True, cwd=Path(a).parent,
    )  # fmt: skip
    wall = time.perf_counter() - start
    text = done.stdout + done.stderr
    job = float(re.search(r"in ([0-9.]+) s \(", text).group(1))  # type: ignore[union-attr]
    phases = dict(re.findall(r"(\w+) ([0-9.]+)", text.split("thread-seconds", 1)[1].split(";")[0]))
    times = {k: float(v) for k, v in phases.items()}
    cpu = re.search(r"user ([0-9.]+) s, system ([0-9.]+) s", text)
    found = re.search(r"CPU-seconds by kind: (.*)", text)
    split = found.group(1) if found else ""
    kinds = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)", split)}
    return {
        **{f"cpu_{r}": sum(kinds.get(k, 0.0) for k in CPU_KINDS[r]) for r in RESOURCES},
        "cli": wall,
        "job": job,
        "product": times["product"],
        "decode": times["decode"] + times.get("read", 0.0),
        "write": times["write"],
        "cpu": float(cpu.group(1)) + float(cpu.group(2)) if cpu else float("nan"),
        "load": load,
    }


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    names = [x.split(":", 1)[1].strip() for x in out.splitlines() if "Model name" in x]
    return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} cores"


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| case | OUT chunks | modelled s | CLI s | CLI / modelled | job s | "
        + " | ".join(f"{r} model / measured" for r in RESOURCES)
        + " | largest model / measured | CPU-s by resource | largest by CPU-s"
        + " | CPU s model / measured | load |"
    )
    lines = [head, "|" + "---|" * (6 + len(RESOURCES) + 5)]
    for row in rows:
        m, got = row["model"], row["measured"]
        largest = max(RESOURCES, key=lambda r: got[r])
        by_cpu = max(RESOURCES, key=lambda r: got.get(f"cpu_{r}", 0.0))
        cpu_split = " ".join(f"{got.get(f'cpu_{r}', float('nan')):.2f}" for r in RESOURCES)
        per = " | ".join(f"{m[r]:.2f} / {got[r]:.2f}" for r in RESOURCES)
        lines.append(
            f"| {row['case']} | {m['out_chunks']} | {m['job']:.2f} | {got['cli']:.2f}"
            f" | {got['cli'] / m['job']:.2f} | {got['job']:.2f} | {per}"
            f" | {m['bound']} / {largest} | {cpu_split} | {by_cpu}"
            f" | {m['cpu']:.2f} / {got['cpu']:.2f}"
            f" | {got['load']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    byte_compile()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default="bench-data/model")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    data = Path(args.data).resolve()  # runs start in it: no checkout on sys.path by cwd
    data.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in (c for c in CASES if c.name in args.cases.split(",")):
        a, b = inputs(case, data)
        out = str(data / f"{case.name}-c.zarr")
        model = modelled(a, b, out, case.flags)
        runs = [measured(a, b, out, case.flags) for _ in range(args.repeats)]
        rows.append({"case": case.name, "note": case.note, "model": model, "measured": median(runs),
                     "runs": runs})  # fmt: skip
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\n{cpu_model()}; medians of {args.repeats}; PYTHONPATH="
          f"{os.environ.get('PYTHONPATH', '')}\n")  # fmt: skip
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()

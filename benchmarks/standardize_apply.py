"""What standardizing a panel as it is read costs (pipeline.plan.standardize.Standardize.apply),
against the one-expression way, with and without a missing values' policy, medians in one run.

    python -m benchmarks.standardize_apply [--rows 8192] [--cols 1024] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.plan.standardize import Standardize


def one_expression(block: Any, shift: Any, scale: Any) -> None:
    """The plain way, in the same float64 slabs: (x - shift) * scale, a temporary per step."""
    step = max(2**20 // block.shape[1], 1)
    for r0 in range(0, block.shape[0], step):
        r1 = min(r0 + step, block.shape[0])
        block[r0:r1] = (block[r0:r1].astype(np.float64) - shift) * scale


def median_seconds(run: Callable[[Any], None], x: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        block = x.copy()
        started = time.perf_counter()
        run(block)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = (280 + rng.standard_normal((args.rows, args.cols))).astype(np.float32)
    shift, scale = np.full(args.cols, 280.0), np.full(args.cols, 0.01)
    plain = replace(Standardize("center", 1), shift=shift, scale=scale)
    imputing = replace(plain, missing="impute")
    holed = x.copy()
    holed[rng.random(x.shape) < 0.01] = np.nan
    runs = {
        "one expression": (lambda b: one_expression(b, shift, scale), x),
        "apply": (lambda b: plain.apply(b, (0, args.rows), (0, args.cols)), x),
        "apply, --missing impute, none missing": (
            lambda b: imputing.apply(b, (0, args.rows), (0, args.cols)),
            x,
        ),
        "apply, --missing impute, 1 % missing": (
            lambda b: imputing.apply(b, (0, args.rows), (0, args.cols)),
            holed,
        ),
    }
    found = {name: median_seconds(run, data, args.repeats) for name, (run, data) in runs.items()}
    base = found["one expression"]
    print(f"{args.rows}x{args.cols} float32, median of {args.repeats}:")
    for name, seconds in found.items():
        print(f"  {name:40s} {seconds * 1e3:8.1f} ms  {seconds / base:5.2f}x")


if __name__ == "__main__":
    main()

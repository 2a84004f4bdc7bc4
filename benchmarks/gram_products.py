"""Integer and standardized Gram products against float32 twins and peers: ``make bench-gram``.

- int8 into int32 (``gram X G --dtype int32``; exact, through float BLAS in K blocks) against
  the float32 Gram of the same values and dask threads' ``(x.T @ x).to_zarr(G)``, on genotype
  dosages 0/1/2 (``geno``) and on full-range int8 (``wide_i8``: K blocks of 1023);
- int16 into int64 (float64 BLAS) against the float32 twin: small values (``i16``, 0..1000)
  and full range (``i16_full``);
- ``gram --center`` and ``--scale`` (one more pass over X, for the means) against the plain
  Gram of the same float32 temperatures (``kelvin``) and numpy's in-memory ``np.cov`` and
  ``np.corrcoef``;
- accuracy, not timed: integer Grams bit for bit against numpy's int64 product, the
  covariance and correlation against float64 numpy's, beside float32 numpy's own error.

Each sample is a fresh subprocess, cases round-robin; ours are timed as the whole CLI
(start-up included), dask's from graph construction to the last chunk written (killed past
``--dask-timeout``, and not run again), numpy's as the one call (loading X not timed).
Medians are reported.

    python -m benchmarks.gram_products --shape 16384x1536 --chunk 2048x512 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from numpy.typing import NDArray

from benchmarks import byte_compile
from benchmarks.cpu_peers import RESULTS
from pipeline.facts.host import cpu_name

PEER_SCRIPT = """
import sys, time, json
how, path, out, dtype = sys.argv[1:5]
import numpy as np, zarr
if how in ("cov", "corrcoef"):
    x = zarr.open_array(path, mode="r")[:]
    f = np.cov if how == "cov" else np.corrcoef
    t = time.perf_counter(); f(x, rowvar=False); t = time.perf_counter() - t
    print(json.dumps({"seconds": t}))
    sys.exit()
import dask.array as da
if __name__ == "__main__":
    t = time.perf_counter()
    x = da.from_zarr(path)
    x = x.astype(dtype) if dtype != "-" else x
    (x.T @ x).to_zarr(out, overwrite=True)
    print(json.dumps({"seconds": time.perf_counter() - t}))
"""


@dataclass(frozen=True)
class Case:
    """One timed command."""

    group: str
    how: str
    """ours: ``python -m pipeline gram``; dask: dask threads; cov, corrcoef: numpy in memory."""
    data: str
    """The input's name (INPUTS)."""
    flags: tuple[str, ...] = ()
    """ours: gram's options; dask: the dtype X is cast to first (the product's own)."""
    peers: tuple[str, ...] = ()
    """Cases this one's median is divided by."""
    target: float | None = None
    """The most this case's median may be, as a multiple of its first peer's."""


def _int_group(group: str, data: str, dtype: str, target: float, dask: bool) -> dict[str, Case]:
    twin = f"{data}_f32"
    cases = {
        f"{data}-{dtype}": Case(group, "ours", data, ("--dtype", dtype),
                                (twin, f"{data}-dask")[: 2 if dask else 1], target),
        twin: Case(group, "ours", twin, (), (f"{twin}-dask",) if dask else ()),
    }  # fmt: skip
    if dask:
        cases[f"{data}-dask"] = Case(group, "dask", data, (dtype,))
        cases[f"{twin}-dask"] = Case(group, "dask", twin)
    return cases


INPUTS = ("geno", "wide_i8", "i16", "i16_full", "kelvin")
"""The integer inputs and kelvin; each integer one has a float32 twin, ``NAME_f32``."""
INF = float("inf")
INT8 = "int8 into int32"
INT16 = "int16 into int64"
STANDARD = "covariance and correlation (float32)"
CASES: dict[str, Case] = {
    **_int_group(INT8, "geno", "int32", 1.3, dask=True),
    **_int_group(INT8, "wide_i8", "int32", 1.3, dask=True),
    **_int_group(INT16, "i16", "int64", 1.5, dask=False),
    **_int_group(INT16, "i16_full", "int64", 1.5, dask=False),
    "kelvin-center": Case(STANDARD, "ours", "kelvin", ("--center",), ("kelvin", "np.cov"), 1.3),
    "kelvin-scale": Case(STANDARD, "ours", "kelvin", ("--scale",), ("kelvin", "np.corrcoef"), 1.3),
    "kelvin": Case(STANDARD, "ours", "kelvin"),
    "np.cov": Case(STANDARD, "cov", "kelvin"),
    "np.corrcoef": Case(STANDARD, "corrcoef", "kelvin"),
}


def make_values(name: str, shape: tuple[int, int], rng: np.random.Generator) -> NDArray[Any]:
    """The input ``name``'s values (a ``_f32`` name: its integer twin's, as float32)."""
    if name.endswith("_f32"):
        return make_values(name.removesuffix("_f32"), shape, rng).astype(np.float32)
    m, n = shape
    if name == "geno":  # dosages: one allele frequency per column (variant)
        return rng.binomial(2, rng.uniform(0.05, 0.95, size=n), size=shape).astype(np.int8)
    if name == "wide_i8":
        return rng.integers(-128, 127, size=shape, dtype=np.int8, endpoint=True)
    if name == "i16":
        return rng.integers(0, 1000, size=shape, dtype=np.int16, endpoint=True)
    if name == "i16_full":
        return rng.integers(-32768, 32767, size=shape, dtype=np.int16, endpoint=True)
    if name == "kelvin":  # 280 K, 3 K per element, plus a common term per row
        common = rng.standard_normal((m, 1))
        return (280.0 + 3.0 * rng.standard_normal(shape) + common).astype(np.float32)
    raise ValueError(f"no input named {name!r}")


def make_input(data: Path, name: str, shape: tuple[int, int], chunk: tuple[int, int]) -> str:
    """Write input ``name`` once (zarr's default codec); the same seed for a twin and its
    integer input, so their values match."""
    path = data / f"{name}-{shape[0]}x{shape[1]}-{chunk[0]}x{chunk[1]}.zarr"
    if not path.exists():
        seed = sorted(INPUTS).index(name.removesuffix("_f32"))
        values = make_values(name, shape, np.random.default_rng(seed))
        partial = path.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        array = zarr.create_array(
            str(partial), shape=shape, chunks=chunk, dtype=values.dtype, zarr_format=3
        )
        array[:] = values
        partial.rename(path)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="16384x1536", help="X's shape, MxN (G is NxN)")
    parser.add_argument("--chunk", default="2048x512", help="X's chunks, RxC (or one side)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated")
    parser.add_argument("--dask-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--data", default="bench-data/gram", help="scratch folder for the data")
    args = parser.parse_args(argv)
    shape, chunk = _pair(args.shape), _pair(args.chunk)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown --cases {unknown}; choose from {', '.join(CASES)}")
    byte_compile()
    data = Path(args.data)
    paths = {CASES[c].data: make_input(data, CASES[c].data, shape, chunk) for c in cases}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for case in cases:
            if not any(r["timed_out"] for r in runs[case]):  # a timed-out case: once
                out = data / f"out-{case}.zarr"
                runs[case].append(run_case(CASES[case], paths, out, args.dask_timeout))
    accuracy = check_accuracy(cases, paths, data)
    write_results(runs, accuracy, args)
    return 0


def _pair(text: str) -> tuple[int, int]:
    sides = [int(s) for s in text.lower().split("x")]
    return (sides[0], sides[-1])


def case_command(case: Case, paths: dict[str, str], out: Path) -> list[str]:
    if case.how == "ours":
        return [sys.executable, "-m", "pipeline", "gram", paths[case.data], str(out),
                *case.flags, "--no-progress", "--dashboard-address", "127.0.0.1:0",
                "--overwrite"]  # fmt: skip
    dtype = case.flags[0] if case.flags else "-"
    return [sys.executable, "-c", PEER_SCRIPT, case.how, paths[case.data], str(out), dtype]


def run_case(case: Case, paths: dict[str, str], out: Path, timeout: float) -> dict[str, Any]:
    """One fresh subprocess; a dask one killed (its process group) past ``timeout``."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    cmd = case_command(case, paths, out)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout if case.how == "dask" else None)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        shutil.rmtree(out, ignore_errors=True)
        return {"seconds": None, "timed_out": True, "wall": time.perf_counter() - started}
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed: {stderr[-2000:]}")
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    ours = case.how == "ours"
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"seconds": wall if ours else json.loads(last)["seconds"], "timed_out": False,
            "wall": wall, "cpu_seconds": cpu, "summary": last if ours else ""}  # fmt: skip


def median(samples: list[dict[str, Any]]) -> float:
    """The median seconds; a timed-out sample counts as infinitely long."""
    return statistics.median(INF if r["timed_out"] else r["seconds"] for r in samples)


def exact_int64(x: NDArray[Any]) -> NDArray[np.int64]:
    """numpy's int64 product xᵀx, from float64 BLAS: exact, as every sum is below 2**53."""
    top = int(np.abs(x.astype(np.int64)).max())
    if x.shape[0] * top * top >= 2**53:
        raise ValueError("sums may reach 2**53: float64 is not exact here")
    x64 = x.astype(np.float64)
    return (x64.T @ x64).astype(np.int64)


STANDARD_PEERS: dict[str, Callable[..., NDArray[Any]]] = {
    "--center": np.cov,
    "--scale": np.corrcoef,
}


def _load(path: str) -> NDArray[Any]:
    return np.asarray(zarr.open_array(path, mode="r")[:])


def relative_error(g: NDArray[Any], exact: NDArray[np.float64]) -> float:
    return float(np.abs(g.astype(np.float64) - exact).max() / np.abs(exact).max())


def check_accuracy(cases: list[str], paths: dict[str, str], data: Path) -> list[dict[str, Any]]:
    """Each integer Gram against numpy's int64 product; the covariance and correlation
    against float64 numpy's, beside float32 numpy's error (target: ours <= 2x it)."""
    rows: list[dict[str, Any]] = []
    for case in cases:
        spec = CASES[case]
        if spec.how != "ours" or not spec.flags:  # the float32 twins and plain kelvin
            continue
        g, x = _load(str(data / f"out-{case}.zarr")), _load(paths[spec.data])
        if spec.flags[0] == "--dtype":
            same = g.dtype == np.dtype(spec.flags[1]) and np.array_equal(g, exact_int64(x))
            rows.append({"case": case, "check": f"bit-identical to int64 xᵀx, {g.dtype}",
                         "met": bool(same)})  # fmt: skip
            continue
        f: Callable[..., NDArray[Any]] = STANDARD_PEERS[spec.flags[0]]
        exact = f(x.astype(np.float64), rowvar=False)
        ours = relative_error(g, exact)
        numpy32 = relative_error(f(x, rowvar=False, dtype=np.float32), exact)
        name = f.__name__
        rows.append({"case": case, "check": f"max abs(G - {name}64) / max abs({name}64)",
                     "ours": ours, "numpy_float32": numpy32, "ratio": ours / numpy32,
                     "met": ours <= 2 * numpy32})  # fmt: skip
    return rows


def summarize(runs: dict[str, list[dict[str, Any]]], timeout: float) -> list[dict[str, Any]]:
    medians = {c: median(rs) for c, rs in runs.items()}
    rows = []
    for case, samples in runs.items():
        spec = CASES[case]
        peers = [p for p in spec.peers if p in medians]
        ratios = {p: _ratio(medians[case], medians[p], timeout) for p in peers}
        first = ratios[spec.peers[0]]["value"] if spec.peers and spec.peers[0] in ratios else None
        met = None if spec.target is None or first is None else first <= spec.target
        rows.append({
            "case": case, "group": spec.group, "command": _shown(spec), "median": medians[case],
            "ratios": ratios, "target": spec.target if first is not None else None, "met": met,
            "samples": samples,
        })  # fmt: skip
    return rows


def _shown(spec: Case) -> str:
    if spec.how == "ours":
        return " ".join(["gram", spec.data, *spec.flags])
    if spec.how == "dask":
        cast = f".astype({spec.flags[0]})" if spec.flags else ""
        return f"dask: x = from_zarr({spec.data}){cast}; (x.T @ x).to_zarr"
    return f"np.{spec.how}({spec.data}, rowvar=False), in memory"


def _seconds(value: float, timeout: float) -> str:
    return f"> {timeout:g}" if value == INF else f"{value:.2f}"


def _ratio(mine: float, peer: float, timeout: float) -> dict[str, Any]:
    """mine / peer; a timed-out peer's is a bound: below mine / timeout."""
    if peer == INF:
        return {"value": mine / timeout, "bound": "< "}
    return {"value": mine / peer, "bound": ""}


def table(rows: list[dict[str, Any]], group: str, timeout: float) -> list[str]:
    lines = [f"## {group}", "", "| case | command | median s | runs | ratio vs peer | target "
             "| met? |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["group"] != group:
            continue
        runs = ", ".join(f"> {timeout:g}" if x["timed_out"] else f"{x['seconds']:.2f}"
                         for x in r["samples"])  # fmt: skip
        ratio = ", ".join(f"{v['bound']}{v['value']:.3g}x {k}" for k, v in r["ratios"].items())
        target = "-" if r["target"] is None else f"<= {r['target']}"
        met = {None: "-", True: "yes", False: "**no**"}[r["met"]]
        lines.append(f"| {r['case']} | `{r['command']}` | {_seconds(r['median'], timeout)} "
                     f"| {runs} | {ratio or '-'} | {target} | {met} |")  # fmt: skip
    return [*lines, ""]


def accuracy_table(accuracy: list[dict[str, Any]]) -> list[str]:
    lines = ["## Accuracy (not timed; the last run's G)", "",
             "| case | check | ours | numpy float32 | ours / numpy's | met? |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for a in accuracy:
        met = "yes" if a["met"] else "**no**"
        if "ours" in a:
            numbers = f"{a['ours']:.2e} | {a['numpy_float32']:.2e} | {a['ratio']:.2f} (<= 2)"
            lines.append(f"| {a['case']} | {a['check']} | {numbers} | {met} |")
        else:
            lines.append(f"| {a['case']} | {a['check']} | - | - | - | {met} |")
    return [*lines, ""]


NOTES = [
    "Ours: the whole `python -m pipeline gram X G ... --no-progress --dashboard-address "
    "127.0.0.1:0 --overwrite` (interpreter and cluster start-up included). Dask: threads, from "
    "graph construction to the last chunk written; int8 X is cast to int32 first (G's dtype: "
    "int8 @ int8 would overflow int8), so its product runs numpy's integer loops, not BLAS. "
    "np.cov / np.corrcoef: only the call, in a fresh subprocess, X loaded with zarr first (not "
    "timed); both compute in float64 (their default dtype) and write nothing. A dask case that "
    "runs past --dask-timeout is killed, shown as > N s (ratios against it as bounds), and not "
    "run again.",
    "Accuracy: numpy's int64 product is computed as float64 BLAS on the values, exact here "
    "since every sum is below 2**53 (checked); cov64/corrcoef64 are np.cov/np.corrcoef of X "
    "in float64, numpy float32's are np.cov(x, rowvar=False, dtype=np.float32) and likewise.",
]


def write_results(
    runs: dict[str, list[dict[str, Any]]], accuracy: list[dict[str, Any]], args: Any
) -> None:
    rows = summarize(runs, args.dask_timeout)
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.gram_products " + " ".join(sys.argv[1:])
    cores = f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable)"
    coretype = os.environ.get("OPENBLAS_CORETYPE", "unset")
    lines = [
        f"# Gram products ({args.shape}, {args.chunk} chunks, zarr's default codec, medians of "
        f"{args.repeats})",
        "",
        f"Command: `{command}`, {time.strftime('%Y-%m-%d %H:%M')}; CPU: {cpu_name()}, {cores}; "
        f"OPENBLAS_CORETYPE: {coretype}; dask timeout {args.dask_timeout:g} s.",
        "",
    ]
    for group in dict.fromkeys(r["group"] for r in rows):
        lines += table(rows, group, args.dask_timeout)
    lines += accuracy_table(accuracy) if accuracy else []
    lines += [*(f"{n}\n" for n in NOTES), "Our summaries (last run):"]
    lines += [f"- {r['case']}: {r['samples'][-1].get('summary', '')}" for r in rows
              if r["samples"] and r["samples"][-1].get("summary")]  # fmt: skip
    (RESULTS / "gram_products.md").write_text("\n".join([*lines, ""]))
    record = {"command": command, "shape": args.shape, "chunk": args.chunk, "cpu": cpu_name(),
              "cores": os.cpu_count(), "openblas_coretype": coretype,
              "dask_timeout": args.dask_timeout, "accuracy": accuracy,
              "cases": [{**r, "median": None if r["median"] == INF else r["median"]}
                        for r in rows]}  # fmt: skip
    (RESULTS / "gram_products.json").write_text(json.dumps(record, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())

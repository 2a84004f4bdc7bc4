"""``pipeline.pca`` (randomized PCA by passes over a stored X) against reading X and its peers,
ratios measured in one run on the same data, medians of repeats.

- (a) the whole ``pca`` (K, P, Q given) against (2Q + 2) reads of X on the SAME client: one
  read is one task per chunk of X (the array opened with zarr, the chunk read, decoded and
  summed), all of them submitted at once to the cluster's threads; target pca <= 1.3x. A
  tighter floor beside it: the chunk files zstd-decoded with numcodecs, no zarr (zarr's read
  path costs more than the pipeline's own, so against zarr reads the ratio flatters pca);
- (b) ``dask.array.linalg.svd_compressed`` (threads scheduler, ``compute=True``,
  ``iterator="QR"``: the default "power" overflows float32 at Q = 4; the same k,
  ``n_oversamples=P``, ``n_power_iter=Q``) on ``from_zarr(X) - mean`` (the mean computed first,
  timed), and scikit-learn's ``PCA(svd_solver="randomized", iterated_power=Q,
  n_oversamples=P)`` timed as zarr read + fit and as the fit alone; target: pca faster than
  both. Each peer is a fresh subprocess, round-robin with ours; the singular values of the
  three are compared (accuracy, not timed);
- (c) a bigger X on a worker whose ``memory_limit`` is well below X's size: ``pipeline.pca(...,
  memory_limit=L)`` on a LocalCluster with that limit against ``svd_compressed`` on a
  LocalCluster with the same limit, each a fresh subprocess whose worker processes' peak RSS
  is sampled with psutil every 50 ms; a run past ``--big-timeout`` is killed and reported with
  the peak it reached.

Our cluster: LocalCluster(n_workers=1, threads_per_worker=2, processes=True), started once and
not timed; ``pca``'s per-step times come from its ``step i/N`` log lines' timestamps.

    python -m benchmarks.pca_speed --shape 131072x2048 --chunk 4096x1024 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from benchmarks import byte_compile
from benchmarks.cpu_peers import RESULTS
from pipeline.facts.host import cpu_name

K, P = 10, 10
SIGNAL_RANK = 12
"""X is a rank-12 signal (scales 20 * 0.8^j per element) plus unit noise, around 280."""

PEER_SCRIPT = r"""
import sys, time, json, threading
how, path, k, p, q, limit, out = sys.argv[1:8]
k, p, q = int(k), int(p), int(q)
import numpy as np, zarr, psutil

peak = {"rss": 0}
def sample(stop):
    me = psutil.Process()
    last = 0.0
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:
                peak["rss"] = max(peak["rss"], child.memory_info().rss)
            except psutil.Error:
                pass
        if time.monotonic() - last > 0.5:
            print(json.dumps({"peak": peak["rss"]}), flush=True); last = time.monotonic()
        time.sleep(0.05)

if how == "sklearn":
    from sklearn.decomposition import PCA
    t0 = time.perf_counter(); x = zarr.open_array(path, mode="r")[:]; t1 = time.perf_counter()
    model = PCA(n_components=k, svd_solver="randomized", iterated_power=q, n_oversamples=p,
                random_state=0).fit(x)
    t2 = time.perf_counter()
    print(json.dumps({"seconds": t2 - t0, "load": t1 - t0, "fit": t2 - t1,
                      "s": model.singular_values_.tolist()}))
    sys.exit()

if __name__ == "__main__":
    import dask, dask.array as da
    stop = threading.Event()
    cluster = client = None
    if how in ("dask-cluster", "pca-cluster"):
        from distributed import Client, LocalCluster
        cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                               memory_limit=limit, dashboard_address=None)
        client = Client(cluster)
        threading.Thread(target=sample, args=(stop,), daemon=True).start()
    else:
        dask.config.set(scheduler="threads")
    outcome, s = "finished", None
    t0 = time.perf_counter()
    try:
        if how == "pca-cluster":
            import pipeline
            r = pipeline.pca(path, out, components=k, client=client, oversample=p,
                             power_iterations=q, seed=0, overwrite=True, memory_limit=limit)
            s = r.singular_values.tolist()
        else:
            x = da.from_zarr(path)
            mean = x.mean(axis=0, dtype="float64").compute()
            t_mean = time.perf_counter() - t0
            xc = x - mean.astype(x.dtype)
            u, sv, v = da.linalg.svd_compressed(xc, k=k, n_power_iter=q, n_oversamples=p,
                                                compute=True, seed=0, iterator="QR")
            u, sv, v = dask.compute(u, sv, v)
            s = np.asarray(sv).tolist()
            peak["mean_seconds"] = t_mean
    except Exception as e:  # KilledWorker and the like: the outcome, with the peak reached
        outcome = f"failed: {type(e).__name__}: {str(e)[:200]}"
    seconds = time.perf_counter() - t0
    stop.set()
    print(json.dumps({"seconds": seconds, "outcome": outcome, "s": s, "peak": peak["rss"],
                      "mean": peak.get("mean_seconds")}),
          flush=True)
    if client is not None:
        client.close(); cluster.close()
"""


# -- data


def make_input(data: Path, shape: tuple[int, int], chunk: tuple[int, int], seed: int) -> str:
    """X written once (zarr's default codec, zstd): a rank-12 signal with decaying scales plus
    unit Gaussian noise around 280 K, float32, written in bands of whole chunk rows."""
    path = data / f"x-{shape[0]}x{shape[1]}-{chunk[0]}x{chunk[1]}-{seed}.zarr"
    if path.exists():
        return str(path)
    rng = np.random.default_rng(seed)
    n, p = shape
    v, _ = np.linalg.qr(rng.standard_normal((p, SIGNAL_RANK)))
    loadings = (20.0 * 0.8 ** np.arange(SIGNAL_RANK))[:, None] * v.T * np.sqrt(p)
    partial = path.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    array = zarr.create_array(
        str(partial), shape=shape, chunks=chunk, dtype="float32", zarr_format=3
    )
    step = chunk[0] * max(1, 8192 // chunk[0])
    for r0 in range(0, n, step):
        r1 = min(r0 + step, n)
        z = rng.standard_normal((r1 - r0, SIGNAL_RANK))
        block = rng.standard_normal((r1 - r0, p), dtype=np.float32)
        block += (280.0 + z @ loadings).astype(np.float32)
        array[r0:r1] = block
    partial.rename(path)
    return str(path)


def stored_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# -- (a): one read of X on the client, pca with its steps


def read_chunk(url: str, r0: int, r1: int, c0: int, c1: int) -> float:
    """One chunk of X read and decoded (and summed, so it is used)."""
    return float(zarr.open_array(url, mode="r")[r0:r1, c0:c1].sum())


def decode_chunk(url: str, i: int, j: int) -> float:
    """One chunk's file read and zstd-decoded with numcodecs, no zarr (default v3 layout)."""
    import numcodecs

    with open(f"{url}/c/{i}/{j}", "rb") as f:
        raw = numcodecs.Zstd().decode(f.read())
    return float(np.frombuffer(raw, dtype=np.float32).sum())


def raw_layout(url: str) -> bool:
    """X stored as zarr v3's default: chunks at c/i/j, bytes then zstd, little-endian."""
    meta = json.loads((Path(url) / "zarr.json").read_text())
    names = [c["name"] for c in meta.get("codecs", [])]
    key = meta.get("chunk_key_encoding", {})
    return names == ["bytes", "zstd"] and key.get("configuration", {}).get("separator") == "/"


def read_x(client: Any, url: str, raw: bool = False) -> float:
    """Seconds to read every chunk of X once: one task per chunk, all submitted at once
    (``raw``: the chunk files zstd-decoded with numcodecs, no zarr)."""
    shape = zarr.open_array(url, mode="r").shape
    chunks = zarr.open_array(url, mode="r").chunks
    items = [
        (r0, min(r0 + chunks[0], shape[0]), c0, min(c0 + chunks[1], shape[1]))
        for r0 in range(0, shape[0], chunks[0])
        for c0 in range(0, shape[1], chunks[1])
    ]
    started = time.perf_counter()
    if raw:
        futures = [
            client.submit(decode_chunk, url, r0 // chunks[0], c0 // chunks[1], pure=False)
            for r0, _, c0, _ in items
        ]
    else:
        futures = [client.submit(read_chunk, url, *it, pure=False) for it in items]
    client.gather(futures)
    return time.perf_counter() - started


class StepLog(logging.Handler):
    """Timestamps of the pipeline logger's records while pca runs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.perf_counter(), record.getMessage()))


STEP = re.compile(r"step (\d+)/(\d+): (.*)")


def run_pca(
    client: Any, url: str, out: str, q: int, passes_from: str = "storage"
) -> dict[str, Any]:
    import pipeline

    handler = StepLog()
    logger = logging.getLogger("pipeline")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        started = time.perf_counter()
        result = pipeline.pca(
            url, out, components=K, client=client, oversample=P, power_iterations=q, seed=0,
            overwrite=True, passes_from=passes_from,
        )  # fmt: skip
        ended = time.perf_counter()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return {
        "seconds": ended - started,
        "s": result.singular_values.tolist(),
        "x_passes": result.x_passes,
        "steps": step_times(handler.records, started, ended),
    }


def step_times(records: list[tuple[float, str]], started: float, ended: float) -> dict[str, Any]:
    """Seconds by kind of step (from one ``step`` line to the next), setup before the first;
    a product's own time split at its ``backend:`` line (the multiply job's checks and plan
    before it, the pass after)."""
    marks = [(t, STEP.match(m)) for t, m in records]
    steps = [(t, m.group(3)) for t, m in marks if m]
    found: dict[str, Any] = {"setup": steps[0][0] - started if steps else ended - started,
                             "moments": 0.0, "sketch": 0.0, "products": [], "product_plan": [],
                             "orthonormalize": 0.0, "finish": 0.0}  # fmt: skip
    for i, (t, words) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else ended
        if words.startswith("the moments"):
            found["moments"] += end - t
        elif words.startswith("the random sketch"):
            found["sketch"] += end - t
        elif "a pass over X" in words:
            found["products"].append(end - t)
            backend = [bt for bt, m in records if t <= bt <= end and m.startswith("backend")]
            found["product_plan"].append((backend[0] - t) if backend else 0.0)
        elif "orth(" in words:
            found["orthonormalize"] += end - t
        else:
            found["finish"] += end - t
    return found


# -- peers in subprocesses


def run_peer(
    how: str, path: str, q: int, timeout: float, limit: str = "-", out: str = "-"
) -> dict[str, Any]:
    """A fresh subprocess; killed (its process group) past ``timeout``, with the last peak it
    printed."""
    cmd = [sys.executable, "-c", PEER_SCRIPT, how, path, str(K), str(P), str(q), limit, out]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
        reader.start()
        started = time.perf_counter()
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
        reader.join(5)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    parsed = [json.loads(x) for x in lines if x.startswith("{")]
    peaks = [x.get("peak", 0) for x in parsed]
    events = {
        "paused": stderr.count("Pausing worker"),
        "spilled": stderr.count("Spill") + stderr.count("spill"),
        "restarted": stderr.count("Restarting worker") + stderr.count("memory budget"),
    }
    lost = {"seconds": None, "peak": max(peaks, default=0), "wall": wall, "events": events,
            "s": None}  # fmt: skip
    if timed_out:
        return {**lost, "outcome": f"killed after {timeout:g} s (timeout)"}
    if proc.returncode != 0 or not parsed or "seconds" not in parsed[-1]:
        return {**lost, "outcome": f"exit {proc.returncode}: {stderr[-300:]!r}"}
    final = parsed[-1]
    final["peak"] = max([*peaks, final.get("peak", 0)])
    if final.get("outcome", "finished") != "finished":  # no time to compare: a failure
        final["failed_after"], final["seconds"] = final["seconds"], None
    return {**final, "wall": wall, "events": events}


# -- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="131072x2048", help="X's shape for (a) and (b)")
    parser.add_argument("--chunk", default="4096x1024", help="X's chunks, RxC")
    parser.add_argument("--power-iterations", default="4,7", help="Q per row, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dask-timeout", type=float, default=300.0, help="seconds, (b)")
    parser.add_argument("--big-shape", default="196608x2048", help="X's shape for (c)")
    parser.add_argument("--memory-limit", default="512MiB", help="per worker, (c)")
    parser.add_argument("--big-timeout", type=float, default=240.0, help="seconds, (c)")
    parser.add_argument("--skip-big", action="store_true", help="no (c)")
    parser.add_argument("--data", default="/tmp/pca_bench", help="scratch folder")
    args = parser.parse_args(argv)
    logging.getLogger("distributed").setLevel(logging.WARNING)
    byte_compile()
    shape, chunk = _pair(args.shape), _pair(args.chunk)
    qs = [int(q) for q in args.power_iterations.split(",")]
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    made = time.perf_counter()
    url = make_input(data, shape, chunk, seed=0)
    print(f"X {shape} ready in {time.perf_counter() - made:.1f} s", flush=True)
    main_rows = {q: measure_fitting(url, q, args, data) for q in qs}
    big = None
    if not args.skip_big:
        big_shape = _pair(args.big_shape)
        made = time.perf_counter()
        big_url = make_input(data, big_shape, chunk, seed=1)
        print(f"big X {big_shape} ready in {time.perf_counter() - made:.1f} s", flush=True)
        big = {
            "url": big_url, "shape": big_shape, "bytes": big_shape[0] * big_shape[1] * 4,
            "stored": stored_bytes(big_url),
            "pca": run_peer("pca-cluster", big_url, qs[0], args.big_timeout, args.memory_limit,
                            str(data / "out-big.zarr")),
            "dask": run_peer("dask-cluster", big_url, qs[0], args.big_timeout, args.memory_limit),
            "q": qs[0],
        }  # fmt: skip
        shutil.rmtree(data / "out-big.zarr", ignore_errors=True)
    plan_text = describe(url, qs[0], data)
    write_results(args, url, shape, main_rows, big, plan_text)
    return 0


def measure_fitting(url: str, q: int, args: Any, data: Path) -> dict[str, Any]:
    """(a) and (b) at Q = q: reads and pca on one client, peers round-robin with them."""
    from distributed import Client, LocalCluster

    out = str(data / f"out-q{q}.zarr")
    runs: dict[str, list[dict[str, Any]]] = {
        "read": [], "raw": [], "pca": [], "held": [], "dask": [], "sklearn": []
    }  # fmt: skip
    raw = raw_layout(url)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        read_x(client, url)  # warm: the worker's imports, X in the page cache
        for i in range(args.repeats):
            runs["read"].append({"seconds": read_x(client, url)})
            if raw:
                runs["raw"].append({"seconds": read_x(client, url, raw=True)})
            runs["pca"].append(run_pca(client, url, out, q))
            runs["held"].append(run_pca(client, url, out, q, "auto"))
            runs["read"].append({"seconds": read_x(client, url)})
            if not any(r["seconds"] is None for r in runs["dask"]):  # a timed-out peer: once
                runs["dask"].append(run_peer("dask-threads", url, q, args.dask_timeout))
            runs["sklearn"].append(run_peer("sklearn", url, q, args.dask_timeout))
            print(f"Q={q} repeat {i + 1}: " + ", ".join(
                f"{k} {_s(v[-1]['seconds'])}" for k, v in runs.items()), flush=True)  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    return runs


def describe(url: str, q: int, data: Path) -> str:
    """The dry run's plan of the main pca (nothing written)."""
    from pipeline.decompose import prepare_decomposition

    job = prepare_decomposition(
        "pca", url, str(data / "out-plan.zarr"), components=K, oversample=P,
        power_iterations=q, seed=0, overwrite=True,
    )  # fmt: skip
    return job.describe()


def _pair(text: str) -> tuple[int, int]:
    sides = [int(s) for s in text.lower().split("x")]
    return (sides[0], sides[-1])


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def _rel(a: list[float] | None, b: list[float] | None) -> str:
    if not a or not b:
        return "-"
    x, y = np.asarray(a), np.asarray(b)
    return f"{float(np.max(np.abs(x - y) / y)):.1e}"


def write_results(
    args: Any,
    url: str,
    shape: tuple[int, int],
    main_rows: dict[int, dict[str, list[dict[str, Any]]]],
    big: dict[str, Any] | None,
    plan_text: str,
) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.pca_speed " + " ".join(sys.argv[1:])
    cores = f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable)"
    coretype = os.environ.get("OPENBLAS_CORETYPE", "unset")
    x_bytes = shape[0] * shape[1] * 4
    lines = [
        f"# pipeline.pca against reading X and its peers ({args.shape} float32, {args.chunk} "
        f"chunks, medians of {args.repeats})",
        "",
        f"Command: `{command}`, {time.strftime('%Y-%m-%d %H:%M')}; CPU: {cpu_name()}, {cores}; "
        f"OPENBLAS_CORETYPE: {coretype}.",
        "",
        f"X: {_gib(x_bytes)} decoded, {_gib(stored_bytes(url))} stored (zarr v3 default codec, "
        f"zstd), a rank-{SIGNAL_RANK} signal plus unit noise around 280. K = {K}, P = {P}, "
        "seed 0. Ours and the reads: one LocalCluster(n_workers=1, threads_per_worker=2, "
        "processes=True), started once, not timed; X in the page cache throughout.",
        "",
        "## (a) and (b): time, data that fits",
        "",
        "| Q | case | median s | runs | ratio | target | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    steps_lines: list[str] = []
    acc_lines: list[str] = []
    for q, runs in main_rows.items():
        passes = 2 * q + 2
        read = _med([r["seconds"] for r in runs["read"]])
        raw_read = _med([r["seconds"] for r in runs["raw"]])
        pca = _med([r["seconds"] for r in runs["pca"]])
        held = _med([r["seconds"] for r in runs["held"]])
        dask_ = _med([r["seconds"] for r in runs["dask"]])
        skl = _med([r["seconds"] for r in runs["sklearn"]])
        fit = _med([r.get("fit") for r in runs["sklearn"]])
        load = _med([r.get("load") for r in runs["sklearn"]])
        assert read is not None and pca is not None and held is not None
        ra = pca / (passes * read)

        def runs_of(key: str, field: str = "seconds", rs: Any = runs) -> str:
            return ", ".join(_s(r.get(field)) for r in rs[key])

        def row(
            case: str, med: float | None, rr: str, ratio: str, target: str, met: Any, q: int = q
        ) -> str:
            shown = {None: "-", True: "yes", False: "**no**"}[met]
            return f"| {q} | {case} | {_s(med)} | {rr} | {ratio} | {target} | {shown} |"

        dask_out = runs["dask"][-1].get("outcome", "") if runs["dask"] else ""
        lines += [
            row("one read of X (a task per chunk, same client)", read, runs_of("read"), "-",
                "-", None),
            row(f"{passes} reads of X (2Q + 2, from the median)", passes * read, "-", "-", "-",
                None),
            row(f"pipeline.pca, passes_from='storage' (whole call; {runs['pca'][-1]['x_passes']} "
                "passes over X)", pca,
                runs_of("pca"), f"{ra:.2f}x {passes} reads", "<= 1.3", ra <= 1.3),
            *([] if raw_read is None else [
                row("one raw decode of X (chunk files + numcodecs zstd, no zarr; same client)",
                    raw_read, runs_of("raw"), "-", "-", None),
                row(f"pipeline.pca against {passes} raw decodes (a tighter floor)", pca, "-",
                    f"{pca / (passes * raw_read):.2f}x {passes} raw decodes", "(<= 1.3)",
                    pca / (passes * raw_read) <= 1.3),
            ]),
            row("pipeline.pca, default passes_from='auto': X read once and held by the worker "
                f"({runs['held'][-1]['x_passes']} read)", held, runs_of("held"),
                f"{held / (passes * read):.2f}x {passes} reads", "-", None),
            row("dask svd_compressed, threads (mean pass + svd, compute=True, iterator='QR'"
                + (f"; {dask_out}" if dask_out not in ("", "finished") else "") + ")",
                dask_, runs_of("dask"),
                f"pca {pca / dask_:.2f}x, held {held / dask_:.2f}x" if dask_ else "-", "< 1",
                min(pca, held) < dask_ if dask_ else False),
            row("sklearn PCA randomized: zarr read + fit", skl, runs_of("sklearn"),
                f"pca {pca / skl:.2f}x, held {held / skl:.2f}x" if skl else "-", "< 1",
                held < skl if skl else None),
            row("sklearn PCA randomized: fit only", fit, runs_of("sklearn", "fit"),
                f"held {held / fit:.2f}x" if fit else "-", "-", None),
            row("sklearn: zarr read only (X[:] into memory)", load, runs_of("sklearn", "load"),
                "-", "-", None),
        ]  # fmt: skip
        st = [r["steps"] for r in runs["pca"]]
        prods = [sum(s["products"]) for s in st]
        plans = [sum(s["product_plan"]) for s in st]
        each = [statistics.median(s["products"]) for s in st]
        covered = [
            s["setup"] + s["moments"] + s["sketch"] + sum(s["products"]) + s["orthonormalize"]
            + s["finish"] for s in st
        ]  # fmt: skip
        other = [r["seconds"] - c for r, c in zip(runs["pca"], covered, strict=True)]
        m_pca = pca

        def srow(
            name: str, vals: list[float], note: str = "", q: int = q, m_pca: float = m_pca
        ) -> str:
            v = statistics.median(vals)
            return f"| {q} | {name} | {v:.2f} | {100 * v / m_pca:.0f} % | {note} |"

        steps_lines += [
            srow("before step 1 (checks, plan, OUT claimed)", [s["setup"] for s in st]),
            srow("moments (a pass over X)", [s["moments"] for s in st],
                 f"{statistics.median([s['moments'] for s in st]) / read:.2f}x one read"),
            srow("sketch Ω", [s["sketch"] for s in st]),
            srow(f"{passes} products (passes over X), all", prods,
                 f"{statistics.median(prods) / (passes * read):.2f}x {passes} reads"),
            srow("  of which: multiply job's checks and plan (to its 'backend:' line)", plans),
            srow("  one product, median", each, f"{statistics.median(each) / read:.2f}x one read"),
            srow(f"orthonormalize ({passes} TSQRs)", [s["orthonormalize"] for s in st]),
            srow("finish (small SVD, components, scores)", [s["finish"] for s in st]),
            srow("after the last step (X's listing checked, record saved)", other),
        ]  # fmt: skip
        ours_s = runs["pca"][-1]["s"]
        skl_s = next((r.get("s") for r in reversed(runs["sklearn"]) if r.get("s")), None)
        dask_s = next((r.get("s") for r in reversed(runs["dask"]) if r.get("s")), None)
        acc_lines += [
            f"| {q} | pipeline.pca | {_fmt_s(ours_s)} | {_rel(ours_s, skl_s)} |",
            f"| {q} | sklearn randomized | {_fmt_s(skl_s)} | 0 |",
            f"| {q} | dask svd_compressed | {_fmt_s(dask_s)} | {_rel(dask_s, skl_s)} |",
        ]
    lines += [
        "",
        "## Where pca's time goes (medians over the repeats, from the `step i/N` log lines)",
        "",
        "| Q | part | median s | of pca | note |",
        "|---|---|---|---|---|",
        *steps_lines,
        "",
        "## Accuracy: singular values (the last run's), against scikit-learn's randomized",
        "",
        "| Q | tool | singular values 1..K | max relative difference vs sklearn |",
        "|---|---|---|---|",
        *acc_lines,
        "",
    ]
    if big is not None:
        lines += big_table(big, args)
    lines += ["## The plan (`prepare_decomposition(...).describe()`, main X, first Q)", "",
              "```", plan_text, "```", "", *NOTES]  # fmt: skip
    (RESULTS / "pca_speed.md").write_text("\n".join([*lines, ""]))
    print("\n".join(lines))


def _fmt_s(s: list[float] | None) -> str:
    return "-" if not s else ", ".join(f"{v:.2f}" for v in s)


def big_table(big: dict[str, Any], args: Any) -> list[str]:
    limit = args.memory_limit
    lines = [
        f"## (c) X larger than a worker's memory limit ({args.big_shape}: {_gib(big['bytes'])} "
        f"decoded, {_gib(big['stored'])} stored; memory_limit {limit} per worker; Q = "
        f"{big['q']}; one run each, killed past {args.big_timeout:g} s)",
        "",
        "| tool | outcome | seconds | peak worker RSS | within the limit? | worker events |",
        "|---|---|---|---|---|---|",
    ]
    from dask.utils import parse_bytes

    cap = parse_bytes(limit)
    for name, r in (
        (f"pipeline.pca(memory_limit={limit!r}) on LocalCluster(1 x 2 threads, "
         f"memory_limit={limit!r})", big["pca"]),
        (f"dask svd_compressed(compute=True) on LocalCluster(1 x 2 threads, "
         f"memory_limit={limit!r})", big["dask"]),
    ):  # fmt: skip
        ev = r.get("events", {})
        shown = f"paused {ev.get('paused', 0)}x, restarted {ev.get('restarted', 0)}x"
        took = _s(r.get("seconds") or r.get("failed_after"))
        within = "yes" if r["peak"] <= cap else "**no**"
        lines.append(
            f"| {name} | {r.get('outcome', '-')} | {took} | {_gib(r['peak'])} | {within} "
            f"| {shown} |"
        )
    if big["pca"].get("s") and big["dask"].get("s"):
        lines.append("")
        lines.append(
            f"Singular values, pca: {_fmt_s(big['pca']['s'])}; dask: "
            f"{_fmt_s(big['dask']['s'])} (max relative difference "
            f"{_rel(big['pca']['s'], big['dask']['s'])})."
        )
    return [*lines, ""]


NOTES = [
    "Notes. One read of X: a task per chunk on the pca's own client (the array opened with "
    "zarr, the chunk read, decoded and summed in float32), all submitted at once, so at the "
    "cluster's concurrency (2 threads), timed from submit to the last result; read before and "
    "after each pca, the median of all. pipeline.pca: the whole call (`client=` given, so no "
    "cluster start), its 22 + 4 (Q - 4) steps as logged. dask: a fresh subprocess on the "
    "threads scheduler (2 threads), timed from `from_zarr` to `dask.compute(u, s, v)` done, "
    "the column means computed first as one pass (as pca's moments pass; subtracting a lazy "
    "mean would hold X's chunks until the mean is reduced); `compute=True` persists only the "
    "tall-skinny sketches, X is read again each pass; `iterator='QR'` (orthonormalized between "
    "passes, as pca and sklearn do) because dask's default `iterator='power'` overflows float32 "
    "at Q = 4 on this X (LinAlgError: SVD did not converge). sklearn: a fresh subprocess, "
    "`zarr.open_array(X)[:]` then `PCA(n_components=K, svd_solver='randomized', "
    "iterated_power=Q, n_oversamples=P, random_state=0).fit(x)` in float32 (its BLAS on 2 "
    "threads). A timed-out dask peer is not run again.",
    "",
    "(c): each a fresh subprocess; the peak is the largest RSS of any one process the "
    "subprocess started (the worker; its nanny is smaller), sampled every 50 ms with psutil; "
    "worker events counted from distributed's log lines (Pausing worker, Restarting / memory "
    "budget).",
]


if __name__ == "__main__":
    sys.exit(main())

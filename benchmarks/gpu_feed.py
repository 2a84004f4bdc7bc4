"""How well the host feeds a GPU: the whole multiply path against an EMULATED device.

    python -m benchmarks.gpu_feed A.zarr B.zarr --device-tflops F --h2d-gbps G
        [--device-memory SIZE] [--no-overlap] [--gpu-decode [--decode-gbps D]] [--runs N]

Real reads, decodes, plan and staging; the device's kernels and copies take modelled time
(flops ÷ F, bytes ÷ G) on their own timelines and do no math (kernels.device.emulated), so OUT holds
no product. Prints the model's prediction per resource, what was measured, and as its last line

    emulated device: busy X.XX of the execution window Y.YY s; bound by <resource>

where the window runs from the first tile task's start to the last tile's write. Every figure
here is emulated: no GPU was used.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import dask

from kernels.cuda.host import exit_skipping_teardown
from pipeline.plan.memory import ZARR_CONCURRENCY  # zarr's default: the peer reads as zarr would


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_feed", description=__doc__)
    parser.add_argument("a", metavar="A")
    parser.add_argument("b", metavar="B")
    parser.add_argument("--device-tflops", type=float, help="float32 TFLOP/s (emulated)")
    parser.add_argument("--h2d-gbps", type=float, help="host-to-device GB/s (emulated)")
    parser.add_argument(
        "--real", action="store_true", help="a real GPU (backend cuda), no emulation"
    )
    parser.add_argument("--device-memory", default="80GiB", help="device memory (default 80GiB)")
    parser.add_argument("--no-overlap", action="store_true", help="baseline: stages in series")
    parser.add_argument(
        "--gpu-decode",
        action="store_true",
        help="zstd chunks copied compressed and decoded on the (emulated) device",
    )
    parser.add_argument(
        "--decode-gbps", type=float, help="device zstd decoding, GB/s decoded (emulated)"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="jobs in one process; the first is cold (fresh staging memory, a new worker's "
        "first job), later ones warm, as on a long-lived worker; the last is reported",
    )
    parser.add_argument("--out", help="where to write OUT (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.real:
        return real(args.a, args.b, args.out)
    if args.device_tflops is None or args.h2d_gbps is None:
        parser.error("give --device-tflops and --h2d-gbps (or --real on a GPU machine)")
    settings = {
        "tilegemm.emulated.tflops": args.device_tflops,
        "tilegemm.emulated.h2d-gbps": args.h2d_gbps,
        "tilegemm.emulated.memory": args.device_memory,
        "tilegemm.gpu-overlap": not args.no_overlap,
        **({"tilegemm.emulated.decode-gbps": args.decode_gbps} if args.decode_gbps else {}),
    }
    with dask.config.set(settings):
        for number in range(1, max(args.runs, 1) + 1):
            report = run(args.a, args.b, args.out, args.gpu_decode)
            state = "cold" if number == 1 else "warm"
            print(
                f"run {number} of {args.runs} ({state}): busy {report['busy']:.2f}, "
                f"window {report['window']:.2f} s (EMULATED)"
            )
    print(report["table"])
    read = zarr_read_seconds(args.a, args.b)
    flops = report["plan"].flops / (args.device_tflops * 1e12)
    bound = max(flops, read)
    print(
        f"zarr reads and decodes A and B once in {read:.2f} s; the kernel alone needs "
        f"{flops:.2f} s (EMULATED); window / max(the two) = {report['window'] / bound:.2f}"
    )
    print(
        f"emulated device: busy {report['busy']:.2f} of the execution window "
        f"{report['window']:.2f} s; bound by {report['bound_by']}"
    )
    return 0


KERNEL_TIMERS = {
    "cuda": ("kernels.device.gpu", "start_kernel_timing", "kernel_seconds_so_far"),
    "emulated": ("kernels.device.shared", "reset_shared", "gemm_seconds"),
}
"""Per backend: the module and the two functions each worker runs to time its own kernels."""


def real(a: str, b: str, out: str | None) -> int:
    """On a GPU machine: the same path on the cuda backend, the device's busy time from CUDA
    events around every kernel, beside the model's prediction (make bench-gpu)."""
    measured = measure_busy(a, b, out, "cuda")
    length, busy, plan = measured["window"], measured["busy"], measured["plan"]
    print(f"{'':<10}{'window s':>10}{'TFLOP/s':>10}{'busy':>8}  bound by")
    print(f"{'measured':<10}{length:>10.2f}{plan.flops / length / 1e12:>10.2f}{busy:>8.2f}")
    print(
        f"{'model':<10}{plan.estimated_seconds:>10.2f}"
        f"{plan.flops / plan.estimated_seconds / 1e12:>10.2f}{'':>8}  {plan.bound_by}"
    )
    print(f"GPU device: busy {busy:.2f} of the execution window {length:.2f} s (measured)")
    return 0


def measure_busy(a: str, b: str, out: str | None, backend: str, workers: int = 1) -> dict[str, Any]:
    """One job; each worker times its own kernels (the job runs in the workers' processes, a
    LocalCUDACluster's always): busy = their kernel seconds / (workers x window)."""
    import importlib

    module, start, read = KERNEL_TIMERS[backend]
    timers = importlib.import_module(module)

    def before(client: Any) -> None:
        client.run(getattr(timers, start))

    def after(client: Any) -> float:
        return float(sum(client.run(getattr(timers, read)).values()))

    result, window, kernel_seconds = timed_job(
        a, b, out, backend, workers=workers, before=before, after=after
    )
    length = window[1] - window[0]
    return {
        "window": length,
        "kernel_seconds": kernel_seconds,
        "busy": kernel_seconds / (workers * length),
        "plan": result.plan,
    }


def zarr_read_seconds(a: str, b: str) -> float:
    """Reading and decoding both inputs once with zarr alone, at zarr's own concurrency (the
    jobs before, in this process, set the pipeline's)."""
    import zarr

    with zarr.config.set({"async.concurrency": ZARR_CONCURRENCY}):
        started = time.perf_counter()
        for url in (a, b):
            zarr.open_array(url, mode="r")[...]
        return time.perf_counter() - started


def run(a: str, b: str, out: str | None = None, gpu_decode: bool = False) -> dict[str, Any]:
    """One emulated multiply on an in-process cluster; the device's timeline is read here."""
    from kernels.device.shared import reset_shared, shared_timelines

    reset_shared()
    result, window, _ = timed_job(a, b, out, "emulated", gpu_decode)
    (timeline,) = shared_timelines()
    return summarize(result, timeline, window)


def timed_job(
    a: str,
    b: str,
    out: str | None,
    backend: str,
    gpu_decode: bool = False,
    workers: int = 1,
    before: Any = None,
    after: Any = None,
) -> tuple[Any, tuple[float, float], Any]:
    """(result, execution window in perf_counter seconds, ``after(client)``) of one multiply on
    a local cluster, OUT in a temporary folder unless given; ``before(client)`` runs first."""
    from distributed import get_task_stream

    from cluster.lifecycle import start
    from cluster.spec import ClusterSpec
    from pipeline import prepare

    scratch = None if out else tempfile.mkdtemp(prefix="gpu-feed-")
    target = out or str(Path(str(scratch)) / "c.zarr")
    try:
        job = prepare(a, b, target, backend=backend, overwrite=True, gpu_decode=gpu_decode)
        with start(ClusterSpec(workers=workers, dashboard_address=":0")) as client:
            if before:
                before(client)
            # The window's length is what counts: the clocks' offset cancels out.
            offset = time.time() - time.perf_counter()
            with get_task_stream(client) as stream:
                result = job.execute(client)
            measured = after(client) if after else None
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return result, _window(stream.data, offset), measured


def _window(tasks: list[dict[str, Any]], offset: float) -> tuple[float, float]:
    """First tile task's start to the last tile's end, in perf_counter seconds."""
    spans = [
        (s["start"], s["stop"])
        for t in tasks
        if str(t["key"]).startswith(("matmul-tile", "matmul-partial", "matmul-write"))
        for s in t["startstops"]
        if s["action"] == "compute"
    ]
    return min(s for s, _ in spans) - offset, max(e for _, e in spans) - offset


def summarize(result: Any, timeline: list[Any], window: tuple[float, float]) -> dict[str, Any]:
    """Busy fraction of each device engine within the window, the host's decode load, the
    model's figures beside them, and what bound the run."""
    length = max(window[1] - window[0], 1e-9)
    busy = {engine: _busy(timeline, engine, window) for engine in ("compute", "h2d", "d2h")}
    gemm = _busy(timeline, "compute", window, "gemm")  # busy: not --gpu-decode's decoding
    plan = result.plan
    decode = result.phases.get("decode", 0.0) / max(plan.decode_threads * plan.busy_threads, 1)
    measured = {
        "kernel": busy["compute"],
        "host-to-device": busy["h2d"],
        "decode": min(decode, length),
    }
    bound = "kernel" if gemm / length >= 0.85 else max(measured, key=measured.__getitem__)
    model = dict(plan.resource_seconds)
    rows = [f"{'resource':<16}{'model s':>10}{'measured s':>12}"]
    for name in ("storage", "decode", "host-to-device", "kernel", "write"):
        got = f"{measured[name]:.2f}" if name in measured else "-"
        rows.append(f"{name:<16}{model.get(name, 0.0):>10.2f}{got:>12}")
    rows.append(
        f"model: makespan {plan.estimated_seconds:.2f} s, bound by {plan.bound_by}; "
        f"{plan.n_tiles} tile(s) of {plan.tile_shape[0]}x{plan.tile_shape[1]}, "
        f"{len(plan.k_panels)} K panel(s), {plan.decode_threads} decode thread(s) (EMULATED)"
    )
    return {
        "busy": gemm / length,
        "window": length,
        "bound_by": bound,
        "engines": busy,
        "table": "\n".join(rows),
        "plan": plan,
    }


def _busy(
    timeline: list[Any], engine: str, window: tuple[float, float], name: str | None = None
) -> float:
    total = 0.0
    for entry in timeline:
        if entry.engine == engine and name in (None, entry.name):
            total += max(0.0, min(entry.end, window[1]) - max(entry.start, window[0]))
    return total


if __name__ == "__main__":
    exit_skipping_teardown(main())

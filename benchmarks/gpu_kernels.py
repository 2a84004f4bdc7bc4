"""Our Numba CUDA kernels against cuBLAS on one GPU, in one run: TFLOP/s and ratio to cuBLAS.

It needs a CUDA GPU, numba-cuda and CuPy with cuBLAS (pip install "cupy-cuda13x[ctk]"): it cannot
run on CPU-only machines, nor under the Numba CUDA simulator (its timings would mean nothing).

Every contender computes the same C += A @ B on device-resident square inputs: each variant in
kernels.cuda.host.VARIANTS of the dtype, and cuBLAS gemm with beta=1 through CuPy (what the
cublas backend runs). A warm-up launch (JIT compile included) is not timed; it also checks the
result against cuBLAS. Samples alternate between contenders (round-robin, rotating the order) so
clock and thermal drift hit all alike; each sample is --launches back-to-back launches between
two device synchronizations, timed with perf_counter. Medians are reported.

    python -m benchmarks.gpu_kernels --sizes 4096,8192 --dtype float32 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.cuda.host import exit_skipping_teardown
from pipeline.cli.main import Parser, positive_int

RESULTS = Path(__file__).parent / "results"
CUBLAS = "cublas"


class GpuUnavailableError(RuntimeError):
    """No usable GPU, CuPy or numba-cuda here."""


@dataclass(frozen=True)
class Contender:
    """One way to compute c += a @ b on the device."""

    name: str
    default: bool
    """True for the variant the cuda backend uses for this dtype (and for cuBLAS)."""
    launch: Callable[[], None]
    """Enqueue one c += a @ b (asynchronous)."""
    reset: Callable[[], None]
    """Zero this contender's c."""
    fetch: Callable[[], NDArray[Any]]
    """This contender's c as a host array."""


@dataclass(frozen=True)
class Row:
    size: int
    dtype: str
    name: str
    default: bool
    seconds: float
    """Median time of one launch, in seconds."""
    max_error: float
    """max |C - C_cublas| / max |C_cublas| after the warm-up launch."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m benchmarks.gpu_kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes", type=_sizes, default=(4096, 8192), help="n of the n x n products (4096,8192)"
    )
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument(
        "--repeats", type=positive_int, default=5, help="timed samples per kernel (5)"
    )
    parser.add_argument("--launches", type=positive_int, default=3, help="launches per sample (3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "gpu_kernels.md", help="Markdown table to write"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cupy, cuda = require_gpu()
    except GpuUnavailableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    rows: list[Row] = []
    for n in args.sizes:
        a = rng.uniform(-1, 1, (n, n)).astype(args.dtype)
        b = rng.uniform(-1, 1, (n, n)).astype(args.dtype)
        rows += bench_size(contenders(cupy, cuda, a, b), cupy, n, args)
    table = format_table(rows, describe_device(cupy))
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table + "\n")
    print(f"written: {args.out}", file=sys.stderr)
    return 0


def require_gpu() -> tuple[Any, Any]:
    """(cupy, numba.cuda) on a machine with a real GPU, else GpuUnavailableError."""
    from kernels.constants import CUBLAS_INSTALL
    from kernels.cuda.cublas import CublasUnavailableError, load_cupy

    needs = "this benchmark needs a CUDA GPU and CuPy and cannot run on CPU-only machines"
    try:
        cupy = load_cupy()
    except CublasUnavailableError as e:
        raise GpuUnavailableError(
            f"{needs}: {e.reason}; run it on a GPU host with `{CUBLAS_INSTALL}`"
        ) from e
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise GpuUnavailableError(
            f"{needs}: NUMBA_ENABLE_CUDASIM=1 would time the simulator; unset it"
        )
    from numba import cuda

    if not cuda.is_available():
        raise GpuUnavailableError(f"{needs}: numba-cuda sees no GPU although CuPy does")
    return cupy, cuda


def contenders(cupy: Any, cuda: Any, a: NDArray[Any], b: NDArray[Any]) -> list[Contender]:
    """cuBLAS first (the reference), then every kernel variant of a's dtype."""
    from kernels.cuda.host import VARIANTS

    out = [_cublas(cupy, a, b)]
    for variant in VARIANTS.values():
        if variant.dtype == a.dtype:
            out.append(_numba(cuda, variant, a, b))
    return out


def _cublas(cupy: Any, a: NDArray[Any], b: NDArray[Any]) -> Contender:
    d_a, d_b = cupy.asarray(a), cupy.asarray(b)
    d_c = cupy.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)
    return Contender(
        name=CUBLAS,
        default=True,
        launch=lambda: cupy.cublas.gemm("N", "N", d_a, d_b, out=d_c, alpha=1.0, beta=1.0),
        reset=lambda: d_c.fill(0),
        fetch=lambda: cupy.asnumpy(d_c),
    )


def _numba(cuda: Any, variant: Any, a: NDArray[Any], b: NDArray[Any]) -> Contender:
    # The backend's own compile path (cached): the same launch bounds the backend uses.
    from kernels.cuda.host import jit_kernel

    kernel = jit_kernel(variant.make_kernel(), variant.launch_bounds)
    m, n = a.shape[0], b.shape[1]
    cfg = variant.launch(m, n)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    zeros = np.zeros((m, n), dtype=a.dtype)
    d_c = cuda.to_device(zeros)
    return Contender(
        name=variant.name,
        default=variant.default,
        launch=lambda: kernel[cfg.grid, cfg.block](d_a, d_b, d_c),
        reset=lambda: d_c.copy_to_device(zeros),
        fetch=lambda: d_c.copy_to_host(),
    )


def bench_size(runs: list[Contender], cupy: Any, n: int, args: argparse.Namespace) -> list[Row]:
    """Warm up and check every contender, then time them round-robin."""
    sync = cupy.cuda.runtime.deviceSynchronize
    errors = warm_up(runs, sync)
    samples: dict[str, list[float]] = {r.name: [] for r in runs}
    for repeat in range(args.repeats):
        shift = repeat % len(runs)
        for run in runs[shift:] + runs[:shift]:
            samples[run.name].append(time_launches(run, sync, args.launches))
    return [
        Row(n, args.dtype, r.name, r.default, statistics.median(samples[r.name]), errors[r.name])
        for r in runs
    ]


def warm_up(runs: list[Contender], sync: Callable[[], None]) -> dict[str, float]:
    """One untimed launch each on a zeroed C; its error relative to cuBLAS's result."""
    results = {}
    for run in runs:
        run.reset()
        run.launch()
        sync()
        results[run.name] = run.fetch()
    ref = results[CUBLAS]
    scale = float(np.abs(ref).max()) or 1.0
    return {name: float(np.abs(c - ref).max()) / scale for name, c in results.items()}


def time_launches(run: Contender, sync: Callable[[], None], launches: int) -> float:
    """Seconds per launch over ``launches`` back-to-back launches (C keeps accumulating)."""
    sync()
    start = time.perf_counter()
    for _ in range(launches):
        run.launch()
    sync()
    return (time.perf_counter() - start) / launches


def tflops(n: int, seconds: float) -> float:
    """TFLOP/s of one n x n x n product (2 n^3 flops) taking ``seconds``."""
    return 2.0 * n**3 / seconds / 1e12


def format_table(rows: list[Row], device: str) -> str:
    """Markdown: one line per (size, kernel), ratio to cuBLAS of the same size and dtype."""
    lines = [
        f"# GPU kernels vs cuBLAS — {device}",
        "",
        "Median of the timed samples; C += A @ B on device-resident square inputs; "
        "`*` marks the cuda backend's default kernel.",
        "",
        "| n | dtype | kernel | ms | TFLOP/s | vs cuBLAS | max error |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    ref = {(r.size, r.dtype): r.seconds for r in rows if r.name == CUBLAS}
    for r in rows:
        ratio = ref[(r.size, r.dtype)] / r.seconds if (r.size, r.dtype) in ref else float("nan")
        star = "*" if r.default and r.name != CUBLAS else ""
        lines.append(
            f"| {r.size} | {r.dtype} | {r.name}{star} | {r.seconds * 1e3:.3f} | "
            f"{tflops(r.size, r.seconds):.2f} | {ratio:.2f} | {r.max_error:.1e} |"
        )
    return "\n".join(lines)


def describe_device(cupy: Any) -> str:
    """GPU name, and the CuPy and CUDA runtime versions."""
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    return f"{name}, CuPy {cupy.__version__}, CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive")
    return sizes


if __name__ == "__main__":
    exit_skipping_teardown(main())

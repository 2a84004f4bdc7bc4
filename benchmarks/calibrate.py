"""Fit the cost model's constants on this machine and write them where the planner reads them.

    python -m benchmarks.calibrate [--repeats 5] [--out pipeline/plan/fitted_costs.py]

For input chunks of 64² to 2048² float32 (zstd, the inputs' usual codec) it times, on one
thread, fetching every stored chunk of a 2048² array (page cache warm: a job's second read) and
decoding each; for OUT's chunks, zarr writing a 2048² array to memory (encoding: raw, and
Blosc-LZ4 as integer OUTs are) and to local files (the difference is the write). Each fit is
``seconds = chunks x per_chunk + bytes x per_byte`` by least squares on relative error, so
small chunks weigh as much as big ones. Then one BLAS thread's sgemm rate, dask's cost per task
and what a tiny job's whole command costs (the interpreter, starting a local cluster,
creating and finishing OUT). Last, three whole jobs, each bound by one resource group (product,
decode, write), scale that group's figures to what a job takes (threads sharing cores, memory
and fresh pages). Figures are CPU seconds (this process's, or the job's workers'), the least of
``--repeats`` runs, so other work on a shared machine barely moves them (dask's cost per task is
a wall time).
Prints the fits with each size's measured and fitted seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
import zarr
from threadpoolctl import threadpool_limits

from benchmarks import byte_compile
from pipeline.facts.host import best_cpu_seconds as best_seconds
from pipeline.facts.host import best_figures, gemm_rate, measure
from pipeline.generate import write_random
from pipeline.plan.costs import ChunkCost, CostModel, HostProbe
from pipeline.plan.matmul import MatmulPlan, cpu_resource_seconds
from pipeline.plan.model import grouped
from pipeline.store.chunks import unsharded as chunk_read
from pipeline.store.chunks.sizes import decode_exact
from pipeline.store.inputs import open_input
from pipeline.store.output import output_compressors

if TYPE_CHECKING:
    from pipeline.job import MatmulJob

SIDE = 2048
SIZES = (64, 128, 256, 512, 1024, 2048)
Sample = tuple[int, int, float]  # chunks, bytes, seconds


def fit(samples: list[Sample]) -> ChunkCost:
    """per_chunk and per_byte minimising the squared relative error, both at least 0."""
    x = np.array([[c / t, b / t] for c, b, t in samples])
    coef, *_ = np.linalg.lstsq(x, np.ones(len(samples)), rcond=None)
    if coef.min() < 0:  # one term explains it: refit the other alone
        keep = int(np.argmax(coef))
        only = np.linalg.lstsq(x[:, [keep]], np.ones(len(samples)), rcond=None)[0][0]
        coef = np.zeros(2)
        coef[keep] = only
    return ChunkCost(per_chunk=float(coef[0]), per_byte=float(coef[1]))


def _read_all(array: Any, index: list[tuple[int, int]]) -> None:
    for _ in chunk_read._chunks(array, index, len(index)):
        pass


def input_samples(root: Path, repeats: int) -> tuple[list[Sample], list[Sample]]:
    reads, decodes = [], []
    for c in SIZES:
        url = str(root / f"in{c}.zarr")
        write_random(url, (SIDE, SIDE), (c, c), "float32", c)
        array = open_input(url)
        index = [(i, j) for i in range(SIDE // c) for j in range(SIDE // c)]
        # warm the page cache, as a job's reread; copies: the reader reuses its buffer
        frames = [bytes(data) for _, data in chunk_read._chunks(array, index, len(index))]
        chunk = c * c * 4
        read = best_seconds(lambda a=array, i=index: _read_all(a, i), repeats)

        def decode(frames: list[Any] = frames, chunk: int = chunk) -> None:
            for frame in frames:
                decode_exact("zstd", frame, chunk, "chunk")

        reads.append((len(index), SIDE * SIDE * 4, read))
        decodes.append((len(index), SIDE * SIDE * 4, best_seconds(decode, repeats)))
    return reads, decodes


def output_samples(root: Path, repeats: int) -> tuple[list[Sample], ...]:
    zarr.config.set({"async.concurrency": 1})  # one thread's cost
    floats = np.random.default_rng(0).random((SIDE, SIDE), dtype=np.float32)
    ints = np.arange(SIDE * SIDE, dtype=np.int64).reshape(SIDE, SIDE) % 1000
    raw, packed, stored = [], [], []
    for c in SIZES:
        count = (SIDE // c) ** 2

        def write(store: Any, data: Any, c: int = c) -> None:
            dtype = str(data.dtype)
            out = zarr.create_array(
                store, shape=data.shape, chunks=(c, c), dtype=dtype,
                compressors=output_compressors(dtype), fill_value=0, overwrite=True,
            )  # fmt: skip
            out[:] = data

        memory = best_seconds(lambda: write(zarr.storage.MemoryStore(), floats), repeats)
        path = str(root / f"out{c}.zarr")
        files = best_seconds(lambda p=path: write(p, floats), repeats)
        ints_memory = best_seconds(lambda: write(zarr.storage.MemoryStore(), ints), repeats)
        raw.append((count, floats.nbytes, memory))
        packed.append((count, ints.nbytes, ints_memory))
        stored.append((count, floats.nbytes, max(files - memory, 1e-6)))
    return raw, packed, stored


def children_cpu() -> float:
    """CPU seconds of this process's finished children and theirs (a CLI run, its workers):
    close to an idle machine's wall time for a job that mostly starts up (a 64² product),
    where the wall grows under load."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def accumulator_seconds(repeats: int) -> tuple[float, float]:
    """Seconds per accumulator byte of adding one K=8 panel (BLAS passes over the tile), and
    of a fresh accumulator's first panel and result copy beyond that (page faults, the copy)."""
    from kernels.backends import make_accumulator

    side, k = 4096, 8
    rng = np.random.default_rng(2)
    a = rng.random((side, k), dtype=np.float32)
    b = rng.random((k, side), dtype=np.float32)
    nbytes = side * side * 4

    def fresh() -> Any:
        acc = make_accumulator("cpu", (side, side), "float32", (1024, 1024))
        acc.add(a, b)
        acc.result()
        return acc

    kept = fresh()
    with threadpool_limits(1, "blas"):
        again = best_seconds(lambda: kept.add(a, b), repeats)
        first = best_seconds(fresh, repeats)
    return again / nbytes, max(first - again, 0.0) / nbytes


def task_and_setup_seconds(root: Path, repeats: int) -> tuple[float, float]:
    """dask's thread-seconds per task (1 worker, 2 threads, 400 tasks) plus a tile task's own
    (tile_task_seconds), and the whole CLI's wall on a 64² product (the setup)."""
    from distributed import Client, LocalCluster

    a, b = str(root / "a64.zarr"), str(root / "b64.zarr")
    write_random(a, (64, 64), (64, 64), "float32", 1)
    write_random(b, (64, 64), (64, 64), "float32", 2)
    argv = [sys.executable, "-m", "pipeline", "multiply", a, b, str(root / "c64.zarr")]
    setup = best_seconds(  # the whole command: interpreter, its own local cluster, OUT
        lambda: subprocess.run([*argv, "--overwrite", "--no-progress"], check=True,
                               capture_output=True), repeats, children_cpu,
    )  # fmt: skip
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        client.gather(client.map(abs, range(10)))

        def tasks() -> None:
            client.gather(client.map(abs, range(400), pure=False))

        per_task = best_seconds(tasks, repeats, time.perf_counter) * 2 / 400  # the workers'

    return per_task + tile_task_seconds(a, b, root, repeats), setup


def tile_task_seconds(a: str, b: str, root: Path, repeats: int) -> float:
    """One tile task of a 64x64 product run in this process: what a task costs besides its
    work (opening the stores, its reading and writing threads, the journal)."""
    from pipeline.plan.search import plan_matmul
    from pipeline.plan.spec import StoreSpec
    from pipeline.run.spec import TaskSpec
    from pipeline.run.worker import tile_product_write
    from pipeline.store.inputs import array_spec
    from pipeline.store.output import Output

    specs = [array_spec(open_input(x), "A") for x in (a, b)]
    plan = plan_matmul(*specs, workers=1, threads_per_worker=1, memory_limit_bytes=2**31)
    out = str(root / "task.zarr")
    Output(out).create(plan.out.shape, plan.out.chunks, plan.out.dtype, {})
    spec = TaskSpec(
        StoreSpec(a, b, out), "cpu", plan.compute_dtype, plan.out.dtype, "calibrate",
        block_shape=plan.block_shape,
    )  # fmt: skip
    tile, panels = next(iter(plan.tiles())), tuple(plan.k_panels)
    tile_product_write(spec, tile, panels)  # handles opened, as on a worker's later tasks
    return best_seconds(lambda: tile_product_write(spec, tile, panels), max(repeats, 5))


JOBS = (
    ("product", ((4096, 4096), (1024, 1024)), ((4096, 4096), (1024, 1024))),
    ("decode", ((512, 32768), (64, 64)), ((32768, 512), (64, 64))),
    ("write", ((65536, 16), (8192, 16)), ((16, 2048), (16, 1024))),
)
"""Jobs each bound by one resource group under the one-thread figures."""


def scaled(costs: CostModel, group: str, factor: float) -> CostModel:
    """``costs`` with one resource group's costs times ``factor``."""

    def times(c: ChunkCost) -> ChunkCost:
        return ChunkCost(c.per_chunk * factor, c.per_byte * factor)

    if group == "product":
        return replace(
            costs,
            flops_per_second=costs.flops_per_second / factor,
            accumulate_per_byte=costs.accumulate_per_byte * factor,
            allocate_per_byte=costs.allocate_per_byte * factor,
        )
    if group == "decode":
        return replace(costs, read=times(costs.read), decode=times(costs.decode))
    return replace(
        costs,
        encode=times(costs.encode),
        encode_compressed=times(costs.encode_compressed),
        write=times(costs.write),
    )


def per_chunk_scaled(costs: CostModel, plan: MatmulPlan, target: float) -> tuple[CostModel, float]:
    """``costs`` with the per-chunk read and decode costs scaled so that ``plan``'s modelled
    decode seconds are ``target`` (the per-byte rates, zstd's streaming speed, are what one
    thread measures in a job too; a job of many small chunks pays per chunk: Python, asyncio
    and cores shared by its threads). Returns the factor applied (the per-byte part alone
    exceeding ``target`` scales both, as ``scaled`` does)."""

    def decode_seconds(c: CostModel) -> float:
        return grouped(dict(cpu_resource_seconds(replace(plan, costs=c))))["decode"]

    no_bytes = replace(
        costs,
        read=ChunkCost(costs.read.per_chunk, 0.0),
        decode=ChunkCost(costs.decode.per_chunk, 0.0),
    )
    whole, chunks = decode_seconds(costs), decode_seconds(no_bytes)
    if target <= whole - chunks or chunks <= 0:
        factor = target / max(whole, 1e-9)
        return scaled(costs, "decode", factor), factor
    factor = (target - (whole - chunks)) / chunks

    def times(c: ChunkCost) -> ChunkCost:
        return ChunkCost(c.per_chunk * factor, c.per_byte)

    return replace(costs, read=times(costs.read), decode=times(costs.decode)), factor


def in_job(costs: CostModel, root: Path, repeats: int) -> tuple[CostModel, dict[str, float]]:
    """The one-thread figures scaled to what whole jobs take: each of JOBS runs as the CLI
    (least of ``repeats``) and its workers' CPU seconds (its ``time:`` line: user + system,
    every thread) are set against the plan's modelled thread-seconds, the group bounding it
    scaled to match (a few rounds: the bound may move). On 2 cores a job's threads share the
    cores, the memory bus and fresh pages, which one thread alone does not see."""
    from pipeline import prepare

    runs = []
    for group, (a_shape, a_chunks), (b_shape, b_chunks) in JOBS:
        a, b, out = (str(root / f"job-{group}-{x}.zarr") for x in "abc")
        write_random(a, a_shape, a_chunks, "float32", 1, overwrite=True)
        write_random(b, b_shape, b_chunks, "float32", 2, overwrite=True)
        argv = [sys.executable, "-m", "pipeline", "multiply", a, b, out, "--overwrite"]
        runs.append((group, a, b, out, min(workers_cpu(argv) for _ in range(repeats))))
    factors = dict.fromkeys(("product", "decode per chunk", "write"), 1.0)
    for _ in range(4):
        for group, a, b, out, cpu in runs:
            plan = planned_with(prepare(a, b, out, overwrite=True), costs)
            model = grouped(dict(cpu_resource_seconds(plan)))
            bound = max(model, key=lambda k: model[k])
            rest = sum(v for k, v in model.items() if k != bound) * plan.workers
            factor = max(cpu - rest, 1e-3) / max(model[bound] * plan.workers, 1e-3)
            if bound == "decode":  # a small-chunk job: its excess is the per-chunk cost
                costs, factor = per_chunk_scaled(costs, plan, model["decode"] * factor)
            else:
                costs = scaled(costs, bound, factor)
            factors["decode per chunk" if bound == "decode" else bound] *= factor
            print(f"  {group} job: {cpu:.2f} CPU s, bound by {bound}: x{factor:.2f}")
    return costs, factors


def planned_with(job: MatmulJob, costs: CostModel) -> MatmulPlan:
    """``job``'s plan as ``prepare`` makes it, modelled and chosen with ``costs``."""
    from pipeline.facts.job_plan import plan_for, planning_backend

    store, options = job.store, job.options
    return plan_for(
        job.a, job.b, options, job.state, None, planning_backend(options.backend),
        transposed=store.transposed, symmetric=store.symmetric, costs=costs,
    )  # fmt: skip


def workers_cpu(argv: list[str]) -> float:
    """The workers' CPU seconds (user + system) of one CLI run, from its ``time:`` line."""
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    found = re.search(r"user ([0-9.]+) s, system ([0-9.]+) s", done.stdout + done.stderr)
    if found is None:
        raise RuntimeError(f"no workers' CPU line in: {done.stdout[-500:]}")
    return float(found.group(1)) + float(found.group(2))


def machine() -> str:
    model, cores = "unknown CPU", os.cpu_count() or 1
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(x.split(":", 1)[1].strip() for x in out.splitlines() if "Model name" in x)
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    return f"{model}, {cores} cores"


def source(costs: CostModel) -> str:
    def cost(name: str, c: ChunkCost) -> str:
        return f"    {name}=ChunkCost(per_chunk={c.per_chunk:.4g}, per_byte={c.per_byte:.4g}),"

    return "\n".join(
        [
            '"""The cost model\'s constants, written by ``python -m benchmarks.calibrate`` on the',
            "machine named below (its ``measured``: when, and how each group was scaled to whole",
            'jobs). Rerun it on the machine to plan for; do not edit by hand."""',
            "",
            "from pipeline.plan.costs import ChunkCost, CostModel, HostProbe",
            "",
            "COSTS = CostModel(",
            cost("read", costs.read),
            cost("decode", costs.decode),
            cost("encode", costs.encode),
            cost("encode_compressed", costs.encode_compressed),
            cost("write", costs.write),
            f"    flops_per_second={costs.flops_per_second:.4g},",
            f"    accumulate_per_byte={costs.accumulate_per_byte:.4g},",
            f"    allocate_per_byte={costs.allocate_per_byte:.4g},",
            f"    task_seconds={costs.task_seconds:.4g},",
            f"    setup_seconds={costs.setup_seconds:.4g},",
            f"    machine={json.dumps(costs.machine)},",
            f"    measured={json.dumps(costs.measured)},",
            *probe_lines(costs.probe),
            ")",
            "",
        ]
    )


def steady_probe(calls: int = 3) -> HostProbe:
    """The host probe's best figures over a few calls: one call (itself best of 20) can read
    a fraction of the BLAS rate during a transient, which would scale every plan on the host
    by as much."""
    return best_figures([measure() for _ in range(calls)])


def probe_lines(probe: HostProbe | None) -> list[str]:
    """The calibration host's quick figures (pipeline.facts.host), which scale the model to
    other hosts."""
    if probe is None:
        return []
    return [
        "    probe=HostProbe(",
        f"        flops_per_second={probe.flops_per_second:.4g},",
        f"        decode_per_byte={probe.decode_per_byte:.4g},",
        f"        python_seconds={probe.python_seconds:.4g},",
        "    ),",
    ]


def show(name: str, samples: list[Sample], cost: ChunkCost) -> None:
    rate = 1 / cost.per_byte / 1e9 if cost.per_byte else float("inf")
    print(f"{name}: {cost.per_chunk * 1e6:.1f} us per chunk + {rate:.2f} GB/s")
    for (chunks, nbytes, seconds), side in zip(samples, SIZES, strict=True):
        fitted = cost.seconds(chunks, nbytes)
        print(f"  {side:>5}²: measured {seconds:.4f} s, fitted {fitted:.4f} s")


def main() -> None:
    byte_compile()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out", default=str(Path(__file__).parents[1] / "pipeline/plan/fitted_costs.py")
    )
    args = parser.parse_args()
    # The jobs below plan with the constants being fitted, not this host's scaled model.
    os.environ["DASK_TILEGEMM__HOST_PROBE"] = "False"
    dask.config.set({"tilegemm.host-probe": False})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        reads, decodes = input_samples(root, args.repeats)
        raw, packed, stored = output_samples(root, args.repeats)
        task, setup = task_and_setup_seconds(root, args.repeats)
    fits = {
        name: fit(s)
        for name, s in (
            ("read", reads),
            ("decode", decodes),
            ("encode", raw),
            ("encode_compressed", packed),
            ("write", stored),
        )
    }
    for (name, cost), samples in zip(
        fits.items(), (reads, decodes, raw, packed, stored), strict=True
    ):
        show(name, samples, cost)
    flops = gemm_rate(args.repeats, side=2048)  # the model's rate: job-sized blocks
    accumulate, allocate = accumulator_seconds(args.repeats)
    today = datetime.date.today().isoformat()
    costs = CostModel(
        **fits, flops_per_second=flops, accumulate_per_byte=accumulate,
        allocate_per_byte=allocate, task_seconds=task, setup_seconds=setup,
        machine=machine(), measured=f"{today}, best of {args.repeats}", probe=steady_probe(),
    )  # fmt: skip
    print(
        f"sgemm {flops / 1e9:.1f} GFLOP/s per thread; {task * 1e3:.2f} ms per task; "
        f"setup {setup:.2f} s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        costs, factors = in_job(costs, Path(tmp), max(args.repeats // 2, 2))
    print("in a job: " + ", ".join(f"{k} x{v:.2f}" for k, v in factors.items()))
    costs = replace(costs, measured=costs.measured + ", in-job " + ", ".join(
        f"{k} x{v:.2f}" for k, v in factors.items()))  # fmt: skip
    Path(args.out).write_text(source(costs))
    subprocess.run([sys.executable, "-m", "ruff", "format", "-q", args.out], check=False)
    print(f"wrote {args.out} ({costs.machine})")


if __name__ == "__main__":
    main()

"""Human-readable text: the plan (--dry-run) and the end-of-run summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.plan import DECODE_BYTES_PER_THREAD, FLOPS_PER_THREAD, MatmulPlan
from pipeline.plan.matmul import cpu_resource_seconds
from pipeline.plan.units import format_bytes

if TYPE_CHECKING:
    from pipeline.job import MultiplyResult


def format_plan(plan: MatmulPlan) -> str:
    (m, k), n = plan.a.shape, plan.b.shape[1]
    rows, cols = plan.grid
    widths = [k1 - k0 for k0, k1 in plan.k_panels]
    lines = [
        (
            "product",
            f"{m}x{k} @ {k}x{n} -> {m}x{n} {plan.out.dtype} (accumulate in {plan.compute_dtype})",
        ),
        (
            "input chunks",
            f"A {plan.a.chunks[0]}x{plan.a.chunks[1]}, B {plan.b.chunks[0]}x{plan.b.chunks[1]}",
        ),
        ("output chunks", _layout(plan)),
        ("tiles", f"{plan.n_tiles} ({rows}x{cols}) of {plan.tile_shape[0]}x{plan.tile_shape[1]}"),
        (
            "K panels",
            f"{len(widths)} per tile, width {min(widths, default=0)}-{max(widths, default=0)}",
        ),
        ("split-K", f"{plan.split_k} group(s) per tile, {plan.n_tasks} product task(s)"),
        (
            "workers",
            f"{plan.workers} x {plan.threads_per_worker} thread(s), "
            f"{format_bytes(plan.memory_limit_bytes)} each",
        ),
        ("memory per task", _task_memory(plan)),
        ("memory per worker", format_bytes(plan.worker_bytes)),
        ("flops", f"{plan.flops:.3e}"),
        ("estimated time", _estimate(plan)),
        ("modelled seconds", _resources(plan)),
        (
            "planned reads",
            f"{format_bytes(plan.read_bytes)} = "
            f"{_ratio(plan.read_bytes, plan.lower_bound_read_bytes)} x lower bound "
            f"{format_bytes(plan.lower_bound_read_bytes)} (compulsory "
            f"{format_bytes(plan.compulsory_read_bytes)})",
        ),
    ]
    width = max(len(name) for name, _ in lines)
    table = "\n".join(f"{name:<{width}}  {value}" for name, value in lines)
    return f"{table}\nbound by: {plan.bound_by}"


def _task_memory(plan: MatmulPlan) -> str:
    if plan.device is None:
        return (
            f"{format_bytes(plan.task_bytes)} host, "
            f"{format_bytes(plan.device_bytes)} device (if run on a GPU)"
        )
    return (
        f"{format_bytes(plan.task_bytes)} host (pinned staging), "
        f"{format_bytes(plan.device_bytes)} device of {format_bytes(plan.device.memory_bytes)}"
    )


def _estimate(plan: MatmulPlan) -> str:
    if plan.device is None:
        return (
            f"{plan.estimated_seconds:.1f} s on this cluster (CPU model: "
            f"{FLOPS_PER_THREAD / 1e9:.0f} GFLOP/s and "
            f"{DECODE_BYTES_PER_THREAD / 1e9:.1f} GB/s decode per thread)"
        )
    d = plan.device
    return (
        f"{plan.estimated_seconds:.1f} s on this cluster ({d.name} {d.source}: "
        f"{d.flops(plan.compute_dtype) / 1e12:.1f} TFLOP/s peak, "
        f"{d.h2d_bytes_per_second / 1e9:.0f} GB/s host-to-device; stages overlapped)"
    )


def _resources(plan: MatmulPlan) -> str:
    seconds = plan.resource_seconds or cpu_resource_seconds(plan)
    where = "per worker" if plan.device is not None else "per worker, threads shared"
    return ", ".join(f"{name} {value:.2f}" for name, value in seconds) + f" ({where})"


def format_summary(result: MultiplyResult) -> str:
    seconds = max(result.seconds, 1e-9)
    plan = result.plan
    verified = {None: "not run", True: "passed", False: "FAILED"}[result.verified]
    computed = plan.flops * result.tiles_computed // max(plan.n_tiles, 1)  # skipped: not ours
    return (
        f"done: {result.shape[0]}x{result.shape[1]} {result.dtype} in {result.seconds:.2f} s "
        f"({computed / seconds / 1e9:.1f} GFLOP/s, backend {result.backend}); "
        f"tiles computed {result.tiles_computed}, skipped {result.tiles_skipped}; "
        f"read {format_bytes(result.bytes_read)} "
        f"({_ratio(result.bytes_read, plan.lower_bound_read_bytes)} x lower bound); "
        f"verify {verified}"
    )


def _layout(plan: MatmulPlan) -> str:
    (r, c), shards = plan.out.chunks, plan.out.shards
    return f"{r}x{c}" + (f" in shards of {shards[0]}x{shards[1]}" if shards else "")


def format_accounting(result: MultiplyResult) -> str:
    """Where the tile tasks' time went (thread-seconds) and what the workers' processes used."""
    phases = ", ".join(f"{k} {v:.2f}" for k, v in result.phases.items())
    usage = result.usage
    cpu = (
        f"workers' CPU: user {usage['user_seconds']:.2f} s, system {usage['system_seconds']:.2f}"
        f" s, {int(usage['page_faults'])} page faults"
        if usage
        else "workers' CPU: not measured"
    )
    return f"time: thread-seconds {phases or 'none'}; {cpu}"


def _ratio(x: int, y: int) -> str:
    return f"{x / y:.2f}" if y else "n/a"

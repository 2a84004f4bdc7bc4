"""Human-readable text: the plan (--dry-run), the end-of-run summary, verify's outcome; and
distributed's performance report of a run (--report)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.cputime import ROWS
from pipeline.plan.costs import CostModel
from pipeline.plan.device_model import VENDOR
from pipeline.plan.gpu_candidate import panel_decode_rate
from pipeline.plan.matmul import MatmulPlan, cpu_resource_seconds
from pipeline.plan.units import format_bytes, format_duration

if TYPE_CHECKING:
    from pipeline.options.job_options import MultiplyResult
    from pipeline.verify.check import VerifyResult


def format_plan(plan: MatmulPlan, more: tuple[tuple[str, str], ...] = ()) -> str:
    """The dry run's table; ``more``: the job's own lines (OUT's room, other backends' times),
    after the estimate."""
    (m, k), n = plan.a.shape, plan.b.shape[1]
    rows, cols = plan.grid
    panels = plan.k_panels
    lines = [
        (
            "product",
            f"{_operation(plan)}{m}x{k} @ {k}x{n} -> {m}x{n} {plan.out.dtype} "
            f"(accumulate in {plan.compute_dtype})",
        ),
        ("precision", _precision(plan)),
        (
            "input chunks",
            f"A {plan.a.chunks[0]}x{plan.a.chunks[1]}, B {plan.b.chunks[0]}x{plan.b.chunks[1]}",
        ),
        ("output chunks", _layout(plan)),
        ("tiles", f"{plan.n_tiles} ({rows}x{cols}) of {plan.tile_shape[0]}x{plan.tile_shape[1]}"),
        (
            "K panels",
            f"{len(panels)} per tile, width {panels.narrowest}-{panels.widest}",
        ),
        ("split-K", f"{plan.split_k} group(s) per tile, {plan.n_tasks} product task(s)"),
        (
            "workers",
            f"{plan.workers} x {plan.threads_per_worker} thread(s), "
            f"{format_bytes(plan.memory_limit_bytes)} each{_said(plan.memory_source)}",
        ),
        ("memory per task", _task_memory(plan)),
        ("memory per worker", format_bytes(plan.worker_bytes)),
        ("flops", f"{plan.flops:.3e}"),
        ("estimated time", _estimate(plan)),
        *_figures(plan),
        *more,
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


def _operation(plan: MatmulPlan) -> str:
    """How the operands are used, when not plainly A @ B."""
    ta, tb = plan.transposed
    if plan.symmetric:
        return f"Gram {'Xᵀ·X' if ta else 'X·Xᵀ'} (tiles on and above the diagonal), "
    if ta or tb:
        return f"{'Aᵀ' if ta else 'A'} @ {'Bᵀ' if tb else 'B'}: "
    return ""


PRECISION_TEXT = {
    "fp32": "the dtype's own arithmetic",
    "tf32": "tensor cores, factors rounded to TF32: ~2^-10 relative per product",
    "3xtf32": "tensor cores, three TF32 products per step (float32-class accuracy)",
}


def arithmetic(precision: str, compute_dtype: str) -> str:
    """The arithmetic a product runs in, as the plan and the summary name it: ``--precision
    fp32`` (the default) is the accumulator's own, so fp64 for float64 and exact for integers
    (their products that could overflow are refused)."""
    if precision != "fp32":
        return precision
    dt = np.dtype(compute_dtype)
    if dt.kind == "f":
        return f"fp{dt.itemsize * 8}"
    if dt.kind == "c":
        return f"fp{dt.itemsize * 4} complex"
    return f"exact {dt}"


def _precision(plan: MatmulPlan) -> str:
    """The arithmetic asked for; tensor-core rates are not modelled (unmeasured here)."""
    text = f"{arithmetic(plan.precision, plan.compute_dtype)} ({PRECISION_TEXT[plan.precision]})"
    if plan.precision != "fp32" and plan.device is not None:
        text += "; time modelled at the fp32 rate"
    return text


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
    seconds = plan.estimated_seconds + plan.costs.setup_seconds
    where = f"{plan.workers} worker(s)" + (f", one {plan.device.name} each" if plan.device else "")
    overlap = "; stages overlapped" if plan.device else ""
    exact = f" ({seconds:.1f} s)" if seconds >= 60 else ""
    return f"{format_duration(seconds)}{exact} on {where}{overlap}"


DEVICE_SOURCES = {
    VENDOR: "vendor figures (datasheet peaks; not measured by us)",
    "calibrated": "measured on the workers",
    "emulated": "the emulated device's settings",
}


def _figures(plan: MatmulPlan) -> tuple[tuple[str, str], ...]:
    """Where each rate of the estimate comes from: calibrated on this host, measured on a
    device (the workers', or saved by `doctor`), or a vendor's figures."""
    costs = plan.costs
    decode = 1 / max(costs.decode.per_byte, 1e-15)
    host = (
        f"CPU model calibrated on {costs.machine}: "
        f"{costs.flops_per_second / 1e9:.0f} GFLOP/s and {decode / 1e9:.1f} GB/s decode per "
        "thread, plus a cost per chunk"
    )
    storage = _storage(costs)
    d = plan.device
    if d is None:
        return (("host figures", host), ("storage", storage))
    source = DEVICE_SOURCES.get(d.source) or f"measured by doctor, {d.source}"
    device = (
        f"{d.name}, {source}: {d.flops(plan.compute_dtype) / 1e12:.1f} TFLOP/s"
        f"{f' x {plan.flops_fraction:.2f} for this backend' if plan.flops_fraction != 1 else ''}"
        f", {d.h2d_bytes_per_second / 1e9:.0f} GB/s host-to-device, {plan.decode_threads} "
        "host thread(s) decoding per GPU"
    )
    if d.decodes_chunks:
        device += (
            f"; zstd decoded on the device at {panel_decode_rate(plan, d) / 1e9:.1f} GB/s "
            f"(a frame per chunk, one thread block each; {d.decode_bytes_per_second / 1e9:.0f} "
            "GB/s peak, assumed), counted in the kernel's time"
        )
    return (("device figures", device), ("host figures", host), ("storage", storage))


def _storage(costs: CostModel) -> str:
    """The rates the storage and write terms are modelled at, each with where it comes from."""
    reads = _rate("reads", costs.read_rate, "--storage-gbps", costs.read.per_byte)
    writes = _rate("writes", costs.write_rate, costs.write_source, costs.write.per_byte)
    hint = "; --storage-gbps sets a shared file system's or an object store's"
    hint = "" if costs.read_rate else hint
    return f"{reads}, {writes}{hint}"


def _rate(what: str, given: float | None, flag: str, per_byte: float) -> str:
    """A storage rate: the one given, per worker (by ``flag``), else this host's calibrated
    local one, per thread."""
    if given:
        return f"{what} {given / 1e9:g} GB/s per worker ({flag})"
    local = 1 / max(per_byte, 1e-15) / 1e9
    return f"{what} {local:.1f} GB/s per thread (this host's calibrated local {what})"


def _said(source: str) -> str:
    return f" ({source})" if source else ""


SPEEDUP_WORTH_TELLING = 1.3
"""Backends' modelled times are listed when the fastest is this much faster than the plan's."""


def format_backends(times: tuple[tuple[str, float], ...], plan: MatmulPlan) -> str | None:
    """Each GPU backend's modelled time and the option that selects the fastest, when it is
    SPEEDUP_WORTH_TELLING faster than another; None when they are about even."""
    if len(times) < 2:
        return None
    fastest, best = min(times, key=lambda t: t[1])
    slowest = max(t for _, t in times)
    if slowest < SPEEDUP_WORTH_TELLING * best:
        return None
    listed = ", ".join(f"{name} {format_duration(t)}" for name, t in times)
    return (
        f"{listed}: --backend {fastest} is modelled {slowest / best:.1f}x faster than the "
        f"slowest (vendor figures; each backend's share of the peak is assumed, not measured: "
        "`make gpu-session` on that GPU measures them)"
    )


def _resources(plan: MatmulPlan) -> str:
    seconds = plan.resource_seconds or cpu_resource_seconds(plan)
    where = "per worker" if plan.device is not None else "thread-seconds per worker"
    terms = ", ".join(f"{name} {value:.2f}" for name, value in seconds)
    setup = plan.costs.setup_seconds
    return f"{terms} ({where}); setup {setup:.2f} (interpreter, cluster, OUT)"


def format_summary(result: MultiplyResult) -> str:
    seconds = max(result.seconds, 1e-9)
    plan = result.plan
    verified = {None: "not run", True: "passed", False: "FAILED"}[result.verified]
    computed = plan.flops * result.tiles_computed // max(plan.n_tiles, 1)  # skipped: not ours
    return (
        f"done: {result.shape[0]}x{result.shape[1]} {result.dtype} in {result.seconds:.2f} s "
        f"({computed / seconds / 1e9:.1f} GFLOP/s, backend {result.backend}, "
        f"precision {arithmetic(plan.precision, plan.compute_dtype)}); "
        f"tiles computed {result.tiles_computed}, skipped {result.tiles_skipped}; "
        f"{_reads(result)}; verify {verified}"
        + (f"; {std.kind}: {std.counts()}" if (std := result.standardize) is not None else "")
    )


def _reads(result: MultiplyResult) -> str:
    """The bytes read against the least any schedule reads for what this run computed: a
    --resume's part, never the whole product (its bound would flatter the part)."""
    plan, read = result.plan, format_bytes(result.bytes_read)
    if not result.tiles_computed:
        return f"read {read} (no tile computed in this run)"
    if (part := result.read_bound_bytes) is not None:
        ratio = _ratio(result.bytes_read, part)
        return f"read {read} ({ratio} x lower bound of the part computed in this run)"
    if result.tiles_skipped:
        return f"read {read} (for the part computed in this run, whose lower bound is not known)"
    return f"read {read} ({_ratio(result.bytes_read, plan.lower_bound_read_bytes)} x lower bound)"


def _layout(plan: MatmulPlan) -> str:
    (r, c), shards = plan.out.chunks, plan.out.shards
    return f"{r}x{c}" + (f" in shards of {shards[0]}x{shards[1]}" if shards else "")


def format_accounting(result: MultiplyResult) -> str:
    """Where the tile tasks' time went (thread-seconds: wall time summed over their threads),
    what the workers' processes used, and their CPU-seconds by kind (pipeline.cputime: the kinds
    sum to user + system). Each figure carries its unit: both sets have a ``product``."""
    phases = ", ".join(f"{k} {v:.3f} thread-s" for k, v in result.phases.items())  # tiny: ms
    usage = result.usage
    cpu = (
        f"workers' CPU: user {usage['user_seconds']:.2f} s, system {usage['system_seconds']:.2f}"
        f" s, {int(usage['page_faults'])} page faults"
        if usage
        else "workers' CPU: not measured"
    )
    kinds = ", ".join(
        f"{row} {usage[f'cpu_{row}']:.2f} CPU-s" for row in ROWS if f"cpu_{row}" in usage
    )
    split = f"; workers' CPU-seconds by kind: {kinds}" if kinds else ""
    head = "time: tile tasks' thread-seconds (wall time summed over their threads)"
    return f"{head}: {phases or 'none'}; {cpu}{split}"


def format_verify(result: VerifyResult) -> str:
    """verify's line on stdout; non-finite counts are added when there are any."""
    status = "ok" if result.passed else "FAILED"
    worst = (
        f"worst residual/tolerance {result.worst_ratio:.3g} at row {result.worst_row}"
        if result.worst_row >= 0
        else "no finite row to check"
    )
    line = f"verify {status}: {result.rounds} round(s), {worst}"
    if result.asymmetric is not None:  # a Gram product's
        line += f"; {result.asymmetric} element(s) differ from their mirror"
    if result.finite_inputs and result.pattern_matches:
        return line
    a = _nonfinite(result.a_nonfinite, result.a_nonfinite_rows, "row")
    b = _nonfinite(result.b_nonfinite, result.b_nonfinite_columns, "column")
    pattern = "matches" if result.pattern_matches else "differs"
    finite = "FAILED" if _finite_part_failed(result) else "verified"
    return (
        f"{line}; A has {a}, B has {b}; C's non-finite pattern {pattern}; the finite part {finite}"
    )


def format_verify_error(result: VerifyResult) -> str:
    """The one ``error:`` line of a failed verify: what differs, where, and what to do."""
    problems = [_unexpected(result)] if result.c_unexpected else []
    if result.c_missing:
        problems.append(
            f"C has {result.c_missing} finite value(s) where a non-finite row of A or column "
            "of B makes the product non-finite"
        )
    if result.first_mismatch is not None:
        problems.append(
            f"first at row {result.first_mismatch[0]}, column {result.first_mismatch[1]}"
        )
    if result.asymmetric:
        problems.append(f"{result.asymmetric} element(s) differ from their mirror in Cᵀ")
    if _finite_part_failed(result):
        problems.append(
            f"worst residual/tolerance {result.worst_ratio:.3g} at row {result.worst_row}"
        )
    blocks = ", ".join(f"{r0}:{r1}" for r0, r1 in result.failing_row_blocks[:10])
    more = (
        f" and {len(result.failing_row_blocks) - 10} more"
        if len(result.failing_row_blocks) > 10
        else ""
    )
    return (
        f"C != {result.product} in row block(s) {blocks}{more}: {'; '.join(problems)}; "
        f"recompute C with `{result.recompute}`"
    )


def report_context(
    path: str | None, storage_options: dict[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """distributed's performance report of what runs inside, saved as self-contained HTML at
    ``path`` (Bokeh's JavaScript inlined: it opens offline); nothing when ``path`` is None.
    Needs a default distributed Client, like ``performance_report``."""
    if not path:
        return contextlib.nullcontext()
    return _report(path, storage_options)


@contextlib.contextmanager
def _report(path: str, storage_options: dict[str, Any] | None) -> Iterator[None]:
    from distributed import performance_report

    from pipeline.store.report_file import staged

    with (
        staged(path) as target,
        performance_report(filename=target, mode="inline", storage_options=storage_options),
    ):
        yield


def add_to_report(
    path: str, result: MultiplyResult, storage_options: dict[str, Any] | None = None
) -> None:
    """Put the job's accounting (thread-seconds per phase, the workers' CPU and page faults)
    and summary at the top of the saved performance report."""
    import html

    from pipeline.store.report_file import read_report, write_report

    section = (
        '<section id="tilegemm-accounting" style="font-family:monospace;padding:8px">'
        f"<h3>zarr-tilegemm</h3><pre>{html.escape(format_summary(result))}\n"
        f"{html.escape(format_accounting(result))}</pre></section>"
    )
    page = read_report(path, storage_options).decode("utf-8", "replace")
    at = page.find("<body>")
    page = page[: at + 6] + section + page[at + 6 :] if at >= 0 else section + page
    write_report(path, page.encode(), storage_options)


def _unexpected(result: VerifyResult) -> str:
    n, overflow = result.c_unexpected, result.c_overflow
    head = f"C has {n} non-finite value(s) where A and B imply finite ones"
    if not overflow:
        return f"{head}, none of them an overflow (|A_i|·|B_j| is inside C's range): wrong elements"
    maybe = (
        f"{overflow} where |A_i|·|B_j| reaches the range of C's dtype, maybe overflows (store A "
        "and B as float64 to avoid them)"
    )
    if overflow == n:
        return f"{head}: {maybe}"
    return f"{head}: {maybe}; {n - overflow} that cannot be overflows: wrong elements"


def _nonfinite(values: int, lines: int, what: str) -> str:
    return f"{values} non-finite value(s) in {lines} {what}(s)" if values else "0"


def _finite_part_failed(result: VerifyResult) -> bool:
    return result.worst_row >= 0 and not result.worst_ratio <= 1.0


def _ratio(x: int, y: int) -> str:
    return f"{x / y:.2f}" if y else "n/a"


def format_decomposition(result: Any) -> str:
    """A decomposition's done line: what it wrote, the spectrum's head, the passes."""
    n, p = result.shape
    shown = ", ".join(f"{v:.4g}" for v in result.singular_values[:5])
    more = ", ..." if len(result.singular_values) > 5 else ""
    ratio = float(np.nansum(result.explained_variance_ratio))
    return (
        f"done: {result.kind} of {n}x{p}, {result.components} component(s) in "
        f"{result.seconds:.2f} s; singular values {shown}{more}; explained variance "
        f"{ratio:.1%}; {result.x_passes} pass(es) over X"
        + (f" (backend {result.backend})" if result.backend else "")
        + f", steps run {result.steps_run}, kept {result.steps_skipped}"
    )


def format_decomposition_check(check: Any) -> str:
    """verify's line for a decomposition: each check's worst value against its tolerance."""
    status = "ok" if check.passed else "FAILED"
    line = (
        f"verify {status}: {check.kind}: components orthonormal to {check.orthonormality:.2g} "
        f"(tolerance {check.orthonormality_tolerance:.2g}); scores orthogonal with the singular "
        f"values as norms to {check.norms:.2g} of the tolerance; residual on {check.sampled} "
        f"sampled observation(s) {check.residual:.3g} (tolerance {check.residual_tolerance:.3g})"
    )
    return line + (f"; {check.nonfinite} non-finite element(s)" if check.nonfinite else "")

"""The job: validated inputs and a plan, frozen, until ``execute`` runs it on a cluster.

``pipeline.prepare`` builds a ``MatmulJob`` with no side effects (no cluster, nothing written);
``str(job)`` is the dry-run table; ``job.execute(client=None)`` re-plans for the live workers,
then creates (or resumes) OUT, runs the tiles, and marks OUT complete.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from distributed import Client

from cluster.lifecycle import check_scheduler
from kernels.backends import get_backend
from pipeline import settings
from pipeline.accumulate import state as accumulate
from pipeline.accumulate.room import check_room_for_c, describe_room_for_c, room_for_c
from pipeline.errors import JobError, UsageError
from pipeline.facts.devices import calibrated_device, emulated_params
from pipeline.facts.job_plan import (
    backend_times,
    check_job_precision,
    fingerprint,
    plan_for,
    planning_backend,
)
from pipeline.options.job_options import JobOptions, MultiplyResult
from pipeline.options.product import for_python
from pipeline.plan.gpu_candidate import staging_bytes
from pipeline.plan.layout import DEFAULT_DIMENSIONS
from pipeline.plan.limits import computed_regions, read_lower_bound
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.spec import ArraySpec, StoreSpec
from pipeline.plan.standardize import Standardize
from pipeline.plan.standardize import describe as describe_standardize
from pipeline.run import moments
from pipeline.run.client import (
    check_gpu_decode,
    check_tensor_simulator,
    collect,
    describe_workers,
    release_panels,
    resolve_backend,
    submit_plan,
    usage_since,
    worker_usage,
)
from pipeline.run.rollback import roll_back_after_failure, rolled_back
from pipeline.run.spec import TaskSpec
from pipeline.sensitive.text import redact_url
from pipeline.sensitive.values import warn_if_exposed
from pipeline.store import inputs, journal, owned, resume
from pipeline.store.fs import local_path
from pipeline.store.in_memory import TemporaryOperands
from pipeline.store.lock import HeldLock
from pipeline.store.output import Output, output_compressors
from pipeline.store.record import OutRecord
from pipeline.store.signature import Listing, metadata_digest
from pipeline.store.space import Room, check_room, describe_room, room_for
from pipeline.summary import add_to_report, format_backends, format_plan, report_context

log = logging.getLogger("pipeline")
__all__ = [
    "JobOptions",
    "MatmulJob",
    "MultiplyResult",
    "fingerprint",
    "plan_for",
    "planning_backend",
]


@dataclass(frozen=True)
class MatmulJob:
    """``out = a @ b``, validated and planned, not yet run."""

    store: StoreSpec
    a: ArraySpec
    b: ArraySpec
    options: JobOptions
    inputs_digest: str
    """Digest of both inputs' Zarr metadata (codecs, fill value, attributes...)."""
    state: dict[str, Any] | None
    """OUT's attributes when it already exists (ours), else None."""
    plan: MatmulPlan
    """Planned for the cluster the options describe; ``execute`` re-plans for the live one."""
    dimension_names: tuple[str, str] = DEFAULT_DIMENSIONS
    """OUT's dimension names (A's rows, B's columns), for xarray."""
    key_encodings: tuple[tuple[str, str], tuple[str, str]] = (("default", "/"),) * 2
    """A's and B's chunk key encodings (name, separator): --resume maps changed keys to tiles."""
    live: dict[str, Any] | None = None
    """describe_workers() of the cluster the plan was made for (None: planned before one)."""
    operands: TemporaryOperands | None = field(default=None, repr=False, compare=False)
    """The temporary copies of A and B given as arrays in memory (None: none), removed once
    the job has run (pipeline.store.in_memory)."""

    @property
    def output(self) -> Output:
        return Output(self.store.out_url, self.store.storage_options)

    def __repr__(self) -> str:
        """One line for a notebook (the fields hold the plan, the options and the workers)."""
        out, store = self.plan.out, self.store
        a, b = (
            ((self.operands and self.operands.shown(url)) or _shown(url)) + ("ᵀ" if t else "")
            for url, t in zip((store.a_url, store.b_url), store.transposed, strict=True)
        )
        kind = "gram " if store.symmetric else ""
        return (
            f"<MatmulJob {kind}{a} @ {b} -> {_shown(store.out_url)}: {out.shape[0]}x"
            f"{out.shape[1]} {out.dtype}, {self.plan.n_tiles} tile(s) on {self.plan.workers} "
            f"worker(s), backend {self.options.backend}, {self._what_happens_to_out()} "
            "(print(job) for the plan)>"
        )

    def _what_happens_to_out(self) -> str:
        opts, name = self.options, self._out_name
        if opts.accumulate:
            return "adds into C"
        if self.state is None:
            return f"writes a new {name}"
        return f"resumes {name}" if opts.resume else f"replaces {name}"

    @for_python
    def describe(self) -> str:
        """The plan as a table (what --dry-run prints), with OUT's size and room and, when
        they differ, each GPU backend's modelled time."""
        lines: tuple[tuple[str, str], ...] = ()
        if (std := self.options.standardize) is not None:
            lines += (("standardized", describe_standardize(std)),)
        if self.options.accumulate and (room := room_for_c(self.output)) is not None:
            lines += (("C", describe_room_for_c(room)),)
        elif room := self.room():
            lines += ((self._out_name, describe_room(room)),)
        if backends := format_backends(self.backend_times(), self.plan):
            lines += (("backends", backends),)
        return format_plan(self.plan, lines)

    @for_python
    def backend_times(self) -> tuple[tuple[str, float], ...]:
        """Each GPU backend's modelled seconds on the same workers, when the plan rests on a
        device's vendor figures (pipeline.facts.job_plan.backend_times)."""
        return backend_times(
            self.a, self.b, self.options, self.state, self.live, self.plan,
            transposed=self.store.transposed, symmetric=self.store.symmetric,
        )  # fmt: skip

    @property
    def _out_name(self) -> str:
        return "G" if self.store.symmetric else "OUT"

    @for_python
    def room(self) -> Room | None:
        """OUT's size and the free space where it goes (None: --accumulate writes into C's
        own chunks)."""
        if self.options.accumulate:
            return None
        out = self.plan.out
        existing = self.state is not None and (self.options.overwrite or self.options.resume)
        needed = out.shape[0] * out.shape[1] * np.dtype(out.dtype).itemsize
        compressed = output_compressors(out.dtype) is not None
        return room_for(self.store.out_url, needed, compressed, existing)

    __str__ = describe

    @for_python
    def for_cluster(self, client: Client, backend: str | None = None) -> MatmulJob:
        """The same job planned for the workers of ``client`` (and a resolved backend)."""
        chosen = backend or planning_backend(self.options.backend, self.options.device_class)
        live = describe_workers(client)
        if get_backend(chosen).calibrates:  # a real GPU's figures (None in the simulator)
            # the float an integer product runs in: our kernels' rates are measured in floats
            live["device"] = calibrated_device(client, self.plan.product_dtype)
        plan = plan_for(
            self.a, self.b, self.options, self.state, live, chosen,
            transposed=self.store.transposed, symmetric=self.store.symmetric,
        )  # fmt: skip
        return replace(self, plan=plan, live=live)

    @for_python
    def execute(self, client: Client | None = None) -> MultiplyResult:
        """Run the job on ``client`` (or a cluster started from the options, then closed).
        OUT is claimed (created exclusively, locked, re-checked) before any cluster starts.
        The temporary copies of arrays in memory are removed afterwards, whatever happens."""
        if self.operands is None:
            return self._execute(client)
        with self.operands.used():
            return self._execute(client)

    def _execute(self, client: Client | None) -> MultiplyResult:
        started = time.perf_counter()
        opts = self.options
        if (room := self.room()) is not None:  # before anything is created
            out = self.plan.out
            check_room(room, self._out_name, self.store.out_url, out.shape, out.dtype)
        elif opts.accumulate and not (opts.resume or (self.state or {}).get("accumulation")):
            # before the first of C's objects is moved; a resume or a rollback to finish
            # needs no more room than C has taken already
            check_room_for_c(room_for_c(self.output), self.store.out_url)
        report = report_context(opts.report, opts.storage_options)
        current = (lambda: accumulate.snapshot(self.output)) if opts.accumulate else None
        check_scheduler(opts.cluster)  # a wrong address is refused before OUT is created
        claim = self.output.claim(
            self.state, overwrite=opts.overwrite, resume=opts.resume, current=current
        )
        with claim as (held, state), _connect(client, opts) as c, report:
            self._check_inputs_unchanged()  # under OUT's lock, before anything is written
            warn_if_exposed(c, opts.storage_options)
            backend = resolve_backend(
                c, opts.backend, self.plan.compute_dtype, self.plan.panel_dtype
            )
            if opts.gpu_decode:
                check_gpu_decode(c, backend)
            check_job_precision(opts.backend, backend, self.plan.compute_dtype, opts.precision)
            check_tensor_simulator(c, backend, opts.precision)
            plan = self.for_cluster(c, backend).plan
            spec = replace(
                self._task_spec(plan, backend), lock_token=held.token, out_folder=held.folder
            )
            std = None  # a covariance's, correlation's or kinship's, measured before any tile
            if opts.standardize is not None:
                std = moments.measure(
                    c, self.store.a_url, self.store.storage_options, opts.standardize,
                    split=self.store.splits[0],
                )  # fmt: skip
            at_start = resume.listings(self.store)
            self.output.check_apart(  # again under OUT's lock, before anything is written
                [("A", self.store.a_url), ("B", self.store.b_url)]
            )
            skip = self._start_output(plan, spec.fingerprint, state, at_start)
            resumed = self._written_rows(plan, spec.fingerprint, skip) if opts.resume else {}
            before = worker_usage(c)
            futures: dict[tuple[int, int], Any] = {}
            try:
                futures = submit_plan(c, plan, spec, skip, resumed, std)
                run = collect(c, futures, plan, opts.progress, spec.run_id)
            except Exception as e:  # an interrupted accumulation is kept for --resume instead
                keys = [f.key for f in futures.values()]
                if opts.accumulate and roll_back_after_failure(c, keys, self.output):
                    raise rolled_back(e) from e
                raise
            finally:
                release_panels(c, spec.run_id)
            usage = usage_since(c, before)
            self._check_finish(held, at_start)
            if left := owned.remove_partials(local_path(self.output.url)):
                log.info("removed %d temporary chunk file(s) a stopped task left", left)
            if opts.accumulate:  # C's metadata is not ours to mark
                verified = self._finish_accumulation(c) if opts.verify else None
                if verified is not False:
                    accumulate.finish(self.output)  # the originals are no longer needed
            else:
                self.output.mark(spec.fingerprint, complete=True, standardize=std)
                journal.forget_bands(self.output.url, self.output.storage_options)
                verified = self._verify(c, spec.fingerprint, std) if opts.verify else None
            self.output.refresh_consolidated()  # so xarray's open_zarr(group) lists OUT
        seconds = time.perf_counter() - started
        # A resume computes a part: its reads are measured against that part's bound.
        part = computed_regions(plan, skip, resumed) if skip or resumed else None
        result = MultiplyResult(
            plan.out.shape, plan.out.dtype, seconds, run.tiles_computed, len(skip),
            run.bytes_read, backend, plan, verified, run.phases, usage,
            None if part is None else read_lower_bound(plan, part), std,
            url=self.store.out_url, storage_options=self.store.storage_options,
        )  # fmt: skip
        if opts.report:  # where the seconds went, beside distributed's own report
            add_to_report(opts.report, result, opts.storage_options)
        return result

    def _check_inputs_unchanged(self) -> None:
        """The inputs' metadata is still what ``prepare`` planned with."""
        store = self.store
        arrays = [
            inputs.open_input(url, store.storage_options, name)
            for name, url in (("A", store.a_url), ("B", store.b_url))
        ]
        if metadata_digest((arrays[0], arrays[1])) != self.inputs_digest:
            raise UsageError(
                "an input's metadata (shape, chunks, codecs or attributes) changed after this "
                "job was planned; plan it again (rerun the command)"
            )

    def _check_finish(self, held: HeldLock, at_start: dict[str, Listing]) -> None:
        """Before OUT is marked complete: the lock is still ours and no input changed."""
        if not held.still_held():
            raise JobError(
                f"OUT ({self.store.out_url}) lost its lock during the job (removed or taken "
                "by hand?); it is not marked complete: rerun with --resume"
            )
        resume.check_unchanged(self.store, at_start)

    def _task_spec(self, plan: MatmulPlan, backend: str) -> TaskSpec:
        rows, cols = plan.grid
        pairs = plan.busy_threads * plan.panel_pair_bytes
        spec = get_backend(backend)
        return TaskSpec(
            self.store,
            backend,
            plan.compute_dtype,
            plan.out.dtype,
            fingerprint(plan, self.inputs_digest, self._factors()),
            cache_bytes=plan.cache_bytes,
            block_shape=plan.block_shape,
            run_id=uuid.uuid4().hex,
            # A Gram product's X panel: as A by T - c tiles, as B by c + 1 (the diagonal twice).
            panel_uses=(rows + 1, rows + 1) if plan.symmetric else (cols, rows),
            # Panels in the cache, in use and prefetched (a full pool falls back to fresh).
            buffer_bytes=plan.cache_bytes + 3 * pairs,
            staging_bytes=staging_bytes(plan) if spec.make_device else 0,
            decode_threads=plan.decode_threads,
            device_params=tuple(emulated_params().items()) if spec.modelled else (),
            overlap=settings.get("gpu-overlap"),
            read_concurrency=self._read_concurrency(spec.make_device is not None),
            precision=plan.precision,
            panel_dtype=plan.panel_dtype,
            options=self.options,
        )

    def _factors(self) -> dict[str, Any] | None:
        """--alpha, --beta and --accumulate, or a Gram product's standardization, and an N-D
        field's split, for the fingerprint (None: a plain product's)."""
        opts = self.options
        std = opts.standardize
        # a field read another way may be a product of the same shape: its split tells them apart
        fields = {"splits": list(self.store.splits)} if any(self.store.splits) else {}
        if std is not None:
            found: list[Any] = [std.mode, std.axis, std.ddof]
            if std.mode == "kinship" and std.form != "standardized":
                found.append(std.form)  # an older G's fingerprint stays the same
            if std.missing is not None or std.code is not None:
                found += [std.missing, std.code]
            return {"standardize": found} | fields
        if not opts.accumulate and opts.alpha == 1:
            return fields or None
        return {"alpha": opts.alpha, "beta": opts.beta, "accumulate": opts.accumulate} | fields

    def _read_concurrency(self, staged: bool) -> int:
        """From local files (CPU-bound decoding) 2 chunks at once per read, 1 on the staged GPU
        path, whose decode threads already read side by side (fewer fresh codec buffers: a cold
        8192² emulated job 1.28 -> 1.11 s, medians of 6); zarr's default elsewhere. Config
        ``tilegemm.read-concurrency`` overrides (0: zarr's default)."""
        setting = settings.get("read-concurrency")
        if setting != "auto":
            return int(setting)
        local = all(local_path(u) is not None for u in (self.store.a_url, self.store.b_url))
        return (1 if staged else 2) if local else 0

    def _start_output(
        self, plan: MatmulPlan, fp: str, state: dict[str, Any] | None, now: dict[str, Listing]
    ) -> set[tuple[int, int]]:
        """Create OUT (or keep it for --resume) and return the tiles already done; the caller
        holds OUT's lock."""
        if self.options.accumulate:
            return accumulate.start(
                self.output, plan, fp, now, self.key_encodings, resume=self.options.resume
            )
        if self.options.resume and state is not None:
            # refuses another fingerprint, naming what differs
            done = self.output.finished_tiles(
                plan, fp, state, alpha=self.options.alpha, standardize=self.options.standardize
            )
            return done - resume.forget_stale(
                self.output, plan, now, self.key_encodings, self.store.splits
            )
        if state is not None:
            self.output.remove_ours()  # --overwrite: our own files only, never a foreign one
        alpha = self.options.alpha
        record = OutRecord(
            fingerprint=fp, complete=False, tile_shape=plan.tile_shape,
            # What verify checks: the same operation, α and tolerance.
            transpose_a=plan.transposed[0], transpose_b=plan.transposed[1],
            symmetric=plan.symmetric, precision=plan.precision,
            alpha=None if alpha == 1 else float(alpha),
            standardize=None if self.options.standardize is None
            else self.options.standardize.record(),
        )  # fmt: skip
        self.output.create(
            plan.out.shape, plan.out.chunks, plan.out.dtype, record,
            shards=plan.out.shards, dimension_names=self.dimension_names,
            zarr_format=self.options.output.zarr_format,
        )  # fmt: skip
        # After the array: a folder holding listings but no array of ours is never a new OUT.
        self.output.save_input_listings(now)
        return set()

    def _written_rows(
        self, plan: MatmulPlan, fp: str, skip: set[tuple[int, int]]
    ) -> dict[tuple[int, int], tuple[int, int]]:
        """--resume: the tiles in flight when the last run stopped, and how far each got."""
        journal_url = (
            accumulate.sidecar(self.output) if self.options.accumulate else self.output
        ).url
        found = journal.written_rows(
            journal_url, self.output.url, self.output.storage_options, plan, fp, skip
        )
        if found:
            starts = {t.index: t.rows[0] for t in plan.tiles()}
            rows = sum(first - starts[i] for i, (first, _) in found.items())
            log.info("resume: %d tile(s) in flight keep %d written row(s)", len(found), rows)
        return found

    def _finish_accumulation(self, client: Client) -> bool:
        """Verify α·A·B + β·C_old against C while the originals are still kept; on a failure
        C is rolled back to them."""
        from pipeline.verify.check import verify_product

        store, opts = self.store, self.options
        original = f"{accumulate.sidecar(self.output).url}/{accumulate.ORIGINAL}"
        result = verify_product(
            client, store.a_url, store.b_url, store.out_url, store.storage_options,
            progress=opts.progress, transpose_a=store.transposed[0],
            transpose_b=store.transposed[1], alpha=opts.alpha, c_old=(original, opts.beta),
            precision=opts.precision,
        )  # fmt: skip
        if not result.passed:
            restored = accumulate.roll_back(self.output)
            log.error(
                "verification failed: C differs from alpha*A@B + beta*C_old; C is put back "
                "as it was before this accumulation (%d stored object(s) moved home)",
                restored,
            )
        return result.passed

    def _verify(self, client: Client, fp: str, std: Standardize | None) -> bool:
        from pipeline.verify.check import verify_product

        store = self.store
        result = verify_product(
            client, store.a_url, store.b_url, store.out_url, store.storage_options,
            progress=self.options.progress, standardize=std, splits=store.splits,
        )  # fmt: skip
        self.output.mark(fp, verified=result.passed)
        return result.passed


def _shown(url: str) -> str:
    """A URL as a notebook shows it: secrets hidden, a local path inside the working folder
    relative to it."""
    path = local_path(url)
    if path is not None and os.path.isabs(path):
        relative = os.path.relpath(path)
        if not relative.startswith(os.pardir):
            url = relative
    return redact_url(url)


@contextlib.contextmanager
def _connect(client: Client | None, options: JobOptions) -> Iterator[Client]:
    if client is not None:
        yield client
        return
    from cluster.lifecycle import start

    with start(options.cluster, options.memory_limit) as c:
        yield c

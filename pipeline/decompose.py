"""PCA and truncated SVD of a stored X by randomized passes (pipeline.plan.decomposition):
a moments pass, 2q + 2 products of X with a tall-skinny array (``multiply`` jobs, with their
plans, kernels, journals and resume), TSQR between them in bands (pipeline.run.bands), and the
small SVD in memory. OUT is a Zarr group (pipeline.store.decomposition); every finished step
is in its record, so ``resume`` goes on from the first unfinished one."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from distributed import Client

from pipeline.errors import InputError, JobError, OutputExistsError, UsageError
from pipeline.options import spelling
from pipeline.options.declaration import Option
from pipeline.options.product import DECLARED
from pipeline.plan import decomposition as plan
from pipeline.plan.decomposition import Request, Sizes, Step
from pipeline.plan.spec import ArraySpec
from pipeline.plan.standardize import merge as merge_moments
from pipeline.run import bands, moments, resident
from pipeline.run.bands import Apply, Fix, Where
from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr
from pipeline.store import groups, in_memory, inputs
from pipeline.store.decomposition import OWN_NAMES, PASSES, Decomposition
from pipeline.store.fields import stored_names
from pipeline.store.fs import absolute, check_protocol, resolve_url
from pipeline.store.locate import locate, merge_options
from pipeline.store.output import Output
from pipeline.store.owned import check_finished
from pipeline.store.signature import data_listing, encode, metadata_digest

log = logging.getLogger("pipeline")

RESULT_ARRAYS = (
    "components", "scores", "singular_values", "explained_variance",
    "explained_variance_ratio", "mean", "scale",
)  # fmt: skip
COMPONENT = "component"
"""The dimension name of the components' axis."""


@dataclass(frozen=True)
class DecompositionResult:
    """What a decomposition wrote: OUT's URL, the spectra (small, in memory) and timings."""

    kind: str
    shape: tuple[int, int]
    """M's shape (observations x variables)."""
    components: int
    singular_values: np.ndarray
    explained_variance_ratio: np.ndarray
    seconds: float
    steps_run: int
    steps_skipped: int
    x_passes: int
    """Passes over X this run made (a resume's finished ones not counted)."""
    backend: str = ""
    """The product passes' backend ("" when a resume ran none)."""
    url: str = ""
    storage_options: dict[str, Any] = field(
        default_factory=dict, repr=False, metadata=SENSITIVE_FIELD
    )

    def open(self) -> Any:
        """OUT as a read-only ``zarr.Group``."""
        import zarr

        from pipeline.store.fs import fsspec_options

        opts = fsspec_options(self.url, self.storage_options) if "://" in self.url else None
        return zarr.open_group(self.url, mode="r", storage_options=opts)

    def to_dask(self) -> dict[str, Any]:
        """Each of OUT's arrays as a ``dask.array.Array`` (lazily, OUT's chunks)."""
        import dask.array as da

        group = self.open()
        return {name: da.from_zarr(group[name]) for name in RESULT_ARRAYS if name in group}

    def to_xarray(self) -> Any:
        """OUT as an ``xarray.Dataset`` (``xr.open_zarr``)."""
        import xarray as xr

        from pipeline.store.fs import fsspec_options

        opts = fsspec_options(self.url, self.storage_options) if "://" in self.url else None
        return xr.open_zarr(self.url, storage_options=opts)


@dataclass(frozen=True)
class DecompositionJob:
    """A decomposition checked and planned, nothing written yet."""

    x_url: str
    out: Decomposition
    request: Request
    x_shape: tuple[int, int]
    x_chunks: tuple[int, int]
    x_dtype: str
    names: tuple[str, str]
    """M's dimension names: observations, variables."""
    digest: str
    state: dict[str, Any] | None
    product: dict[str, Any]
    """The options every product pass takes (backend, memory limits, progress)."""
    overwrite: bool = False
    resume: bool = False
    cluster: Any = None
    memory_limit: Any = None
    product_plan: str = ""
    product_seconds: float | None = None
    passes_from: str = "auto"
    """Where the passes read X: "auto" (held in the workers' memory when it fits), "memory"
    or "storage" (pipeline.plan.decomposition.hold)."""
    operands: Any = field(default=None, repr=False, compare=False)
    storage_options: dict[str, Any] = field(
        default_factory=dict, repr=False, metadata=SENSITIVE_FIELD
    )

    __repr__ = redacted_repr

    @property
    def shape(self) -> tuple[int, int]:
        """M's shape: observations x variables."""
        r, c = self.x_shape
        return (c, r) if self.request.rows else (r, c)

    @property
    def chunks(self) -> tuple[int, int]:
        r, c = self.x_chunks
        return (c, r) if self.request.rows else (r, c)

    def sizes(self) -> Sizes:
        n, p = self.shape
        return Sizes(n, p, n * p * np.dtype(self.x_dtype).itemsize, self.request.width)

    def fingerprint(self) -> str:
        words = [self.x_url, self.digest, self.request.kind, self.request.words()]
        return hashlib.sha256("\n".join(words).encode()).hexdigest()[:32]

    def describe(self) -> str:
        seconds = None
        if self.product_seconds is not None:
            seconds = plan.total_seconds(self.request, self.product_seconds)
        return plan.describe(
            self.request, self.sizes(), self.product_plan.splitlines(), seconds, self.passes_from
        )

    __str__ = describe

    @property
    def output_dtype(self) -> str:
        """Components, scores and the passes' sketches: float32 for float32 (or narrower
        float) X, whose products then run at its own precision as scikit-learn's do (and at
        the speed of reading it: no float64 copy of each panel); else float64."""
        dt = np.dtype(self.x_dtype)
        return "float32" if dt.kind == "f" and dt.itemsize <= 4 else "float64"

    def execute(self, client: Client | None = None) -> DecompositionResult:
        if self.operands is None:
            return self._execute(client)
        with self.operands.used():
            return self._execute(client)

    def _execute(self, client: Client | None) -> DecompositionResult:
        started = time.perf_counter()
        with self.out.claim(self.state, overwrite=self.overwrite, resume=self.resume) as now:
            record = self._start(now)
            with _connect(client, self) as c:
                runner = _Runner(self, c, record)
                self.out.pin_on_workers(c)
                try:
                    runner.run()
                finally:
                    runner.bands = []  # X's held bands leave the workers with their futures
                    self.out.unpin_on_workers(c)
            if self._x_listing() != record["x_listing"]:
                raise JobError(
                    f"X ({self.x_url}) changed while the decomposition ran (stored objects "
                    "added, removed or rewritten); OUT is not marked complete: rerun with "
                    "--overwrite once X is final"
                )
            self.out.remove(PASSES)
            record["complete"] = True
            self.out.save(record)
        self.out.consolidate()  # zarr would take the lock file, now gone, for a member
        done = record["done"]["finish"]
        return DecompositionResult(
            self.request.kind, self.shape, self.request.components,
            np.asarray(done["singular_values"]), np.asarray(done["ratio"]),
            time.perf_counter() - started, runner.ran, runner.skipped, runner.x_passes,
            runner.backend, url=self.out.url, storage_options=self.storage_options,
        )  # fmt: skip

    def _x_listing(self) -> str:
        """A digest of X's stored objects and their change marks (no data read)."""
        listing = data_listing(self.x_url, self.storage_options)
        return hashlib.sha256(encode({"X": listing})).hexdigest()[:32]

    def _start(self, now: dict[str, Any] | None) -> dict[str, Any]:
        fresh = {
            "kind": self.request.kind, "fingerprint": self.fingerprint(), "complete": False,
            "x": self.x_url, "request": self.request.words(), "arrays": [], "done": {},
            "shape": list(self.shape), "rows": self.request.rows,
            "components": self.request.components, "width": self.request.width,
            "power_iterations": self.request.power_iterations, "x_listing": self._x_listing(),
        }  # fmt: skip
        if now is not None and self.resume and now.get("fingerprint") == fresh["fingerprint"]:
            if now.get("x_listing") == fresh["x_listing"]:
                return now
            log.info("resume: X changed since the interrupted run; its passes are done again")
        if now is not None:
            self.out.remove_ours(now)
        self.out.save(fresh, new=True)
        return fresh


class _Runner:
    """The steps in order, each skipped when the record has it."""

    def __init__(self, job: DecompositionJob, client: Client, record: dict[str, Any]) -> None:
        self.job, self.client, self.record = job, client, record
        self.out = job.out
        self.opts = job.storage_options
        self.ran = self.skipped = self.x_passes = 0
        self.run_id = uuid.uuid4().hex[:8]
        self.backend = ""
        self.hold: bool | None = None
        """X held in the workers' memory (None: not decided yet)."""
        self.bands: list[tuple[tuple[int, int], Any]] = []

    @property
    def done(self) -> dict[str, Any]:
        found: dict[str, Any] = self.record["done"]
        return found

    def _finished(self, step: Step, result: dict[str, Any]) -> None:
        self.done[step.name] = result
        self.out.save(self.record)
        self.ran += 1

    def run(self) -> None:
        all_steps = plan.steps(self.job.request)
        for i, step in enumerate(all_steps, 1):
            if step.name in self.done:
                self.skipped += 1
                continue
            log.info("step %d/%d: %s", i, len(all_steps), _words(step))
            getattr(self, f"_{step.what}")(step)

    # -- helpers
    def _where(self, name: str) -> Where:
        return Where(
            self.out.passes(name) if name not in RESULT_ARRAYS else self.out.at(name), self.opts
        )

    def _length(self, side: str) -> int:
        n, p = self.job.shape
        return n if side == "n" else p

    def _chunk(self, side: str) -> int:
        n, p = self.job.chunks
        return n if side == "n" else p

    def _bands(self, side: str) -> list[tuple[int, int]]:
        rows = plan.band_rows(self._chunk(side), self.job.request.width)
        return plan.bands(self._length(side), rows)

    def _fix(self, side: str, vec: Any) -> Fix:
        centred = self.job.request.center
        return Fix(
            side, None if vec is None else tuple(float(v) for v in vec),
            self.out.at("mean") if centred and side == "p" else None,
            self.out.passes("factor") if self.job.request.scale and side == "p" else None,
        )  # fmt: skip

    def _add_array(self, name: str) -> None:
        if name not in self.record["arrays"]:
            self.record["arrays"].append(name)
            self.out.save(self.record)

    def _create(
        self,
        name: str,
        shape: tuple[int, ...],
        chunks: tuple[int, ...],
        dtype: str,
        dims: tuple[str, ...],
    ) -> None:
        where = name if name in RESULT_ARRAYS else f"{PASSES}/{name}"
        if name in RESULT_ARRAYS:
            self._add_array(name)
        self.out.create(where, shape, chunks, dtype, dims)

    def _map(self, fn: Any, args: Any, *, key: str, items: list[Any]) -> list[Any]:
        futures = [
            self.client.submit(fn, *args(item), key=f"{key}-{i}", pure=False)
            for i, item in enumerate(items)
        ]
        found: list[Any] = self.client.gather(futures)
        return found

    def _copy_coordinates(self) -> None:
        """X's 1-D coordinates along either dimension (a time axis, the lat and lon of a stacked
        space), copied beside the results with their attributes, and named in the results'
        ``coordinates`` attribute so xarray takes them as coordinates."""
        obs, var = self.job.names
        n, p = self.job.shape
        lengths = {obs: n, var: p}
        taken = set(RESULT_ARRAYS) | OWN_NAMES
        extra: dict[str, list[str]] = {obs: [], var: []}
        for name, dim in groups.coordinates_along(self.job.x_url, self.opts, lengths):
            if name in taken:
                continue
            source = inputs.open_input(
                f"{self.job.x_url.rsplit('/', 1)[0]}/{name}", self.opts, name
            )
            attrs = {k: v for k, v in source.attrs.items() if k != "_ARRAY_DIMENSIONS"}
            length = int(source.shape[0])
            self._add_array(name)
            target = self.out.create(
                name, (length,), (min(length, COPY_ELEMENTS),), str(source.dtype), (dim,), attrs,
                fill_value=source.fill_value,
            )  # fmt: skip
            for a in range(0, length, COPY_ELEMENTS):
                target[a : a + COPY_ELEMENTS] = source[a : a + COPY_ELEMENTS]
            if name != dim:
                extra[dim].append(name)
        for array, dim in (("scores", obs), ("components", var)):
            if extra[dim]:
                _attrs(self.out.at(array), self.opts, {"coordinates": " ".join(extra[dim])})

    # -- X held in the workers' memory
    def _held(self) -> list[tuple[tuple[int, int], Any]] | None:
        """X's row bands, read once and held by the workers, when X fits half their memory
        (``passes_from``: "memory" insists, "storage" never); None: each pass reads X."""
        if self.hold is None:
            from pipeline.run.client import describe_workers, resolve_backend

            job = self.job
            live = describe_workers(self.client)
            backend = job.product.get("backend", "auto")
            if job.passes_from == "auto":  # the GPU backends' passes go through their kernels
                backend = resolve_backend(self.client, backend, job.output_dtype)
            self.hold = plan.hold(
                job.passes_from, job.sizes().x_bytes, live["workers"], live["memory_limit"],
                backend,
            )  # fmt: skip
            if self.hold:
                self._load(live["workers"] * live["threads"])
        return self.bands if self.hold else None

    def _load(self, threads: int) -> None:
        job = self.job
        rows = plan.held_rows(job.x_shape, job.x_chunks[0], job.sizes().x_bytes, threads)
        log.info(
            "X fits the workers' memory: read once, in %d band(s), and held for every pass",
            len(plan.bands(job.x_shape[0], rows)),
        )
        self.bands = [
            (
                at,
                self.client.submit(
                    resident.load, job.x_url, self.opts, at, key=f"x-{self.run_id}-{i}"
                ),
            )
            for i, at in enumerate(plan.bands(job.x_shape[0], rows))
        ]
        self.x_passes += 1
        self.backend = "cpu"

    def _held_moments(self, axis: int) -> Any:
        parts = [
            self.client.submit(resident.moments, band, axis, key=f"m-{self.run_id}-{i}")
            for i, (_, band) in enumerate(self.bands)
        ]
        if axis == 0:  # the variables are X's rows: each band holds its own
            return moments.concatenated(self.client.gather(parts))
        while len(parts) > 1:  # a tree in a fixed order: the same sums on any cluster
            pairs = zip(parts[::2], parts[1::2], strict=False)
            merged = [self.client.submit(merge_moments, a, b, pure=False) for a, b in pairs]
            parts = merged + ([parts[-1]] if len(parts) % 2 else [])
        return parts[0].result()

    def _held_product(self, step: Step, transposed: bool) -> None:
        """X S (each band its rows of the product) or Xᵀ S (the bands' shares summed), from
        the held bands, written where a pass over storage writes it."""
        side = step.side
        n_rows, width = self._length(side), self.job.request.width
        self._create(
            step.target,
            (n_rows, width),
            (self._chunk(side), width),
            self.job.output_dtype,
            (side, "l"),
        )
        target, source = self.out.passes(step.target), self.out.passes(step.source)
        self.out.pin_on_workers(self.client, f"{PASSES}/{step.target}")  # made here just now
        if not transposed:
            done = [
                self.client.submit(
                    resident.rows_times,
                    band,
                    at,
                    source,
                    self.opts,
                    target,
                    key=f"p-{step.name}-{self.run_id}-{i}",
                )
                for i, (at, band) in enumerate(self.bands)
            ]
            self.client.gather(done)
            return
        parts = [
            self.client.submit(
                resident.columns_times,
                band,
                at,
                source,
                self.opts,
                key=f"p-{step.name}-{self.run_id}-{i}",
            )
            for i, (at, band) in enumerate(self.bands)
        ]
        while len(parts) > 1:
            pairs = zip(parts[::2], parts[1::2], strict=False)
            parts = [self.client.submit(resident.add, a, b, pure=False) for a, b in pairs] + (
                [parts[-1]] if len(parts) % 2 else []
            )
        self.client.submit(resident.write, parts[0], target, self.opts, pure=False).result()

    # -- steps
    def _moments(self, step: Step) -> None:
        job = self.job
        axis = 0 if job.request.rows else 1
        if self._held() is not None:
            found = self._held_moments(axis)
        else:
            found = moments.gather(self.client, job.x_url, self.opts, axis, None, "X", slabs=True)
            self.x_passes += 1
        plan.check_finite(int(found.nonfinite.sum()), int(found.absent.sum()))
        n, p = job.shape
        m2 = np.asarray(found.m2, dtype=np.float64)
        result: dict[str, Any] = {"count": int(found.count)}
        obs, var = job.names
        if job.request.center:
            self._create("mean", (p,), (self._chunk("p"),), "float64", (var,))
            _put(self.out.at("mean"), self.opts, np.asarray(found.mean))
        factor = np.ones(p)
        if job.request.scale:
            std = np.sqrt(m2 / max(n, 1))
            spread = std > 0
            factor = np.where(spread, 1.0 / np.where(spread, std, 1.0), 0.0)
            self._create("scale", (p,), (self._chunk("p"),), "float64", (var,))
            _put(self.out.at("scale"), self.opts, np.where(spread, std, 1.0))
            self._create("factor", (p,), (self._chunk("p"),), "float64", (var,))
            _put(self.out.passes("factor"), self.opts, factor)
        result["total_ss"] = float((m2 * factor**2).sum())
        self._finished(step, result)

    def _sketch(self, step: Step) -> None:
        req = self.job.request
        self._create(
            "omega",
            (self._length("p"), req.width),
            (self._chunk("p"), req.width),
            self.job.output_dtype,
            ("p", "l"),
        )
        fix = self._fix("p", None)
        target = self._where("omega")
        sums = self._map(
            bands.sketch_task, lambda rows: (target, rows, req.seed, req.width, fix),
            key=f"sketch-{self.run_id}", items=self._bands("p"),
        )  # fmt: skip
        self._finished(step, {"sums": np.sum(sums, axis=0).tolist()})

    def _product(self, step: Step) -> None:
        """A pass over X: ``M S`` (observations' side) or ``Mᵀ S`` (variables'), as a
        ``multiply`` job into OUT's passes."""
        from pipeline.api import prepare

        rows = self.job.request.rows
        # M = X (or Xᵀ): M S reads X as stored (transposed), Mᵀ S the other way
        transpose_a = rows if step.side == "n" else not rows
        if self._held() is not None:
            self._held_product(step, transpose_a)
            self._finished(step, {})
            return
        target = self.out.product_output(step.target)
        existing = target.state() is not None
        job = prepare(
            self.job.x_url, self.out.passes(step.source), target.url,
            transpose_a=transpose_a, resume=existing, storage_options=self.opts,
            **self.job.product,
        )  # fmt: skip
        self.backend = job.execute(self.client).backend
        self.x_passes += 1
        self._finished(step, {})

    def _orthonormalize(self, step: Step) -> None:
        """Q = orth(T(source)) by TSQR; written as Q (observations' side) or F W (variables'),
        with the sums the next correction needs."""
        req, side = self.job.request, step.side
        fix = self._fix(side, self._correction(step.source, side))
        src, _, blocks_, parts = self._tsqr(step.source, side, fix)
        self._create(
            step.target,
            (self._length(side), req.width),
            (self._chunk(side), req.width),
            self.job.output_dtype,
            (side, "l"),
        )
        target = self._where(step.target)
        items = list(zip(parts, blocks_, strict=True))
        found = self._map(
            bands.apply_task,
            lambda item: (src, item[0], fix, Apply(item[1], target=target, scale_rows=side == "p")),
            key=f"apply-{step.name}-{self.run_id}", items=items,
        )  # fmt: skip
        sums = np.sum([f["sums"] for f in found], axis=0)
        self._finished(step, {"sums": sums.tolist()})
        self.out.remove(f"{PASSES}/{step.source}")  # the raw product is not needed again

    def _correction(self, product: str, side: str) -> Any:
        """The rank-one correction's vector for the stored product ``product``: for M S,
        c = μᵀ F S (the sums of the step that wrote S); for Mᵀ Q, s = 1ᵀ Q (None: nothing is
        centred)."""
        if not self.job.request.center:
            return None
        steps = plan.steps(self.job.request)
        operand = next(s.source for s in steps if s.target == product)
        made_by = next(s for s in steps if s.target == operand)
        return self.done[made_by.name]["sums"]

    def _tsqr(
        self, source: str, side: str, fix: Fix, need_r: bool = False
    ) -> tuple[Where, Any, list[Any], list[tuple[int, int]]]:
        """TSQR's first level on the cluster: the R factor and each band's block of the
        second level's Q (one band: no first level unless R is needed)."""
        src = self._where(source)
        parts = self._bands(side)
        if not need_r and len(parts) == 1 and self._length(side) >= self.job.request.width:
            return src, None, [np.eye(self.job.request.width)], parts  # Q is the band's own
        rs = self._map(
            bands.r_task, lambda rows: (src, rows, fix),
            key=f"r-{source}-{self.run_id}", items=parts,
        )  # fmt: skip
        r, blocks_ = plan.stacked_r(rs, self.job.request.width)
        return src, r, blocks_, parts

    def _finish(self, step: Step) -> None:
        """B's SVD from Bᵀ = M_sᵀ Q (step.source) = Q_B R; the components (Q_B Ua)ᵀ and the
        scores Q Va S (Q: step.target), signed as scikit-learn signs them."""
        job, req = self.job, self.job.request
        n, p = job.shape
        k = req.components
        fix = self._fix("p", self._correction(step.source, "p"))
        src, r, blocks_, parts = self._tsqr(step.source, "p", fix, need_r=True)
        ua, s, va, sketched = plan.small_svd(r, k)
        items = list(zip(parts, blocks_, strict=True))
        key = f"peaks-{self.run_id}"
        found = self._map(
            bands.apply_task, lambda item: (src, item[0], fix, Apply(item[1], post=ua)),
            key=key, items=items,
        )  # fmt: skip
        signs = plan.flip_signs([f["peaks"] for f in found])
        obs, var = job.names
        dtype = job.output_dtype
        self._create("components", (k, p), (k, self._chunk("p")), dtype, (COMPONENT, var))
        write = Apply(np.zeros(0), post=ua, target=self._where("components"), transposed=True)
        self._map(
            bands.apply_task,
            lambda item: (src, item[0], fix, replace(write, block=item[1], signs=signs)),
            key=f"components-{self.run_id}", items=items,
        )  # fmt: skip
        self._create("scores", (n, k), (self._chunk("n"), k), dtype, (obs, COMPONENT))
        scores = self._where("scores")
        matrix = va * s[None, :] * signs[None, :]
        q = self._where(step.target)
        sums = self._map(
            bands.project_task, lambda rows: (q, rows, matrix, scores),
            key=f"scores-{self.run_id}", items=self._bands("n"),
        )  # fmt: skip
        score_sums = np.sum(sums, axis=0)
        variance, ratio = plan.explained(req, s, n, self.done["moments"]["total_ss"], score_sums)
        for name, values in (
            ("singular_values", s), ("explained_variance", variance),
            ("explained_variance_ratio", ratio),
        ):  # fmt: skip
            self._create(name, (k,), (k,), "float64", (COMPONENT,))
            _put(self.out.at(name), self.opts, values)
        self._copy_coordinates()
        self._finished(
            step,
            {
                "singular_values": s.tolist(), "ratio": ratio.tolist(),
                "sketch_singular_values": sketched.tolist(),
            },
        )  # fmt: skip


COPY_ELEMENTS = 2**22
"""A coordinate is copied this many elements at a time."""


def _attrs(url: str, options: dict[str, Any], values: dict[str, Any]) -> None:
    from pipeline.store.decomposition import open_array

    open_array(url, options, "r+").attrs.update(values)


def _put(url: str, options: dict[str, Any], values: Any) -> None:
    from pipeline.store.decomposition import open_array

    array = open_array(url, options, "r+")
    array[...] = np.asarray(values, dtype=array.dtype)


def _words(step: Step) -> str:
    if step.what == "moments":
        return "the moments of each variable (one pass over X)"
    if step.what == "sketch":
        return "the random sketch Ω"
    if step.what == "product":
        return f"{step.target} = {'M' if step.side == 'n' else 'Mᵀ'} {step.source} (a pass over X)"
    if step.what == "orthonormalize":
        return f"{step.target} = orth({step.source})"
    return "the small SVD, the components and the scores"


@contextlib.contextmanager
def _connect(client: Client | None, job: DecompositionJob) -> Iterator[Client]:
    if client is not None:
        yield client
        return
    from cluster.lifecycle import start

    with start(job.cluster, job.memory_limit) as c:
        yield c


PRODUCT_KEYS = (
    "backend",
    "memory_limit",
    "device_memory_limit",
    "progress",
    "device_class",
    "storage_gbps",
)


def _prepare_decomposition(
    kind: str,
    x: Any,
    out: Any,
    *,
    components: int,
    oversample: int | None = None,
    power_iterations: int | None = None,
    seed: int = 0,
    scale: bool = False,
    rows: bool = False,
    over: str | None = None,
    overwrite: bool = False,
    resume: bool = False,
    storage_options: dict[str, Any] | None = None,
    cluster: Any = None,
    passes_from: str = "auto",
    **product: Any,
) -> DecompositionJob:
    """Check and plan ``kind`` (pca or svd) of X into the group OUT; nothing written but the
    temporary copy of a numpy or dask X."""
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other; pass one")
    unknown = sorted(set(product) - set(PRODUCT_KEYS))
    if unknown:
        raise TypeError(f"{kind} got unexpected keyword argument(s) {', '.join(unknown)}")
    plan.check_passes_from(passes_from)
    in_memory.refuse_as_out(out)
    (x,), copies = in_memory.stage((x,), ("X",))
    args = (
        kind, x, out, components, oversample, power_iterations, seed, scale, rows, over,
        overwrite, resume, storage_options, cluster, product,
    )  # fmt: skip
    if copies is None:
        return replace(_prepare(*args), passes_from=passes_from)
    with copies.removed_on_error():
        job = _prepare(*args)
        return replace(job, operands=copies, passes_from=passes_from)


def _prepare(
    kind: str, x: Any, out: Any, components: Any, oversample: Any, power_iterations: Any,
    seed: Any, scale: bool, rows: bool, over: str | None, overwrite: bool, resume: bool,
    storage_options: dict[str, Any] | None, cluster: Any, product: dict[str, Any],
) -> DecompositionJob:  # fmt: skip
    located = [locate(x, "X"), locate(out, "OUT")]
    options = merge_options(
        [("storage_options=", dict(storage_options or {}))]
        + [(name, opts) for (_, opts), name in zip(located, ("X", "OUT"), strict=True)]
    )
    x_url, out_url = (url for url, _ in located)
    check_protocol(x_url, "X")
    Output(out_url, options).check_path([x_url], readable=True)
    x_url, out_url = absolute(x_url), resolve_url(out_url, "OUT")
    array = inputs.open_input(x_url, options, "X")
    if array.ndim != 2:
        raise UsageError(
            f"X ({x_url}) has {array.ndim} dimensions {tuple(array.shape)}; {kind} takes a 2-D "
            "array (observations x variables, or --rows): stack an N-D field first, e.g. "
            "ds.t2m.stack(space=('lat', 'lon')).reset_index('space') before to_zarr"
        )
    check_finished(array, "X", x_url)
    inputs.check_encoding(array, "X", x_url)
    first_name, second_name = stored_names(array)[:2]
    names = (first_name, second_name)
    rows = _orientation(names, rows, over)
    req = plan.request(
        kind, tuple(array.shape), str(array.dtype), components, oversample, power_iterations,
        seed, scale, rows,
    )  # fmt: skip
    first, second = (n or d for n, d in zip(names, ("row", "column"), strict=True))
    m_names = (second, first) if rows else (first, second)
    if m_names[0] == m_names[1]:
        m_names = (m_names[0], m_names[1] + "_2")
    target = Decomposition(out_url, options)
    state = target.state()
    if state is not None and not (overwrite or resume):
        raise OutputExistsError(
            f"OUT ({out_url}) already exists; pass --overwrite to replace it or --resume to "
            "finish an interrupted run"
        )
    spec = inputs.array_spec(array, "X")
    job = DecompositionJob(
        x_url, target, req, spec.shape, spec.chunks, spec.dtype, m_names,
        metadata_digest((array, array)), state, product, overwrite, resume,
        cluster, product.get("memory_limit"), storage_options=options,
    )  # fmt: skip
    if resume and state is not None and state.get("fingerprint") != job.fingerprint():
        raise UsageError(
            f"--resume: OUT ({out_url}) holds another decomposition ({state.get('kind')} "
            f"{state.get('request')} of {state.get('x')}); rerun with those options, or pass "
            "--overwrite to start over"
        )
    return _planned(job, spec)


def _planned(job: DecompositionJob, x_spec: ArraySpec) -> DecompositionJob:
    """The first product pass planned as ``multiply`` would plan it (its memory per worker is
    every pass's bound), for the dry run."""
    from pipeline.facts.job_plan import plan_for, planning_backend
    from pipeline.options.job_options import JobOptions
    from pipeline.plan.operands import operands
    from pipeline.summary import format_plan

    req = job.request
    n, p = job.shape
    sketch = ArraySpec((p, req.width), (job.chunks[1], req.width), job.output_dtype)
    options = JobOptions(
        backend=job.product.get("backend", "auto"),
        memory_limit=job.product.get("memory_limit"),
        device_memory_limit=job.product.get("device_memory_limit"),
        device_class=job.product.get("device_class"),
        storage_gbps=job.product.get("storage_gbps"),
        storage_options=job.storage_options,
    )
    if job.cluster is not None:
        options = replace(options, cluster=job.cluster)
    backend = planning_backend(options.backend, options.device_class)
    transposed = (req.rows, False)
    a, b = operands(x_spec, sketch, transposed)
    product = plan_for(a, b, options, None, None, backend, transposed=transposed, symmetric=False)
    return replace(
        job, product_plan=format_plan(product, ()), product_seconds=product.estimated_seconds
    )


def _orientation(names: tuple[str | None, str | None], rows: bool, over: str | None) -> bool:
    """Whether X's rows are the variables: ``--rows``, or ``--over`` naming the observations'
    dimension (the one a covariance sums over)."""
    if over is None:
        return rows
    if over not in names:
        shown = ", ".join(repr(n) for n in names if n) or "none"
        raise UsageError(
            f"--over {over}: X has no dimension {over!r} (its dimensions: {shown}); name the "
            "observations' dimension (the one a covariance sums over), or use --rows"
        )
    found = names.index(over) == 1
    if rows and not found:
        raise UsageError(
            f"--rows says X's rows are the variables, but --over {over} names them the "
            "observations; drop --rows"
        )
    return found


def pca(
    x: Any,
    out: Any,
    *,
    components: int,
    client: Client | None = None,
    scale: bool = False,
    rows: bool = False,
    over: str | None = None,
    oversample: int | None = None,
    power_iterations: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    resume: bool = False,
    passes_from: str = "auto",
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    memory_limit: Any = None,
    device_memory_limit: Any = None,
    device_class: str | None = None,
    storage_gbps: float | None = None,
    progress: bool = False,
    cluster: Any = None,
) -> DecompositionResult:
    """Principal components of X (a 2-D Zarr array, numpy or dask array: observations x
    variables; ``rows=True`` or ``over=``: X's rows are the variables) into the Zarr group
    ``out``: components, scores, singular_values, explained_variance(_ratio), mean (and scale
    with ``scale=True``), as scikit-learn's PCA names them. Randomized (Halko et al.):
    ``oversample`` (default 10) and ``power_iterations`` (default scikit-learn's rule) as
    scikit-learn's; ``seed`` fixes the sketch. ``passes_from``: "auto" reads X once and holds
    it in the workers' memory when it fits half of it (on the CPU backend), "memory" insists,
    "storage" reads X in every pass. See the README."""
    keywords = dict(locals())
    return _run("pca", keywords)


def svd(
    x: Any,
    out: Any,
    *,
    components: int,
    client: Client | None = None,
    rows: bool = False,
    over: str | None = None,
    oversample: int | None = None,
    power_iterations: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
    resume: bool = False,
    passes_from: str = "auto",
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    memory_limit: Any = None,
    device_memory_limit: Any = None,
    device_class: str | None = None,
    storage_gbps: float | None = None,
    progress: bool = False,
    cluster: Any = None,
) -> DecompositionResult:
    """Truncated SVD of X as it is (uncentred, scikit-learn's TruncatedSVD) into the Zarr group
    ``out``; the keywords are ``pca``'s but ``scale``. See the README."""
    keywords = dict(locals())
    return _run("svd", keywords)


def _run(kind: str, keywords: dict[str, Any]) -> DecompositionResult:
    client = keywords.pop("client")
    x, out = keywords.pop("x"), keywords.pop("out")
    return _prepare_decomposition(kind, x, out, **keywords).execute(client)


OWN_OPTIONS = tuple(
    Option(default, "", name=name)
    for name, default in (
        ("components", 0), ("oversample", 0), ("power_iterations", 0), ("seed", 0),
        ("scale", False), ("rows", False), ("over", ""), ("passes_from", ""),
    )
)  # fmt: skip
"""pca's and svd's own keywords, for their errors' Python spelling."""


def _spelled() -> tuple[Option, ...]:
    return (*DECLARED, *OWN_OPTIONS)


prepare_decomposition = spelling.door(_prepare_decomposition, _spelled)
pca = spelling.door(pca, _spelled)
svd = spelling.door(svd, _spelled)


__all__ = [
    "DecompositionJob",
    "DecompositionResult",
    "InputError",
    "pca",
    "prepare_decomposition",
    "svd",
]

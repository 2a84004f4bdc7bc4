"""What a tile task is given and what it returns: pickled between the client and workers."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernels.backends import get_backend
from pipeline.options.job_options import JobOptions
from pipeline.plan.spec import StoreSpec
from pipeline.plan.standardize import Standardize
from pipeline.store.output import Output


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs besides its tile; pickled once per task."""

    store: StoreSpec
    backend: str
    """A name in kernels.backends (already resolved from "auto")."""
    compute_dtype: str
    """The accumulator's dtype."""
    out_dtype: str
    fingerprint: str
    """The plan's fingerprint, written into journal entries."""
    cache_bytes: int = 0
    """Budget of the worker's shared cache of decoded panels, in bytes (0: off)."""
    block_shape: tuple[int, int] | None = None
    """The plan's fixed gemm block (same bytes on any cluster)."""
    run_id: str = ""
    """Unique per job: cached panels never outlive the job that decoded them (inputs may be
    rewritten in place between jobs on a long-lived cluster)."""
    panel_uses: tuple[int, int] = (1, 1)
    """Tiles that read each A panel and each B panel (the tile columns and rows)."""
    buffer_bytes: int = 0
    """Budget of the worker's pool of panel buffers, in bytes (0: fresh arrays)."""
    staging_bytes: int = 0
    """Budget of the worker's pinned staging pool (GPU backends driven by the staged engine)."""
    decode_threads: int = 2
    """Threads of a GPU task decoding panels ahead of the device."""
    device_params: tuple[tuple[str, float], ...] = ()
    """The device's parameters (the emulated backend's modelled rates)."""
    read_concurrency: int = 0
    """Chunks one panel read decodes at once (zarr's async.concurrency) in the worker; 0 keeps
    zarr's default (remote stores, where it hides latency)."""
    overlap: bool = True
    """GPU backends: decode, copies and kernels overlap (False: one after the other, the
    baseline that measures what the overlap buys; config ``tilegemm.gpu-overlap``)."""
    precision: str = "fp32"
    """The kernel's arithmetic (kernels.backends.PRECISIONS), already checked for the backend."""
    panel_dtype: str = ""
    """The dtype panels are read in (MatmulPlan.panel_dtype); "": the compute dtype."""
    standardize: Standardize | None = None
    """A covariance, correlation or kinship: X's panels are standardized as they are read,
    with these measured shifts and scales (pipeline.plan.standardize). Set on the worker from
    what the job sent it once (pipeline.run.client.submit_plan), never pickled per task."""
    options: JobOptions = field(default_factory=JobOptions)
    """What the caller asked, every option as checked: a task reads the options it acts on
    here (``spec.options.gpu_decode``, ``.alpha``, ``.accumulate``, ``.progress``, ...), so an
    option needs no field of its own to reach the workers."""
    out_folder: tuple[int, int] | None = None
    """(st_dev, st_ino) of a local OUT's folder as the job locked it: a task writes only there
    (a folder swapped in at OUT's path is refused)."""
    lock_token: str = ""
    """The token of the lock the job holds on OUT (or C): a task writes a band only while the
    lock still carries it, so a newer job's claim stops an older job's stragglers."""

    @property
    def read_dtype(self) -> str:
        """The dtype panels are decoded into."""
        return self.panel_dtype or self.compute_dtype

    @property
    def staged(self) -> bool:
        """Driven by the staged engine (a backend with a device), not panel by panel."""
        return get_backend(self.backend).make_device is not None

    @property
    def output(self) -> Output:
        return Output(self.store.out_url, self.store.storage_options)

    @property
    def journal(self) -> Output:
        """Where tiles are journaled: OUT, or an accumulation's folder inside C."""
        if not self.options.accumulate:
            return self.output
        from pipeline.accumulate.state import sidecar

        return sidecar(self.output)


@dataclass(frozen=True)
class TileStats:
    index: tuple[int, int]
    bytes_read: int
    seconds: float
    checksum: int
    """crc32 of the tile's bytes as written."""
    phases: dict[str, float] = field(default_factory=dict)
    """Thread-seconds per phase (see pipeline.run.timing)."""

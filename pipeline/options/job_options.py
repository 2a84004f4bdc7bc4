"""What a job was asked (``JobOptions``, every option as checked) and what it did
(``MultiplyResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.memory import MemoryLimit
from cluster.spec import ClusterSpec
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.spec import OutputSpec
from pipeline.plan.standardize import Standardize
from pipeline.plan.units import format_bytes
from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr


@dataclass(frozen=True)
class JobOptions:
    """What the caller asked for; the one carrier of every option from the CLI or API."""

    backend: str = "auto"
    """A name in kernels.backends, or "auto"."""
    memory_limit: MemoryLimit | None = None
    """Per worker as asked (bytes, a fraction or "auto"): the plan resolves it for its workers
    (cluster.memory), and local workers get it as ``dask worker --memory-limit`` would."""
    device_memory_limit: int | float | None = None
    """Per worker's GPU, bytes or a fraction of the device's memory: GPU plans fit it (None:
    the device's own memory)."""
    device_class: str | None = None
    """The GPU to plan cuda/cublas for where the workers' own is not measured (a name in
    pipeline.plan.device_model.DEVICE_CLASSES; None: a saved device record, else the
    tilegemm.device-class setting)."""
    storage_gbps: float | None = None
    """Each worker's storage read rate in GB/s of array data for the plan's time (None: this
    host's calibrated local read costs), and its write rate unless ``write_gbps`` gives one."""
    write_gbps: float | None = None
    """Each worker's storage write rate in GB/s of OUT's data for the plan's time (None:
    ``storage_gbps``, else this host's calibrated local write costs)."""
    gpu_decode: bool = False
    """Stage zstd chunks compressed and decode them on the GPU (staged GPU backends only)."""
    precision: str = "fp32"
    """A name in kernels.backends.PRECISIONS: fp32 (the dtype's own arithmetic), or TF32 /
    3xTF32 tensor cores (float32 data on a GPU backend that lists it)."""
    overwrite: bool = False
    resume: bool = False
    accumulate: bool = False
    """OUT is an existing C: ``C ← α·A·B + β·C``, each product added exactly once."""
    alpha: float = 1.0
    """OUT gets α·A·B (+ β·C with ``accumulate``)."""
    beta: float = 1.0
    """C's old values' factor (``accumulate`` only)."""
    verify: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict, metadata=SENSITIVE_FIELD)
    """fsspec options for A, B and OUT; repr hides secrets."""
    output: OutputSpec = field(default_factory=OutputSpec)
    """OUT's dtype, chunks and shards as asked (None: follow the inputs) and Zarr format."""
    progress: bool = False
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    """The cluster to start or join when ``execute`` is given no client."""
    report: str | None = None
    """Where to save distributed's performance report (HTML), if anywhere."""
    standardize: Standardize | None = None
    """A Gram product's --center, --scale or --kinship (its shifts and scales are measured
    when the job runs); None: a plain product."""

    __repr__ = redacted_repr


@dataclass(frozen=True)
class MultiplyResult:
    shape: tuple[int, int]
    dtype: str
    seconds: float
    """Wall time of ``execute``, cluster start-up included."""
    tiles_computed: int
    tiles_skipped: int
    """Tiles a --resume found already written."""
    bytes_read: int
    """Bytes of input elements the tasks read from storage."""
    backend: str
    plan: MatmulPlan
    verified: bool | None = None
    """None when not asked to verify."""
    phases: dict[str, float] = field(default_factory=dict)
    """Thread-seconds the tile tasks spent per phase (product, decode, copy, write, wait)."""
    usage: dict[str, float] = field(default_factory=dict)
    """The worker processes' user and system seconds and page faults during the tiles."""
    read_bound_bytes: int | None = None
    """The least any schedule reads to compute what this run computed, in bytes, when that is
    a part of the product (a --resume's; pipeline.plan.limits.read_lower_bound); None: the
    whole product, whose bound is ``plan.lower_bound_read_bytes``."""
    standardize: Standardize | None = None
    """A covariance's, correlation's or kinship's standardization, as measured (its counts:
    variables used, left out, values imputed)."""
    url: str = ""
    """OUT's URL as the job wrote it (a local path absolute, links resolved)."""
    storage_options: dict[str, Any] = field(
        default_factory=dict, repr=False, metadata=SENSITIVE_FIELD
    )
    """The fsspec options OUT was written with (and is read back with)."""

    def open(self) -> Any:
        """OUT as a read-only ``zarr.Array``."""
        from pipeline.store import readback

        return readback.open_product(self.url, self.storage_options)

    def to_dask(self) -> Any:
        """OUT as a ``dask.array.Array`` (``dask.array.from_zarr``, OUT's chunks)."""
        from pipeline.store import readback

        return readback.product_dask(self.url, self.storage_options)

    def to_xarray(self) -> Any:
        """OUT as an ``xarray.DataArray`` with OUT's dimension names, and the coordinates of
        the Zarr group (dataset) it is in, if any; lazy (dask). Needs xarray."""
        from pipeline.store import readback

        return readback.product_xarray(self.url, self.storage_options)

    def __repr__(self) -> str:
        """One line for a notebook (the fields hold the plan and the phases' seconds)."""
        checked = {None: "", True: ", verified", False: ", verification FAILED"}[self.verified]
        return (
            f"<MultiplyResult {self.shape[0]}x{self.shape[1]} {self.dtype}: "
            f"{self.tiles_computed} tile(s) computed, {self.tiles_skipped} skipped, "
            f"{self.seconds:.2f} s, {format_bytes(self.bytes_read)} read, "
            f"backend {self.backend}{checked}>"
        )

"""The cost model's constants (pure): a fixed cost per chunk and a rate per byte for each
thing done to a stored chunk -- fetching an input's, decoding it, encoding OUT's, storing it
-- and the rate of the product. ``benchmarks/calibrate.py`` measures them on a machine and
writes them, with the machine's name, to ``pipeline/plan/fitted_costs.py``: the CostModel
``plan_matmul`` is given when no other is passed (``pipeline.facts.host.host_costs`` passes
this host's). A chunk's fixed cost is what makes 64x64 chunks slow: per byte they cost what
big ones do, but each also pays a file open, a request, zarr's bookkeeping.

Another host plans with the same constants scaled by ``for_host``: three quick figures
(``HostProbe``: one BLAS thread's rate, zstd's decode rate, a piece of interpreter work)
measured there and on the calibration host, each scaling the costs it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ChunkCost:
    """Seconds one thread spends on ``chunks`` stored chunks of ``nbytes`` bytes in all."""

    per_chunk: float
    """Fixed seconds per chunk."""
    per_byte: float
    """Seconds per byte (of the decoded chunk)."""

    def seconds(self, chunks: float, nbytes: float) -> float:
        return chunks * self.per_chunk + nbytes * self.per_byte

    def times(self, per_chunk: float, per_byte: float) -> ChunkCost:
        """This cost with its fixed part times ``per_chunk`` and its rate times ``per_byte``."""
        return ChunkCost(self.per_chunk * per_chunk, self.per_byte * per_byte)


@dataclass(frozen=True)
class HostProbe:
    """A host's quick figures (pipeline.facts.host measures them in under a second): what
    scales the calibrated costs from the calibration host to another."""

    flops_per_second: float
    """One BLAS thread's float32 rate while every core runs one."""
    decode_per_byte: float
    """One thread's zstd decode seconds per decoded byte."""
    python_seconds: float
    """One thread's CPU seconds for a fixed piece of interpreter work (what a chunk's fixed
    cost and a task's are made of: Python, asyncio, zarr's bookkeeping)."""


@dataclass(frozen=True)
class CostModel:
    """One host thread's costs, as measured on ``machine``."""

    read: ChunkCost
    """Fetching a stored input chunk (a file read or a request)."""
    decode: ChunkCost
    """Decoding an input chunk (zstd, the inputs' usual codec) into the panel."""
    encode: ChunkCost
    """Encoding one of OUT's chunks, uncompressed (float OUT's default)."""
    encode_compressed: ChunkCost
    """Encoding one of OUT's chunks with its compressor (integer OUT's default)."""
    write: ChunkCost
    """Storing one of OUT's chunks (a file created and written, or a request)."""
    flops_per_second: float
    """float32 multiply rate of one BLAS thread, in flop/s (float64: half)."""
    accumulate_per_byte: float
    """Seconds per accumulator byte for each K panel added into it (BLAS reads and writes the
    whole tile once per panel: what a product with a short K spends its time on)."""
    allocate_per_byte: float
    """Seconds per accumulator byte, once per task: fresh pages zeroed, the result copied out."""
    task_seconds: float
    """Scheduling, opening the stores and Python per task."""
    setup_seconds: float
    """Starting a local cluster, creating OUT and finishing it: once per job."""
    machine: str = "unknown"
    """The CPU the figures were measured on (lscpu's model name and core count)."""
    measured: str = ""
    """When and with what command."""
    probe: HostProbe | None = None
    """The calibration host's quick figures (None: this model is not scaled to other hosts)."""
    read_rate: float | None = None
    """A worker's storage read rate given for the plan, in bytes/s of array data (None: the
    calibrated ``read`` cost, a local file system's)."""
    write_rate: float | None = None
    """A worker's storage write rate given for the plan, in bytes/s of OUT's data (None: the
    calibrated ``write`` cost, a local file system's)."""
    write_source: str = ""
    """The option that gave ``write_rate`` (a rate for both ways, or one for writes alone)."""


def with_read_rate(costs: CostModel, bytes_per_second: float, threads: int) -> CostModel:
    """``costs`` with a worker's ``threads`` reading at ``bytes_per_second`` in all (a shared
    file system or an object store): each byte costs a thread ``threads / rate`` seconds,
    each chunk its calibrated fixed cost."""
    per_byte = max(threads, 1) / bytes_per_second
    return replace(
        costs, read=ChunkCost(costs.read.per_chunk, per_byte), read_rate=bytes_per_second
    )


def with_write_rate(
    costs: CostModel, bytes_per_second: float, threads: int, source: str
) -> CostModel:
    """``costs`` with a worker's ``threads`` storing OUT's chunks at ``bytes_per_second`` in
    all, as ``with_read_rate`` reads (encoding them keeps its calibrated cost); ``source``:
    the option that gave the rate, for the dry run to name."""
    per_byte = max(threads, 1) / bytes_per_second
    write = ChunkCost(costs.write.per_chunk, per_byte)
    return replace(costs, write=write, write_rate=bytes_per_second, write_source=source)


LIMITS = (0.1, 10.0)
"""The widest a host's figures may scale the model: a probe beyond is taken as noise."""


def host_factors(reference: HostProbe, host: HostProbe) -> dict[str, float]:
    """How many times the calibration host's seconds a host takes: ``product`` (BLAS and
    the passes over the accumulator), ``decode`` (zstd per byte), ``python`` (per chunk,
    per task, setup)."""
    ratios = {
        "product": reference.flops_per_second / host.flops_per_second,
        "decode": host.decode_per_byte / reference.decode_per_byte,
        "python": host.python_seconds / reference.python_seconds,
    }
    return {k: min(max(v, LIMITS[0]), LIMITS[1]) for k, v in ratios.items()}


def for_host(costs: CostModel, host: HostProbe) -> CostModel:
    """``costs`` scaled to the host whose quick figures are ``host`` (unchanged when the model
    has no reference figures). Each figure stands for the costs it measures: the product rate
    for the BLAS terms, zstd for decoding bytes, the interpreter for every fixed cost."""
    if costs.probe is None:
        return costs
    f = host_factors(costs.probe, host)
    product, decode, python = f["product"], f["decode"], f["python"]
    return replace(
        costs,
        read=costs.read.times(python, 1.0),
        decode=costs.decode.times(python, decode),
        encode=costs.encode.times(python, 1.0),
        encode_compressed=costs.encode_compressed.times(python, 1.0),
        write=costs.write.times(python, 1.0),
        flops_per_second=costs.flops_per_second / product,
        accumulate_per_byte=costs.accumulate_per_byte * product,
        allocate_per_byte=costs.allocate_per_byte * product,
        task_seconds=costs.task_seconds * python,
        setup_seconds=costs.setup_seconds * python,
        machine=(
            f"{costs.machine}, scaled to this host (product x{product:.2f}, "
            f"decode x{decode:.2f}, per chunk x{python:.2f})"
        ),
    )

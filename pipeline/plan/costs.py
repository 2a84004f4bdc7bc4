"""The cost model's constants (pure): a fixed cost per chunk and a rate per byte for each
thing done to a stored chunk -- fetching an input's, decoding it, encoding OUT's, storing it
-- and the rate of the product. ``benchmarks/calibrate.py`` measures them on a machine and
writes them, with the machine's name, to ``pipeline/plan/calibration.py``, which the planner
reads. A chunk's fixed cost is what makes 64x64 chunks slow: per byte they cost what big ones
do, but each also pays a file open, a request, zarr's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkCost:
    """Seconds one thread spends on ``chunks`` stored chunks of ``nbytes`` bytes in all."""

    per_chunk: float
    """Fixed seconds per chunk."""
    per_byte: float
    """Seconds per byte (of the decoded chunk)."""

    def seconds(self, chunks: float, nbytes: float) -> float:
        return chunks * self.per_chunk + nbytes * self.per_byte


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

"""Constants every room of kernels/ shares: the bottom of the package, importing nothing of it."""

from __future__ import annotations

GPU_DTYPES = ("float32", "float64")
"""Compute dtypes of the GPU backends (our kernels and cuBLAS)."""
CPU_GEMM_BLOCK = 256
"""OpenBLAS's rounding depends on a call's M and N, so the CPU backend multiplies fixed output
blocks of whole chunks, at least this many rows and columns: the same bytes on any cluster."""
MAX_DIM = 2**31 - 1
"""Largest m, n or panel width: the fast kernels index with 31-bit masked integers."""
FRAME_DECODE_BYTES_PER_SECOND = 1e9
"""zstd decoded on the GPU per frame in one batch, in decoded bytes/s: an assumption, never
measured (no GPU here). nvCOMP decodes a frame with one thread block, and one zarr chunk is
one frame (a frame cannot be split undecoded), so a batch of F frames decodes at most F times
as fast as one frame; one frame is taken as about one CPU core's zstd."""

CUDA_INSTALL = 'pip install ".[cuda]" in the zarr-tilegemm checkout'
"""What installs the GPU backends' packages (numba-cuda with its CUDA wheels, dask-cuda): a
plain install runs on the CPU only. From a checkout: the package is not on PyPI yet."""
CUBLAS_INSTALL = 'pip install ".[cublas]" in the zarr-tilegemm checkout'
"""What installs the cuda extra and CuPy with cuBLAS (cupy-cuda13x[ctk]: CuPy 14 ships no
cuBLAS without the ctk extra)."""


def device_decode_rate(peak_bytes_per_second: float, frames: float) -> float:
    """Decoded bytes/s of a batch of ``frames`` zstd frames on the GPU: ``frames`` thread
    blocks at FRAME_DECODE_BYTES_PER_SECOND each, never above the device's peak. A 50 GB/s peak
    needs 50 frames a batch; a 2048-wide panel of 2048² chunks has a few (16 MiB frames,
    against the 64 KiB chunks nvCOMP's figures assume)."""
    return min(peak_bytes_per_second, max(frames, 1.0) * FRAME_DECODE_BYTES_PER_SECOND)

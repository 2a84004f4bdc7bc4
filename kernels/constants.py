"""Constants every room of kernels/ shares: the bottom of the package, importing nothing of it."""

from __future__ import annotations

GPU_DTYPES = ("float32", "float64")
"""Compute dtypes of the GPU backends (our kernels and cuBLAS)."""
CPU_GEMM_BLOCK = 256
"""OpenBLAS's rounding depends on a call's M and N, so the CPU backend multiplies fixed output
blocks of whole chunks, at least this many rows and columns: the same bytes on any cluster."""
MAX_DIM = 2**31 - 1
"""Largest m, n or panel width: the fast kernels index with 31-bit masked integers."""

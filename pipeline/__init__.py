"""Zarr → Dask tiles → GPU (Numba CUDA) or CPU (BLAS) kernels → Zarr matrix multiply."""

from pipeline.api import MultiplyResult, multiply
from pipeline.errors import PipelineError
from pipeline.verify import VerifyResult, verify_product

__all__ = ["MultiplyResult", "PipelineError", "VerifyResult", "multiply", "verify_product"]

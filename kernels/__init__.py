"""Block-product backends. Nothing here knows about Dask or Zarr; numba is imported lazily.

The registry is ``kernels.backends``; ``import kernels.cuda.launch`` loads no backend.
"""

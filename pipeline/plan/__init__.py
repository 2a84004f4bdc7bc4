"""Plan: the pure layer. Shapes, chunks, dtypes, workers and a memory budget in; a frozen
``MatmulPlan`` out. Imports none of dask, distributed, zarr or numba (tested)."""

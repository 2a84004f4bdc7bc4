"""Block-product backends. Nothing here knows about Dask or Zarr; numba is imported lazily.

The registry is ``kernels.backends``; ``import kernels.cuda.launch`` loads no backend.
"""

import numpy as _np

# numba-cuda 0.30 registers an overload on np.row_stack when it is imported, and NumPy 2.5
# removed that alias of vstack: without it, no CUDA kernel compiles under NumPy >= 2.5.
if not hasattr(_np, "row_stack"):
    _np.row_stack = _np.vstack  # type: ignore[attr-defined]

"""The CUDA backend's room: the seed-fixed tiled kernel (``tiled``), the register-blocked kernel
(``blocked``, its spec and source generator), launch math (``launch``), the host side that jits
and launches them (``host``) and cuBLAS through CuPy (``cublas``). numba and CuPy load lazily."""

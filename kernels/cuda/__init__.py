"""The CUDA backend's room: the seed-fixed tiled kernel (``tiled``), the register-blocked kernel
(``blocked``, its spec and source generator), launch math (``launch``), jitting and the
simulator's launch lock (``jit``), the host side that picks and launches them (``host``), exact
integer products through them (``integer``) and cuBLAS through CuPy (``cublas``). numba and
CuPy load lazily."""

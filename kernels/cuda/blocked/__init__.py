"""The register-blocked CUDA kernels (the cuda backend's defaults): a tile-shape spec (``spec``),
the kernel source generated from it (``source``), and the compiled kernels (``kernel``)."""

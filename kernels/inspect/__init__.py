"""Machine code of the CUDA kernels without a GPU: compile to PTX, assemble, read the SASS
(``machine_code``, ``sass``); ``python -m kernels inspect`` prints the report."""

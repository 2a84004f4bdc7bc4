"""The device room: the interface a K loop drives (``interface``), the staged engine that drives
it (``engine``), its implementations -- a real GPU through numba-cuda (``gpu``), an emulated one
with modelled time (``emulated``, shared per process in ``shared``) -- their measured rates
(``calibrate``), host buffers and allocators (``buffers``, ``allocators``) and decoding on the
device (``decode``). numba loads lazily."""

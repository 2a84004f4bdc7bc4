"""The device room: the interface a K loop drives (``interface``), the staged engine that drives
it (``engine``), its implementations -- a real GPU through numba-cuda (``gpu``), an emulated one
with modelled time (``emulated``, shared per process in ``shared``) -- their measured rates
(``rates``, saved in ``figures``), the doctor's GPU check (``doctor_probe``) and decoding on the
device (``decode``). Host buffers live in kernels.memory. numba loads lazily."""

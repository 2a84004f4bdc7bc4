"""Test support, on a child's PYTHONPATH (tests.child_env.child_env(slow_integers=True)):
integer products take numpy's integer matmul (no BLAS) instead of the exact float route, so
small integer inputs make tiles that run for seconds, for tests that interrupt or watch a
running job."""

import numpy as np

import kernels.exact

kernels.exact.panel_dtype = lambda a_dtype, b_dtype, acc_dtype: str(np.dtype(acc_dtype))
kernels.exact.blocks = lambda panel, a_max, b_max, k: ("", 0)  # no float is exact: numpy's

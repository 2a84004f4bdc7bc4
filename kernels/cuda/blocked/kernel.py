"""Register-blocked CUDA kernels (the cuda backend's defaults): source generated at import.

Each block computes a BLOCK_M x BLOCK_N tile of C += A @ B; each thread keeps 2 x 2 fragments of
FRAG x FRAG outputs in registers, so one shared-memory load feeds many FMAs. The A tile is stored
transposed (k-major) with a padded pitch, so a thread's FRAG rows of A and FRAG columns of B are
each contiguous, aligned runs: 128-bit shared loads. Shared memory is double-buffered and the next
K tile is prefetched into registers while the current one is multiplied, so one barrier per tile
suffices. Numba has no unroll pragma and NVVM leaves a BK loop rolled, hence generated source.

Index math uses `>>` and `&`: Numba's signed `//` and `%` add floor/negative-index fixups that
hide the alignment from the vectorizer (no 128-bit loads). `index_math="divmod"` and
`acc_init="float64"` exist only to build the deliberately bad kernels the gate test must reject.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kernels.cuda.blocked.source import compiled, generate_source
from kernels.cuda.blocked.spec import BlockedSpec
from kernels.cuda.launch import LaunchConfig, blocked_launch


def launch_for(spec: BlockedSpec, m: int, n: int) -> LaunchConfig:
    return blocked_launch(m, n, spec.block_m, spec.block_n, spec.threads)


def make_blocked_kernel(spec: BlockedSpec) -> Callable[..., None]:
    """Plain Python kernel `kernel(a, b, c)` doing c += a @ b, built from generated source."""
    return _make_blocked_kernel(spec)


@functools.cache
def _make_blocked_kernel(spec: BlockedSpec) -> Callable[..., None]:
    import numba
    import numba.cuda

    # The kernel must see `cuda` as a global: the simulator swaps it in the function's globals.
    namespace: dict[str, Any] = {"cuda": numba.cuda, "elem": getattr(numba, spec.dtype)}
    name = f"blocked_matmul_{spec.dtype}"
    return compiled(generate_source(spec, name), name, namespace)

"""Our tensor-core kernels: C += A @ B for float32 with TF32 (`precision="tf32"`) or 3xTF32
(`"3xtf32"`) products on ``mma.sync.m16n8k8``, from generated source (kernels.cuda.tensor.source).

Design (for the H100, sm_90; shapes in kernels.cuda.tensor.spec):

- **Block tile** 128 x 128 of C, 256 threads = 8 warps as 2 (rows) x 4 (columns); each warp owns
  64 x 32 of C = 4 x 4 mma tiles of 16 x 8, so its 64 float32 accumulators per lane stay in
  registers for the whole K loop. Launch bounds (256, 2) cap ptxas at 128 registers: two blocks
  (16 warps) per SM.
- **K tiles** staged in shared memory as the fp32 kernel does: double-buffered, the next tile
  prefetched into registers while the current one is multiplied, one barrier per tile. Each
  value is rounded to TF32 (``cvt.rna``) once, when stored to shared memory, so the hot loop
  holds only shared loads and HMMA. 3xTF32 stores two planes, big = rna(x) and
  small = rna(x - big) (x - big is exact in float32), and per tile pair and k-step chains
  small.big, big.small, big.big through a 4-register temporary that starts at zero, then adds
  it to the float32 accumulators (4 FADD): one rounding at the accumulators' magnitude per
  k-step, not three (small.small, ~2^-22 relative, is dropped). The temporaries leave no room
  for the next tile's 8 loaded values under the 128-register cap (ptxas spilled 16 bytes), so
  3xTF32 loads the next tile after the multiply, not before (128 registers, no spills).
  TF32: BK = 16 (two k-steps, 37 KiB shared); 3xTF32: BK = 8 (two planes, 41 KiB), both
  within the 48 KiB of static shared memory.
- **Fragments** are loaded with 32-bit shared loads in the PTX ISA's m16n8k8 layout
  (g = lane >> 2, t = lane & 3). A is stored row-major with pitch BK + 4 words, so the 8 x 4
  (g, t) pattern of an A fragment load falls on 32 distinct banks; B row-major with pitch
  128 + 8 words (8 mod 32), so B's 4 x 8 (t, g) pattern does too: no bank conflicts. Per warp
  and k-step: 4 x 4 (A) + 4 x 2 (B) = 24 loads per 16 mma (x2 loads, x3 mma for 3xTF32).
- **Edges**: the unchecked loop runs only for full blocks whose next K tile lies inside A and B;
  otherwise loads are bounds-checked and zero-filled (a zero adds nothing to an mma), and the
  epilogue checks each element. Every thread reaches every barrier and every mma.sync.
- **Rate (expected, not measured; no GPU here)**: one HMMA.1688.F32.TF32 is 2048 flops. On an
  H100 the mma.sync path (not wgmma) reaches at most about 60 % of the TF32 dense peak
  (378 TFLOP/s PCIe, 495 SXM), and 24 LDS.32 per 16 HMMA make shared-memory bandwidth the
  next limit: we expect ~120-200 TFLOP/s for tf32 and a third of that for 3xtf32 (40-65
  TFLOP/s, about the FP32 units' 51-67) against cuBLAS TF32's ~300. Unverified estimates;
  3xTF32's global loads after the multiply are hidden only by the SM's other warps, which may
  cost it more.
- **Accuracy**: TF32 rounds each input to 11 significant bits (u = 2^-11), so |C - AB| is
  about 2^-10 |A||B| per element, not growing with K; 3xTF32 is float32's. Emulated (NumPy,
  tests/kernels/test_tf32_emulation.py; 256 x 256, uniform [-1, 1], seed 0), worst element
  relative to max|AB| at K = 512 / 4096: numpy float32 4.8e-7 / 5.1e-7, tf32 2.6e-4 /
  2.7e-4, 3xtf32 3.2e-7 / 1.0e-6 (1.97x numpy's at K = 4096, the target being <= 2x; with
  the three mma straight into the accumulators it would be 5.0e-7 / 1.5e-6, 2.9x). An infinite or
  near-overflow (|x| >= 2^128 (1 - 2^-12)) input makes 3xTF32's small part NaN.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kernels.cuda.blocked.source import compiled
from kernels.cuda.launch import LaunchConfig, blocked_launch
from kernels.cuda.tensor.source import generate_source
from kernels.cuda.tensor.spec import TF32_SPEC, X3_SPEC, MmaSpec

SPECS = {spec.precision: spec for spec in (TF32_SPEC, X3_SPEC)}


def launch_for(spec: MmaSpec, m: int, n: int) -> LaunchConfig:
    return blocked_launch(m, n, spec.block_m, spec.block_n, spec.threads)


def make_mma_kernel(spec: MmaSpec, emulated: Any = None) -> Callable[..., None]:
    """Plain Python kernel ``kernel(a, b, c)`` doing c += a @ b (float32) for ``spec``.

    ``emulated``: (tf32_round, mma) Python functions standing in for the PTX intrinsics, so the
    generated source can run in numba's CUDA simulator (tests); None: the real intrinsics."""
    return _make_mma_kernel(spec, emulated)


@functools.cache
def _make_mma_kernel(spec: MmaSpec, emulated: Any) -> Callable[..., None]:
    import numba
    import numba.cuda

    from kernels.cuda.tensor.ptx import intrinsics

    tf32_round, mma = emulated if emulated is not None else intrinsics()
    # The kernel must see `cuda` as a global: the simulator swaps it in the function's globals.
    namespace: dict[str, Any] = {
        "cuda": numba.cuda,
        "elem": numba.float32,
        "tf32_round": tf32_round,
        "mma": mma,
    }
    name = f"mma_matmul_{spec.precision}"
    return compiled(generate_source(spec, name), name, namespace)

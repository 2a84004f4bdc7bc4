"""An exact emulation of the tensor-core kernels' arithmetic in NumPy, and stand-ins for their
two PTX intrinsics that let the generated kernel source run in numba's CUDA simulator.

Model of one ``mma.sync.m16n8k8`` (tf32 in, float32 accumulate): the 8 products of TF32 values
(11-bit significands) are exact in float64, their sum with C is rounded once to float32. The
hardware sums with at least float32's precision but may truncate; the model rounds to nearest.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.cuda.tensor.spec import MMA_K, WARP, a_fragment, b_fragment, c_fragment

F32 = NDArray[np.float32]


def round_tf32(x: Any) -> Any:
    """``cvt.rna.tf32.f32`` then the kernel's mask: nearest, ties away from zero, on the 10
    stored mantissa bits (finite inputs; overflow gives infinity)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return rounded.view(np.float32)


def split_3xtf32(x: Any) -> tuple[Any, Any]:
    """(big, small) as the kernel stores them: big = rna(x), small = rna(x - big)."""
    x32 = np.asarray(x, dtype=np.float32)
    big = round_tf32(x32)
    return big, round_tf32(x32 - big)


def emulate_product(a: F32, b: F32, precision: str) -> F32:
    """a @ b as the kernel computes it (float32 result, zero C): K in steps of 8. tf32: one mma
    per step into the accumulator, rounded to float32 once. 3xtf32: small.big, big.small and
    big.big chained through a temporary that starts at zero (each mma rounded once), then the
    temporary added to the accumulator in float32."""
    k = a.shape[1]
    pad = -k % MMA_K  # the kernel's zero fill: zeros add nothing
    a = np.pad(a.astype(np.float32), ((0, 0), (0, pad)))
    b = np.pad(b.astype(np.float32), ((0, pad), (0, 0)))
    if precision == "tf32":
        pairs = [(round_tf32(a), round_tf32(b))]
    else:
        (a_hi, a_lo), (b_hi, b_lo) = split_3xtf32(a), split_3xtf32(b)
        pairs = [(a_lo, b_hi), (a_hi, b_lo), (a_hi, b_hi)]
    wide = [(x.astype(np.float64), y.astype(np.float64)) for x, y in pairs]
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for s in range(0, k + pad, MMA_K):
        # tf32 chains straight into the accumulator; 3xtf32 into a temporary from zero.
        tmp = acc if precision == "tf32" else np.zeros_like(acc)
        for x, y in wide:
            step = x[:, s : s + MMA_K] @ y[s : s + MMA_K]  # 8 exact products, summed in float64
            tmp = (tmp.astype(np.float64) + step).astype(np.float32)
        acc = tmp if precision == "tf32" else acc + tmp
    return acc


class WarpMma:
    """A warp-collective ``mma`` for the simulator, where each CUDA thread is an OS thread: every
    lane deposits its fragments, waits for its 31 neighbours, computes its own 4 outputs of
    D = A @ B + C from the whole tiles (assembled with the PTX layout), and waits again before
    the next mma may overwrite the deposits. Lanes of a warp must all call it, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warps: dict[tuple[Any, int], tuple[threading.Barrier, NDArray[Any]]] = {}

    def _warp(self) -> tuple[int, threading.Barrier, NDArray[Any]]:
        me = threading.current_thread()
        lane, key = me.thread_id % WARP, (tuple(me.blockIdx), me.thread_id // WARP)  # type: ignore[attr-defined]
        with self._lock:
            if key not in self._warps:
                self._warps[key] = (threading.Barrier(WARP, timeout=120), np.zeros((WARP, 10)))
            barrier, regs = self._warps[key]
        return lane, barrier, regs

    def __call__(self, *operands: Any) -> tuple[np.float32, ...]:
        lane, barrier, regs = self._warp()
        regs[lane] = [float(np.float32(v)) for v in operands]
        barrier.wait()  # every lane's fragments are in
        a = np.zeros((16, 8))
        b = np.zeros((8, 8))
        for other in range(WARP):
            for r in range(4):
                a[a_fragment(other, r)] = regs[other, r]
            for r in range(2):
                b[b_fragment(other, r)] = regs[other, 4 + r]
        mine = []
        for r in range(4):
            row, col = c_fragment(lane, r)
            mine.append(np.float32(regs[lane, 6 + r] + a[row] @ b[:, col]))
        barrier.wait()  # every lane has read the deposits before the next mma writes them
        return tuple(mine)


def simulator_intrinsics() -> tuple[Any, Any]:
    """(tf32_round, mma) for ``make_mma_kernel(spec, emulated=...)`` in the simulator."""
    return (lambda x: np.float32(round_tf32(x))), WarpMma()

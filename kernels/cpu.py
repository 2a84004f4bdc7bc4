"""CPU backend: BLAS gemm with beta=1 straight into a preallocated accumulator.

``acc += a @ b`` costs a good share more than one matmul (a temporary and an extra pass per
panel), so float32/float64 call cblas ?gemm with beta=1 on numpy's own OpenBLAS through ctypes,
which releases the GIL (scipy.linalg.blas.sgemm holds it: two Dask threads run at the speed of
one). Where that library isn't found, numpy's matmul plus an add is the fallback. A panel read
transposed comes as a transposed view of the stored block, which BLAS reads as it is (its
transpose flag), so no copy is made; a Gram product's diagonal tile is "upper": only blocks on
and above its diagonal are computed, the diagonal ones with ?syrk (half the flops).

A worker's tasks share its cores through one pool of gemm threads (``share_cores``): each call
computes whole blocks, so a task alone at the end of a job (or a resumed tile with more rows
left than its sibling) gets every idle core, with the same bytes as one thread would give.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels import exact
from kernels.memory.zeroed import zeros
from kernels.panels import band_rows

ROW_MAJOR, NO_TRANS, TRANS, UPPER = 101, 111, 112, 121
_SYMBOLS = {
    "float32": ("scipy_cblas_sgemm64_", ctypes.c_float),
    "float64": ("scipy_cblas_dgemm64_", ctypes.c_double),
}
_SYRK = {"float32": "scipy_cblas_ssyrk64_", "float64": "scipy_cblas_dsyrk64_"}
GEMM_THREAD = "gemm"
"""Name prefix of the shared gemm threads (pipeline.cputime charges their seconds to the
product)."""
GROUPS_PER_THREAD = 4
"""A call's blocks go to the pool in this many groups per thread: few enough that a small
block's call is not all overhead, enough that the threads finish together."""
_shared: list[Any] = [None, 1]  # [the pool or None, its threads]
_shared_lock = threading.Lock()


def share_cores(threads: int) -> None:
    """Let this process's accumulators spread their blocks over ``threads`` shared threads
    (a worker's task threads: at most that many gemm calls run at once, whatever the number
    of tasks). 1: each task computes in its own thread."""
    threads = max(int(threads), 1)
    with _shared_lock:
        if _shared[1] == threads:
            return
        # The old pool is dropped, not shut down: a task may still be submitting to it, and
        # its idle threads end when it is collected.
        pool = ThreadPoolExecutor(threads, thread_name_prefix=GEMM_THREAD) if threads > 1 else None
        _shared[:] = [pool, threads]


def _pool() -> tuple[ThreadPoolExecutor | None, int]:
    with _shared_lock:
        return _shared[0], _shared[1]


def _run_all(calls: list[Callable[[], None]]) -> None:
    """Run every call, spread over the shared pool when there is one; wait for all of them
    before raising the first failure (none may still write into the accumulator after)."""
    pool, threads = _pool()
    if pool is None or len(calls) < 2:
        for call in calls:
            call()
        return
    groups = min(len(calls), threads * GROUPS_PER_THREAD)
    bounds = [len(calls) * g // groups for g in range(groups + 1)]

    def run(lo: int, hi: int) -> None:
        for call in calls[lo:hi]:
            call()

    futures = [pool.submit(run, lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    wait(futures)
    for f in futures:
        f.result()


@functools.cache
def _openblas() -> Any:
    """numpy's bundled 64-bit-int OpenBLAS (numpy >= 2 wheels), or None."""
    folder = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(folder, "libscipy_openblas64_*")):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@functools.cache
def cblas_gemm(dtype: str) -> Any:
    """A ctypes cblas ?gemm for dtype, or None when unavailable."""
    lib = _openblas()
    if lib is None or dtype not in _SYMBOLS:
        return None
    name, scalar = _SYMBOLS[dtype]
    fn = getattr(lib, name, None)
    if fn is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        i64,
        i64,
        i64,
        scalar,
        ptr,
        i64,
        ptr,
        i64,
        scalar,
        ptr,
        i64,
    ]
    fn.restype = None
    return fn


@functools.cache
def cblas_syrk(dtype: str) -> Any:
    """A ctypes cblas ?syrk (C = alpha·A·Aᵀ + beta·C, one triangle) for dtype, or None."""
    lib = _openblas()
    fn = getattr(lib, _SYRK[dtype], None) if lib is not None and dtype in _SYRK else None
    if fn is None:
        return None
    i32, i64, ptr, scalar = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, _SYMBOLS[dtype][1]
    fn.argtypes = [i32, i32, i32, i64, i64, scalar, ptr, i64, scalar, ptr, i64]
    fn.restype = None
    return fn


def blas_layout(x: NDArray[Any]) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) under which row-major BLAS reads ``x`` in place (a
    C-ordered block, or the transposed view of one), or None when it must be copied first."""
    item, (s0, s1), (m, n) = x.itemsize, x.strides, x.shape
    if s1 == item and s0 % item == 0 and s0 // item >= max(n, 1):
        return NO_TRANS, s0 // item
    if s0 == item and s1 % item == 0 and s1 // item >= max(m, 1):
        return TRANS, s1 // item
    return None


def blas_product(
    a: NDArray[Any], b: NDArray[Any], out: NDArray[Any], upper: bool, beta: float
) -> None:
    """out = a @ b + beta·out with one BLAS call of out's dtype (``upper``, for a square block:
    ?syrk, its upper triangle only); numpy's matmul where no BLAS call reads the operands."""
    gemm, la, lb = cblas_gemm(out.dtype.name), blas_layout(a), blas_layout(b)
    if gemm is None or la is None or lb is None:  # integers, complex, no OpenBLAS
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf: verify checks
            if beta:
                out += a @ b
            else:
                np.matmul(a, b, out=out)
        return
    (h, k), w, ld = a.shape, b.shape[1], out.strides[0] // out.itemsize
    syrk = cblas_syrk(out.dtype.name) if upper and h == w else None
    if syrk is not None:
        syrk(ROW_MAJOR, UPPER, la[0], h, k, 1.0, a.ctypes.data, la[1], beta, out.ctypes.data, ld)
        return
    gemm(
        ROW_MAJOR, la[0], lb[0], h, w, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1],
        beta, out.ctypes.data, ld,
    )  # fmt: skip


@functools.cache
def single_threaded_blas() -> None:
    """One BLAS thread per call, for good, in this process (a worker's tasks are its threads).

    OpenBLAS's rounding also depends on its thread count, so this is needed for bytes that do
    not depend on the cluster; a nanny sets the same through OPENBLAS_NUM_THREADS, but an
    in-process worker (LocalCluster(processes=False)) shares the caller's BLAS.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


class CpuAccumulator:
    """``acc += a @ b`` over K panels, in one C-ordered host buffer.

    Each gemm call computes one ``block`` of the accumulator: OpenBLAS's rounding depends on the
    call's M and N, so fixed blocks (aligned to the output, whatever the tile) make the bytes
    independent of the tiling and so of the cluster. ``upper``: a Gram product's diagonal tile,
    where ``b`` is ``a`` transposed: blocks below the diagonal are left at zero (the writer
    mirrors the upper triangle) and diagonal blocks take ?syrk's upper triangle.
    """

    def __init__(
        self,
        shape: tuple[int, int],
        dtype: np.dtype[Any] | str,
        block: tuple[int, int] | None = None,
        upper: bool = False,
    ) -> None:
        self.acc = zeros(shape, dtype)  # memory of an earlier task's accumulator, when free
        self.block = (
            (max(block[0], 1), max(block[1], 1)) if block else (max(shape[0], 1), max(shape[1], 1))
        )
        self.upper = upper
        single_threaded_blas()

    def add(self, a: NDArray[Any], b: NDArray[Any], rows: tuple[int, int] | None = None) -> None:
        """acc[rows] += a @ b; a band must start on a block row, so each gemm call (and so
        each rounding) is the same as in a whole-accumulator call."""
        r0, r1 = band_rows(rows, self.acc.shape[0])
        if r0 % self.block[0]:
            raise ValueError(f"rows {r0}:{r1} must start on a block row of {self.block[0]}")
        acc = self.acc[r0:r1]
        if a.shape[1] == 0 or acc.size == 0:
            return
        a, b, exact_plan = self._exact_operands(a, b)
        if exact_plan is None:
            a, b = (x if x.dtype == acc.dtype else x.astype(acc.dtype) for x in (a, b))
        (m, k), n = a.shape, b.shape[1]
        if (m, n) != acc.shape or b.shape[0] != k:
            raise ValueError(f"panels {a.shape} @ {b.shape} don't fit accumulator rows {acc.shape}")
        (bm, bn) = self.block
        block = self._block
        if exact_plan is not None:
            block = functools.partial(self._exact_block, exact_plan)
        calls = [
            functools.partial(
                block, a[i : i + h], b[:, j : j + w], acc[i : i + h, j : j + w], r0 + i == j
            )
            for i in range(0, m, bm)
            for j in range(0, n, bn)
            for h, w in ((min(bm, m - i), min(bn, n - j)),)
            if not (self.upper and j + w <= r0 + i)  # below the diagonal: a mirrored block
        ]
        _run_all(calls)

    def _exact_operands(
        self, a: NDArray[Any], b: NDArray[Any]
    ) -> tuple[NDArray[Any], NDArray[Any], tuple[str, int] | None]:
        """Into an integer accumulator: the panels as the float of their exact blocks, and the
        blocks (kernels.exact.operands). Else the panels as given and None."""
        if not exact.is_integer(self.acc.dtype):
            return a, b, None
        return exact.operands(a, b, self.acc.dtype)

    def _block(self, a: NDArray[Any], b: NDArray[Any], out: NDArray[Any], diagonal: bool) -> None:
        """out += a @ b with one BLAS call (?syrk on an upper tile's diagonal block)."""
        blas_product(a, b, out, diagonal and self.upper, beta=1.0)

    def _exact_block(
        self,
        plan: tuple[str, int],
        a: NDArray[Any],
        b: NDArray[Any],
        out: NDArray[Any],
        diagonal: bool,
    ) -> None:
        """out += a @ b for an integer ``out`` and integer-valued float panels: a float product
        per K block short enough to be exact (``plan``), each added into ``out`` exactly."""
        dtype, step = plan
        if not dtype:  # values beyond what float64 multiplies exactly: numpy's integer product
            out += a.astype(out.dtype) @ b.astype(out.dtype)
            return
        part = np.zeros(out.shape, dtype)  # ?syrk writes the upper triangle only: keep 0 below
        for k0 in range(0, a.shape[1], step):
            ak, bk = a[:, k0 : k0 + step], b[k0 : k0 + step]
            blas_product(ak, bk, part, diagonal and self.upper, beta=0.0)
            if out.dtype == np.bool_:
                out |= part != 0
            else:
                out += part.astype(out.dtype)  # whole numbers in range: converted exactly

    def result(self, rows: tuple[int, int] | None = None) -> NDArray[Any]:
        r0, r1 = band_rows(rows, self.acc.shape[0])
        return self.acc[r0:r1]

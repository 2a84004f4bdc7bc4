"""Exact integer (and bool) products on the GPU, through our float kernels (kernels.exact).

Panels come as the float that holds their integers exactly. Each K block short enough that no
partial sum can leave the float's exact integers is multiplied by the float kernel into a
zeroed float temp, which ``flush`` adds into the integer accumulator (converted to an integer
first, so the add is exact at any size) and zeroes again for the next block. Whatever order the
kernel sums in, the bytes are numpy's integer product. numba is imported lazily.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from kernels import exact
from kernels.cuda.jit import jit_kernel, launch_lock
from kernels.cuda.launch import tiled_launch

TENSOR_EXACT = 2**11
"""Integers of at most this magnitude are exact in TF32 (11 significant bits): the tensor-core
kernels multiply them exactly, and their fp32 sums stay exact within a K block."""
FLUSH_TILE = 16
"""Edge of the elementwise kernels' thread blocks."""

FloatProduct = Callable[[str, str, Any, Any, Any, Any], None]
"""(float dtype, precision, a, b, c, stream): queue ``c += a @ b`` with our kernel for them
(kernels.cuda.host.launch_float)."""

# numba.cuda, bound on first use: the simulator swaps its fake module in by rewriting globals.
cuda: Any = None


class ExactBlocks(NamedTuple):
    """How an integer product is cut into exact float products."""

    dtype: str
    """The float the blocks multiply in; "": not even float64 holds a product (then the block
    is an integer product on the host)."""
    step: int
    """Columns of K per block."""
    peak: int
    """max |x| over both panels."""


def exact_blocks(panel_dtype: Any, a_max: int, b_max: int, k: int) -> ExactBlocks:
    """kernels.exact.blocks from the panels' max |values| (the staged engine measures them on
    the host buffers: the device panels never come back)."""
    return ExactBlocks(*exact.blocks(panel_dtype, a_max, b_max, k), max(int(a_max), int(b_max)))


def host_panels(
    a: NDArray[Any], b: NDArray[Any], acc_dtype: Any
) -> tuple[NDArray[Any], NDArray[Any], ExactBlocks]:
    """kernels.exact.operands, with the panels' peak (which the tensor kernels need)."""
    a, b, (dtype, step) = exact.operands(a, b, acc_dtype)
    return a, b, ExactBlocks(dtype, step, max(exact.largest(a), exact.largest(b)))


def tensor_exact(blocks: ExactBlocks, precision: str) -> bool:
    """True when the tensor-core kernel of ``precision`` multiplies these blocks exactly."""
    return precision != "fp32" and blocks.dtype == "float32" and blocks.peak <= TENSOR_EXACT


class Scratch:
    """Device temps of one stream's exact products: a float ``part`` per dtype, the shape of
    the accumulator (zeroed once, each flush zeroes what it used), and the blocks of panels
    that must be made contiguous or converted. Reused panel after panel, in stream order."""

    def __init__(self) -> None:
        self.parts: dict[str, Any] = {}
        self.blocks: dict[str, Any] = {}

    def part(self, rows: int, cols: int, dtype: str, stream: Any) -> Any:
        """A zero ``(rows, cols)`` float block: the first rows of one that bands share."""
        have = self.parts.get(dtype)
        if have is None or have.shape[0] < rows or have.shape[1] != cols:
            from numba.cuda.cudadrv import driver

            _drained(stream, have)
            have = self.parts[dtype] = _device_array((rows, cols), dtype)
            if have.nbytes:  # queued on the stream, like every use of it
                driver.device_memset(have, 0, have.nbytes, stream)
        return have[:rows]

    def contiguous(self, which: str, src: Any, dtype: str, stream: Any) -> Any:
        """``src`` (a strided view, or another dtype) copied into a C-ordered ``dtype`` block."""
        size = src.shape[0] * src.shape[1]
        have = self.blocks.get(which)
        if have is None or have.size < size or have.dtype != np.dtype(dtype):
            _drained(stream, have)
            have = self.blocks[which] = _device_array((max(size, 1),), dtype)
        dst = have[:size].reshape(src.shape)
        launch_elementwise(gather_kernel(), dst, src, stream)
        return dst


_stream_scratch: weakref.WeakKeyDictionary[Any, Scratch] = weakref.WeakKeyDictionary()


def stream_scratch(stream: Any) -> Scratch:
    """The scratch of ``stream`` (a shared device's engines each have their own streams); it
    goes with the stream."""
    if stream not in _stream_scratch:
        _stream_scratch[stream] = Scratch()
    return _stream_scratch[stream]


def exact_gemm(
    acc: Any,
    a: Any,
    b: Any,
    blocks: ExactBlocks,
    scratch: Scratch,
    product: FloatProduct,
    stream: Any = 0,
    precision: str = "fp32",
) -> None:
    """Queue ``acc += a @ b`` exactly, for an integer (or bool) device ``acc`` and device panels
    of integer-valued floats: one float ``product`` per exact K block, each flushed into
    ``acc``."""
    (m, k), n = a.shape, b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return
    if not blocks.dtype:  # past float64's exact products: numpy's integer product
        host = [x.copy_to_host(stream=stream) for x in (a, b)]
        if stream:
            stream.synchronize()
        add_host_product(acc, host[0].astype(acc.dtype) @ host[1].astype(acc.dtype), stream)
        return
    dtype = blocks.dtype
    tensor = precision if tensor_exact(blocks, precision) else "fp32"
    part = scratch.part(m, n, dtype, stream)
    for k0 in range(0, k, blocks.step):
        w = min(blocks.step, k - k0)
        ak, bk = a, b[k0 : k0 + w]  # rows of b: a C-ordered view
        if w < k or a.dtype != dtype:  # a block of a's columns is strided: made C-ordered
            ak = scratch.contiguous("a", a[:, k0 : k0 + w], dtype, stream)
        if b.dtype != dtype:
            bk = scratch.contiguous("b", bk, dtype, stream)
        product(dtype, tensor, ak, bk, part, stream)
        launch_elementwise(flush_kernel(np.dtype(acc.dtype)), acc, part, stream)


def add_host_product(acc: Any, part: NDArray[Any], stream: Any = 0) -> None:
    """Queue ``acc += part`` for an integer host ``part`` (integer products on the host)."""
    from numba import cuda

    dev = cuda.to_device(np.ascontiguousarray(part), stream=stream)
    launch_elementwise(flush_kernel(np.dtype(acc.dtype)), acc, dev, stream)
    _drained(stream, dev)  # ``dev`` is freed on return


def _drained(stream: Any, old: Any) -> None:
    """Before a device buffer queued work may still read is dropped: wait for the stream."""
    if old is not None and stream:
        stream.synchronize()


def launch_elementwise(kernel: Callable[..., None], dst: Any, src: Any, stream: Any) -> None:
    """One thread per element of ``dst`` (nothing for an empty one)."""
    if dst.shape[0] == 0 or dst.shape[1] == 0:
        return
    cfg = tiled_launch(dst.shape[0], dst.shape[1], FLUSH_TILE)
    with launch_lock():
        jit_kernel(kernel, None)[cfg.grid, cfg.block, stream](dst, src)


def _device_array(shape: tuple[int, ...], dtype: str) -> Any:
    from numba import cuda as numba_cuda

    return numba_cuda.device_array(shape, dtype=np.dtype(dtype))


def _bind_cuda() -> Any:
    global cuda
    import numba.cuda

    cuda = numba.cuda
    return numba


@functools.cache
def flush_kernel(acc_dtype: np.dtype[Any]) -> Callable[..., None]:
    """Plain Python kernel ``flush(acc, part)``: acc += part, part = 0, elementwise. ``part``
    holds integers (floats that hold them exactly, or integers): each is converted to a 64-bit
    integer, then to ``acc``'s type (wrapping as numpy does), so the add itself is an integer
    add. A bool ``acc`` ORs in ``part != 0`` (numpy's bool product)."""
    numba = _bind_cuda()
    elem = numba.from_dtype(np.dtype(acc_dtype))
    wide = numba.int64

    def flush_add(acc, part):  # type: ignore[no-untyped-def]
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # along columns: coalesced
        i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        if i < acc.shape[0] and j < acc.shape[1]:  # no barrier: threads outside may leave
            acc[i, j] += elem(wide(part[i, j]))
            part[i, j] = 0

    def flush_or(acc, part):  # type: ignore[no-untyped-def]
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        if i < acc.shape[0] and j < acc.shape[1]:
            if part[i, j] != 0:
                acc[i, j] = True
            part[i, j] = 0

    kernel = flush_or if np.dtype(acc_dtype) == np.bool_ else flush_add
    kernel.__name__ = f"flush_{np.dtype(acc_dtype).name}"
    return kernel


@functools.cache
def gather_kernel() -> Callable[..., None]:
    """Plain Python kernel ``gather(dst, src)``: dst = src elementwise, converting (a strided
    column block of a panel into a C-ordered one; float32 panels into a float64 block)."""
    _bind_cuda()

    def gather(dst, src):  # type: ignore[no-untyped-def]
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        if i < dst.shape[0] and j < dst.shape[1]:
            dst[i, j] = src[i, j]

    return gather


def inspected_kernels() -> list[tuple[str, Callable[..., None], tuple[tuple[str, bool], ...]]]:
    """The elementwise kernels of the integer route as `python -m kernels inspect` compiles
    them: (name, kernel, each argument's (dtype, C-contiguous))."""
    pairs = (("int32", "float32"), ("int64", "float32"), ("int64", "float64"), ("bool", "float32"))
    flushes = [
        (f"flush_{acc}_{part}", flush_kernel(np.dtype(acc)), ((acc, True), (part, True)))
        for acc, part in pairs
    ]
    gathers = [
        (f"gather_{src}_{dst}", gather_kernel(), ((dst, True), (src, False)))
        for src, dst in (("float32", "float32"), ("float32", "float64"), ("float64", "float64"))
    ]
    return flushes + gathers

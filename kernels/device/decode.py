"""Decoding a panel's chunks on the device (--gpu-decode): the host reads the stored zstd
frames, the copy engine moves them compressed, nvCOMP decodes them on the GPU and a small
kernel places each chunk's part of the panel (cast to the compute dtype) where it belongs.

The host then does no decoding at all: it reads bytes. nvCOMP needs a real GPU; in Numba's
CUDA simulator the frames are decoded on the host with numcodecs instead and then placed by
the same kernel, so everything but the nvCOMP call is tested without a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kernels.cuda.launch import MAX_GRID_Y

CODEC = "zstd"
"""The one stored codec decoded on the device: zarr's zstd chunks are plain zstd frames (LZ4
in numcodecs carries a header of its own, Blosc is a container)."""


@dataclass(frozen=True)
class ChunkPiece:
    """One stored chunk of a panel and the part of it the panel takes."""

    offset: int
    """Where its compressed bytes start in the staged byte buffer."""
    size: int
    """Compressed bytes."""
    shape: tuple[int, int]
    """The decoded chunk's shape (edge chunks are stored whole)."""
    take: tuple[int, int, int, int]
    """Rows r0:r1 and columns c0:c1 of the decoded chunk that the panel takes."""
    at: tuple[int, int]
    """The panel row and column where they land."""


@dataclass(frozen=True)
class CompressedPanel:
    """What a panel's fill staged instead of decoded elements: compressed chunks."""

    pieces: tuple[ChunkPiece, ...]
    dtype: str
    """The stored element dtype (little-endian) the frames decode to."""
    nbytes: int
    """Compressed bytes staged (the pieces end there)."""
    bytes_read: int
    """The panel's elements as stored, counted like a host decode would count them."""


def can_decode_on_device() -> bool:
    """Runs on a worker: in the simulator (numcodecs stands in), or where nvCOMP's Python
    package imports (it needs a GPU only to decode)."""
    from kernels.cuda.host import simulated

    if simulated():
        return True
    try:
        from nvidia import nvcomp  # noqa: F401
    except ImportError:
        return False
    return True


def decode_on_device(
    staged: NDArray[np.uint8], panel: CompressedPanel, dest: Any, stream: Any
) -> Any:
    """Queue on ``stream``: copy the compressed frames in, decode them, place every piece
    into the device array ``dest``. ``staged`` must stay untouched until the copy is done.

    Returns what the queued work reads (the compressed and decoded device buffers): hold it
    until the stream has passed this point. nvCOMP's decode parses the frames first, so the
    call waits for the copy in (and what the stream queued before it)."""
    from numba import cuda

    from kernels.cuda.host import launch_lock, simulated

    if not panel.pieces:
        return None
    if simulated():
        chunks = [_host_decoded(staged, piece, panel.dtype, stream) for piece in panel.pieces]
    else:
        compressed = cuda.device_array(panel.nbytes, dtype=np.uint8, stream=stream)
        compressed.copy_to_device(staged[: panel.nbytes], stream=stream)
        chunks = _nvcomp_decoded(compressed, panel, stream)  # views owning nvCOMP's batch
    for chunk, piece in zip(chunks, panel.pieces, strict=True):
        r0, r1, c0, c1 = piece.take
        i, j = piece.at
        part, into = chunk[r0:r1, c0:c1], dest[i : i + r1 - r0, j : j + c1 - c0]
        with launch_lock():
            _place_kernel()[place_grid(part.shape), (16, 16), stream](part, into)
    return chunks


def _host_decoded(staged: NDArray[np.uint8], piece: ChunkPiece, dtype: str, stream: Any) -> Any:
    """The simulator's stand-in for nvCOMP: numcodecs decodes the frame on the host."""
    from numba import cuda
    from numcodecs import Zstd

    frame = staged[piece.offset : piece.offset + piece.size]
    chunk = np.empty(piece.shape, dtype=np.dtype(dtype))
    Zstd().decode(frame, out=chunk)  # into exactly the chunk's size, whatever the frame says
    return cuda.to_device(chunk, stream=stream)


def _nvcomp_decoded(compressed: Any, panel: CompressedPanel, stream: Any) -> list[Any]:
    from numba import cuda
    from nvidia import nvcomp

    handle = _stream_handle(stream)
    codec = nvcomp.Codec(
        algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=handle
    )
    batch = nvcomp.as_arrays(
        compressed, [p.offset for p in panel.pieces], [p.size for p in panel.pieces], handle
    )
    decoded = codec.decode(batch, data_type=np.dtype(panel.dtype).str)
    # The batch owns the decoded memory (an index of it is a view that must not outlive it):
    # every numba view keeps it, and the compressed input, alive.
    keep = (decoded, batch, compressed)
    return [
        cuda.from_cuda_array_interface(
            decoded[i].__cuda_array_interface__, owner=keep, sync=False
        ).reshape(piece.shape)
        for i, piece in enumerate(panel.pieces)
    ]


def _stream_handle(stream: Any) -> int:
    handle = stream.handle
    value = getattr(handle, "value", handle)  # ctypes c_void_p, or the driver binding's CUstream
    return int(value or 0)


def place_grid(shape: tuple[int, int], max_y: int = MAX_GRID_Y) -> tuple[int, int]:
    """Blocks of 16 x 16 threads: x along columns, so a warp reads along a row; y at most
    CUDA's gridDim.y limit, the kernel striding over the rows beyond it."""
    return max((shape[1] + 15) // 16, 1), min(max((shape[0] + 15) // 16, 1), max_y)


_PLACE = """
def place(src, dest):
    j, i = cuda.grid(2)
    step = cuda.gridDim.y * cuda.blockDim.y
    if j < src.shape[1]:
        while i < src.shape[0]:
            dest[i, j] = src[i, j]  # numba casts as numpy's astype does
            i += step
"""


@functools.cache
def _place_kernel() -> Any:
    """``dest[i, j] = src[i, j]`` over a 2-D grid. Built from source so that ``cuda`` is a
    global of the kernel: the simulator swaps it there."""
    from numba import cuda

    namespace: dict[str, Any] = {"cuda": cuda}
    exec(compile(_PLACE, "<place_chunk>", "exec"), namespace)
    return cuda.jit(namespace["place"])

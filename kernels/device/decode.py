"""Decoding a panel's chunks on the device (--gpu-decode): the host reads the stored zstd
frames, the copy engine moves them compressed, nvCOMP decodes them on the GPU and a small
kernel places each chunk's part of the panel (cast to the compute dtype) where it belongs.

The host then does no decoding at all: it reads bytes. nvCOMP needs a real GPU; in Numba's
CUDA simulator the frames are decoded on the host with numcodecs instead (or by a fake nvCOMP
module the tests install) and then placed by the same kernel, so everything but nvCOMP's own
kernels is tested without a GPU.
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


DECODED_ALIGN = 16
"""Each decoded chunk starts 16-byte aligned in the decoder's buffer (nvCOMP: "if in doubt
use 16B alignment"), so a view of it is aligned for any element type."""


class PanelDecoder:
    """One engine's device decoder, bound to the stream its copies run on (the engine's h2d
    stream). It keeps for the engine's life what a call per panel would make anew: nvCOMP's
    ``Codec`` (thread-local by nvCOMP's rules; an engine runs in one thread), a device buffer
    for the compressed frames and one for the decoded chunks (grown, never shrunk), and the
    decompression configs, built from the sizes the host already knows (every chunk decodes
    to exactly its shape's bytes: pipeline.store.chunks.raw checks each frame's declared
    size before staging it). So a panel's decode is queued like a copy: no host wait.

    nvCOMP chunking: one zarr chunk is one zstd frame is one nvCOMP chunk -- a frame cannot
    be split without decoding it. nvCOMP decodes a frame with one thread block, so a panel's
    decode runs as wide as its frame count (pipeline.plan.device_model.device_decode_rate).
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.codec: Any = None
        self.configs: dict[tuple[int, ...], Any] = {}
        """Decompression config per tuple of decoded chunk sizes."""
        self.buffers: dict[str, Any] = {}
        self.panels = 0

    def decode_into(self, staged: NDArray[np.uint8], panel: CompressedPanel, dest: Any) -> Any:
        """Queue on the stream: copy the compressed frames in, decode them, place every
        piece into the device array ``dest``. ``staged`` must stay untouched until the copy
        is done. Returns what the queued work reads: hold it until the stream has passed."""
        from kernels.cuda.host import launch_lock

        if not panel.pieces:
            return None
        self.panels += 1
        nvcomp = _nvcomp()
        if nvcomp is None:  # the simulator without nvCOMP: numcodecs stands in
            chunks, keep = self._host_decoded(staged, panel), None
        else:
            chunks, keep = self._device_decoded(nvcomp, staged, panel)
        for chunk, piece in zip(chunks, panel.pieces, strict=True):
            r0, r1, c0, c1 = piece.take
            i, j = piece.at
            part, into = chunk[r0:r1, c0:c1], dest[i : i + r1 - r0, j : j + c1 - c0]
            with launch_lock():
                _place_kernel()[place_grid(part.shape), (16, 16), self.stream](part, into)
        return keep

    def _device_decoded(
        self, nvcomp: Any, staged: NDArray[np.uint8], panel: CompressedPanel
    ) -> tuple[list[Any], Any]:
        handle = _stream_handle(self.stream)
        if self.codec is None:
            self.codec = nvcomp.Codec(
                algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=handle
            )
        sizes, starts = decoded_layout(panel)
        compressed, replaced = self._buffer("compressed", panel.nbytes)
        decoded, replaced_too = self._buffer("decoded", starts[-1])
        compressed[: panel.nbytes].copy_to_device(staged[: panel.nbytes], stream=self.stream)
        sources = nvcomp.as_arrays(
            compressed, [p.offset for p in panel.pieces], [p.size for p in panel.pieces], handle
        )
        outputs = nvcomp.as_arrays(decoded, starts[:-1], list(sizes), handle)
        config = self._config(sizes, sources)
        # Bytes out ('|u1'): zstd decodes bytes; the views below give them their type. The
        # outputs are our buffers, so nothing indexes nvCOMP's batch (which would wait).
        self.codec.decode(sources, data_type="|u1", out=outputs, decompression_config=config)
        chunks = [
            decoded[s : s + n].view(np.dtype(panel.dtype)).reshape(p.shape)
            for s, n, p in zip(starts, sizes, panel.pieces, strict=False)
        ]
        return chunks, (sources, outputs, replaced, replaced_too)

    def _config(self, sizes: tuple[int, ...], sources: Any) -> Any:
        """The decompression config of a batch of chunks decoding to ``sizes``, built once
        per engine and shape of batch from the sizes (nvCOMP's pre-configure API); where
        that API is missing, parsed from the first batch (one stream sync per shape)."""
        if sizes not in self.configs:
            try:
                made = self.codec.compression_config(list(sizes))
                self.configs[sizes] = self.codec.decompression_config(made)
            except (AttributeError, TypeError):
                self.configs[sizes] = self.codec.decompression_config(sources)
        return self.configs[sizes]

    def _buffer(self, name: str, nbytes: int) -> tuple[Any, Any]:
        """The reused device buffer ``name`` of at least ``nbytes`` (a larger one replaces
        it; the replaced one is returned to be held until the queued work passed)."""
        from numba import cuda

        held = self.buffers.get(name)
        if held is not None and held.shape[0] >= nbytes:
            return held, None
        # Allocated with no stream: its array interface names none, so nvCOMP does not
        # synchronise on one when wrapping it.
        self.buffers[name] = cuda.device_array(max(nbytes, 1), dtype=np.uint8)
        return self.buffers[name], held

    def _host_decoded(self, staged: NDArray[np.uint8], panel: CompressedPanel) -> list[Any]:
        """The simulator's stand-in for nvCOMP: numcodecs decodes each frame on the host,
        into exactly the chunk's size, and it is copied into the reused decoded buffer."""
        from numcodecs import Zstd

        sizes, starts = decoded_layout(panel)
        decoded, _ = self._buffer("decoded", starts[-1])
        dtype, chunks = np.dtype(panel.dtype), []
        for piece, start, size in zip(panel.pieces, starts, sizes, strict=False):
            frame = staged[piece.offset : piece.offset + piece.size]
            chunk = np.empty(piece.shape, dtype=dtype)
            Zstd().decode(frame, out=chunk)
            view = decoded[start : start + size]
            view.copy_to_device(chunk.reshape(-1).view(np.uint8), stream=self.stream)
            chunks.append(view.view(dtype).reshape(piece.shape))
        return chunks


def decoded_layout(panel: CompressedPanel) -> tuple[tuple[int, ...], list[int]]:
    """(each piece's decoded bytes, where each starts in the decoded buffer and, last, the
    buffer's size): whole chunks, each start aligned to DECODED_ALIGN."""
    itemsize = np.dtype(panel.dtype).itemsize
    sizes = tuple(p.shape[0] * p.shape[1] * itemsize for p in panel.pieces)
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + -(-size // DECODED_ALIGN) * DECODED_ALIGN)
    return sizes, starts


def _nvcomp() -> Any:
    """nvCOMP's Python module, or None in the simulator when it does not import (on a real
    GPU a missing nvCOMP is an error: --gpu-decode checked it on every worker)."""
    from kernels.cuda.host import simulated

    try:
        from nvidia import nvcomp
    except ImportError:
        if simulated():
            return None
        raise
    return nvcomp


def _stream_handle(stream: Any) -> int:
    handle = getattr(stream, "handle", None)  # the simulator's stream has none
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

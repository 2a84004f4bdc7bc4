"""A stand-in for nvCOMP's Python module (``nvidia.nvcomp``) that records every call and
decodes for real with numcodecs, on Numba's simulated device arrays.

It models the parts of nvCOMP 6's API that --gpu-decode uses and the costs the API documents:
``decode`` without a ``decompression_config`` "internally calls configure_decompression on src,
forcing a stream synchronization", as does ``decompression_config`` of source arrays (it parses
the frames); indexing a decoded batch "waits for the work that produced this batch". Each of
these is counted in ``syncs``; a ``Codec`` used from two threads is an error (nvCOMP: a Codec is
thread-local).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numcodecs
import numpy as np


@dataclass
class Calls:
    codecs: list[dict[str, Any]] = field(default_factory=list)
    """The keyword arguments of every Codec made."""
    decodes: list[dict[str, Any]] = field(default_factory=list)
    compression_configs: list[list[int]] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)
    buffers: list[int] = field(default_factory=list)
    """id() of every buffer wrapped by as_arrays."""


class BatchArray:
    def __init__(self, buffer: Any, offsets: list[int], sizes: list[int], calls: Calls) -> None:
        self.buffer, self.offsets, self.sizes, self.calls = buffer, offsets, sizes, calls

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> Any:
        self.calls.syncs.append("batch[i]")  # "Waits for the work that produced this batch"
        return self.buffer[self.offsets[i] : self.offsets[i] + self.sizes[i]]


def make_module(*, preconfigure: bool = True, corrupt: bool = False) -> tuple[Any, Calls]:
    """(the fake module, its call record). ``preconfigure=False``: a Codec without nvCOMP's
    pre-configure API (``compression_config``). ``corrupt=True``: every decode fails as a
    device fault would (a CUDA error from the decode)."""
    calls = Calls()

    class Codec:
        def __init__(self, **kwargs: Any) -> None:
            calls.codecs.append(kwargs)
            self.thread = threading.get_ident()

        def _same_thread(self) -> None:
            if threading.get_ident() != self.thread:
                raise RuntimeError("a Codec used from two threads (nvCOMP: thread-local)")

        def decompression_config(self, made: Any) -> Any:
            self._same_thread()
            if isinstance(made, BatchArray):
                calls.syncs.append("decompression_config(sources)")  # parses the frames
                return ("parsed", tuple(made.sizes))
            return ("configured", made)

        def decode(
            self, srcs: BatchArray, data_type: str = "", out: Any = None,
            decompression_config: Any = None,
        ) -> Any:  # fmt: skip
            self._same_thread()
            calls.decodes.append({"data_type": data_type, "config": decompression_config,
                                  "n": len(srcs)})  # fmt: skip
            if decompression_config is None:
                calls.syncs.append("decode without config")
            if corrupt:
                raise RuntimeError("nvCOMP: CUDA error: an illegal memory access was encountered")
            data = srcs.buffer.copy_to_host()
            for k in range(len(srcs)):
                s, n = srcs.offsets[k], srcs.sizes[k]
                frame = data[s : s + n].tobytes()
                decoded = np.frombuffer(numcodecs.Zstd().decode(frame), np.uint8)
                o, size = out.offsets[k], out.sizes[k]
                assert decoded.size == size, "decoded size differs from the configured size"
                out.buffer[o : o + size].copy_to_device(decoded)
            return out

    if preconfigure:

        def compression_config(self: Any, sizes: list[int]) -> Any:
            calls.compression_configs.append(list(sizes))
            return ("sizes", tuple(sizes))

        Codec.compression_config = compression_config  # type: ignore[attr-defined]

    def as_arrays(buffer: Any, offsets: list[int], sizes: list[int], stream: int = 0) -> Any:
        calls.buffers.append(id(buffer))
        return BatchArray(buffer, list(offsets), list(sizes), calls)

    module = SimpleNamespace(
        Codec=Codec, as_arrays=as_arrays, BitstreamKind=SimpleNamespace(RAW="RAW")
    )
    return module, calls

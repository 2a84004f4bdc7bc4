"""The small device interface the staged engine drives.

It is CUDA's own model, cut to what a K loop needs: streams run their operations in order,
events recorded on one stream order work on another, copies and kernels are asynchronous to
the host. ``kernels.device.gpu`` implements it with Numba CUDA, ``kernels.device.emulated``
with modelled time instead of math; ``kernels.device.rates`` measures the rates of any
implementation. Device arrays support ``dev[r0:r1]`` (a band of whole rows, still contiguous).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from numpy.typing import DTypeLike, NDArray

from kernels.device.decode import CompressedPanel
from kernels.memory.allocators import Allocator

DeviceArray = Any
"""A device buffer of the implementation (numba DeviceNDArray, emulated placeholder)."""


class Stream(Protocol):
    def synchronize(self) -> None:
        """Block the host until everything queued on the stream so far has finished."""


class Event(Protocol):
    def record(self, stream: Any) -> None:
        """Mark the point of ``stream`` reached by the work queued on it so far."""

    def wait(self, stream: Any) -> None:
        """Work queued on ``stream`` from now on starts only after the recorded point."""

    def synchronize(self) -> None:
        """Block the host until the recorded point is reached."""


class Device(Protocol):
    """What the staged engine needs from a GPU (real, simulated or emulated)."""

    name: str
    allocator: Allocator
    """Host memory that copies from and to are asynchronous with (pinned on a GPU)."""

    def stream(self) -> Stream: ...
    def event(self) -> Event: ...
    def empty(self, shape: tuple[int, int], dtype: DTypeLike) -> DeviceArray: ...
    def zeros(self, shape: tuple[int, int], dtype: DTypeLike, stream: Stream) -> DeviceArray:
        """A device array zeroed by work queued on ``stream`` (never the legacy stream, which
        would be a barrier for every other stream)."""

    def copy_to_device(self, host: NDArray[Any], dev: DeviceArray, stream: Stream) -> None:
        """Queue host -> device; ``host`` must stay untouched until the copy has finished."""

    def copy_to_host(self, dev: DeviceArray, host: NDArray[Any], stream: Stream) -> None:
        """Queue device -> host; ``host`` is valid once the stream (or an event) says so."""

    def gemm(
        self,
        acc: DeviceArray,
        a: DeviceArray,
        b: DeviceArray,
        stream: Stream,
        rows: tuple[int, int] | None = None,
        precision: str = "fp32",
        peaks: tuple[int, int] | None = None,
    ) -> None:
        """Queue ``acc += a @ b``; with ``rows=(r0, r1)`` only ``acc[r0:r1]``, ``a`` holding
        just those rows; ``precision`` (kernels.backends.PRECISIONS) picks the arithmetic.
        ``peaks``: an integer ``acc``'s exact product (kernels.exact) of float panels whose
        max |values| they are."""

    def decoder(self, stream: Stream) -> Decoder:
        """A decoder of compressed panels whose work is queued on ``stream``: an engine makes
        one and keeps it (its codec and device buffers are reused panel after panel)."""


class Decoder(Protocol):
    def decode_into(
        self, staged: NDArray[np.uint8], panel: CompressedPanel, dev: DeviceArray
    ) -> object:
        """Queue: copy ``panel``'s compressed chunks (the start of ``staged``) to the device,
        decode them there and place them into ``dev`` (kernels.device.decode), with no host
        wait. Returns what the queued work reads: hold it until the stream has passed."""

"""--gpu-decode's nvCOMP calls, against a fake nvCOMP module that records them and decodes with
numcodecs on the simulator's device arrays (tests/kernels/fake_nvcomp.py): one Codec per
engine, reused device buffers, a decompression config built from the known sizes, and no call
that makes the host wait, panel after panel."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernels.cuda import host as cuda_host
from kernels.device.engine import Panel, StagedProduct
from kernels.device.gpu import NumbaDevice
from kernels.memory.allocators import numpy_allocator
from kernels.memory.buffers import BufferPool
from pipeline.store.chunks.raw import read_compressed
from tests.kernels import fake_nvcomp
from tests.kernels.test_device_decode import zstd_array

pytestmark = [
    pytest.mark.skipif(not cuda_host.cuda_available(), reason="needs NUMBA_ENABLE_CUDASIM=1"),
    pytest.mark.filterwarnings("ignore:Grid size .* under-utilization"),
]
WIDTHS = [(0, 12), (12, 24), (24, 29)]  # K panels of A's 29 columns: 2, 2 and 1 chunk wide


def install(monkeypatch: pytest.MonkeyPatch, **options: Any) -> fake_nvcomp.Calls:
    module, calls = fake_nvcomp.make_module(**options)
    import nvidia

    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", module)
    monkeypatch.setattr(nvidia, "nvcomp", module, raising=False)
    return calls


def product(a: Any, b: np.ndarray, compressed: bool) -> bytes:
    """A @ b over WIDTHS on the simulated device, A's panels staged compressed or decoded."""

    def fill_a(k: tuple[int, int]) -> Any:
        def fill(out: np.ndarray) -> Any:
            if compressed:
                return read_compressed(a, (0, 37), k, out.reshape(-1).view(np.uint8))
            np.copyto(out, a[:, k[0] : k[1]])
            return None

        return fill

    def fill_b(k: tuple[int, int]) -> Any:
        return lambda out: np.copyto(out, b[k[0] : k[1]])

    pool = BufferPool(numpy_allocator, 1 << 24)
    engine = StagedProduct(NumbaDevice(), (37, 11), "float32", pool, decode_threads=2)
    engine.run([Panel(k1 - k0, fill_a((k0, k1)), fill_b((k0, k1))) for k0, k1 in WIDTHS])
    return engine.result().tobytes()


def test_one_codec_per_engine_configured_from_the_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = zstd_array(tmp_path / "a.zarr", "float32", rounded=True)  # 37 x 29 in 8 x 6 chunks
    b = np.random.default_rng(3).standard_normal((29, 11)).astype("float32")
    on_host = product(a, b, compressed=False)
    calls = install(monkeypatch)
    assert product(a, b, compressed=True) == on_host  # bitwise
    assert len(calls.codecs) == 1  # one Codec for the engine's three panels
    assert calls.codecs[0]["algorithm"] == "Zstd" and calls.codecs[0]["bitstream_kind"] == "RAW"
    assert len(calls.decodes) == 3
    assert all(d["config"] is not None and d["data_type"] == "|u1" for d in calls.decodes)
    assert calls.syncs == []  # no parse, no config-less decode, no batch indexed
    chunk = 8 * 6 * 4  # every piece decodes to one whole chunk: 5 chunk rows
    assert calls.compression_configs == [[chunk] * 10, [chunk] * 5]  # once per batch shape
    # The device buffers are reused: panel 1's compressed and decoded buffers serve panel 2
    # and the narrower panel 3 (a buffer may be wrapped again, never allocated again).
    assert len(set(calls.buffers)) == 2


def test_without_the_preconfigure_api_one_parse_per_batch_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An nvCOMP without ``compression_config``: the config is parsed from the first batch
    of each shape (one stream sync), then reused."""
    a = zstd_array(tmp_path / "a.zarr", "float32", rounded=True)
    b = np.random.default_rng(4).standard_normal((29, 11)).astype("float32")
    on_host = product(a, b, compressed=False)
    calls = install(monkeypatch, preconfigure=False)
    assert product(a, b, compressed=True) == on_host
    assert calls.syncs == ["decompression_config(sources)"] * 2  # two batch shapes, 3 panels


def test_a_decode_failure_reaches_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = zstd_array(tmp_path / "a.zarr", "float32", rounded=True)
    b = np.ones((29, 11), "float32")
    install(monkeypatch, corrupt=True)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        product(a, b, compressed=True)

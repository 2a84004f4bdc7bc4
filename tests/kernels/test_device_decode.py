"""--gpu-decode: zstd chunks staged compressed, decoded and placed on the device.

In the simulator the frames are decoded on the host (numcodecs) in nvCOMP's place and placed by
the same kernel; on the emulated device the decode takes modelled time on the compute engine;
on a real GPU (marked `gpu`) nvCOMP decodes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr

from kernels.cuda import host as cuda_host
from kernels.device.emulated import EmulatedDevice
from kernels.device.engine import Panel, StagedProduct
from kernels.device.gpu import NumbaDevice
from kernels.memory.allocators import numpy_allocator
from pipeline.store.chunks.raw import device_decodable, read_compressed

needs_cuda = pytest.mark.skipif(
    not cuda_host.cuda_available(), reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1"
)
tiny_grid = pytest.mark.filterwarnings("ignore:Grid size .* under-utilization")
SHAPE, CHUNKS = (37, 29), (8, 6)  # edge chunks on both axes


def zstd_array(
    path: Path, dtype: str, zarr_format: int = 3, rounded: bool = False, **extra: Any
) -> Any:
    rng = np.random.default_rng(7)
    data = rng.standard_normal(SHAPE) * 100
    data = (np.round(data) if rounded else data).astype(dtype)  # rounded: compresses
    compressor = zarr.codecs.ZstdCodec() if zarr_format == 3 else numcodecs.Zstd()
    array = zarr.create_array(
        str(path), shape=SHAPE, chunks=CHUNKS, dtype=dtype, compressors=compressor,
        zarr_format=zarr_format, **extra,
    )  # fmt: skip
    array[...] = data
    return array


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ({"zarr_format": 3}, True),
        ({"zarr_format": 2}, True),
        ({"zarr_format": 3, "shards": (16, 12)}, False),  # a shard holds many frames
        ({"zarr_format": 3, "compressors": zarr.codecs.BloscCodec()}, False),
        ({"zarr_format": 2, "compressors": numcodecs.LZ4()}, False),  # numcodecs' own header
        ({"zarr_format": 3, "compressors": zarr.codecs.ZstdCodec(checksum=True)}, False),
        ({"zarr_format": 3, "crc32c": True}, True),  # checked on the host before the device
        ({"zarr_format": 2, "filters": [numcodecs.Delta("<f4")]}, False),
    ],
)
def test_which_arrays_qualify(tmp_path: Path, kind: dict[str, Any], expected: bool) -> None:
    fmt = kind.pop("zarr_format")
    compressors = kind.pop("compressors", None)
    if kind.pop("crc32c", False):
        kind["serializer"] = zarr.codecs.BytesCodec()
        compressors = [zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()]
    array = zstd_array(tmp_path / "a.zarr", "float32", fmt, **kind)
    if compressors is not None:
        array = zarr.create_array(
            str(tmp_path / "b.zarr"), shape=SHAPE, chunks=CHUNKS, dtype="float32",
            compressors=compressors, zarr_format=fmt,
        )  # fmt: skip
    assert device_decodable(array) is expected


def test_packed_frames_and_placement(tmp_path: Path) -> None:
    """Every chunk touching the block, each frame 16-byte aligned, each piece's take and place
    covering the block exactly once."""
    array = zstd_array(tmp_path / "a.zarr", "float32")
    out = np.zeros(40_000, np.uint8)
    panel = read_compressed(array, (3, 30), (5, 29), out)
    assert panel is not None
    assert len(panel.pieces) == 4 * 5  # chunk rows 0..3, chunk columns 0..4
    assert all(p.offset % 16 == 0 for p in panel.pieces)
    covered = np.zeros((27, 24), int)
    for p in panel.pieces:
        r0, r1, c0, c1 = p.take
        covered[p.at[0] : p.at[0] + r1 - r0, p.at[1] : p.at[1] + c1 - c0] += 1
        frame = out[p.offset : p.offset + p.size].tobytes()
        assert len(numcodecs.Zstd().decode(frame)) == 8 * 6 * 4  # whole chunks, edges too
    assert (covered == 1).all()
    assert panel.bytes_read == 27 * 24 * 4
    assert read_compressed(array, (3, 30), (5, 29), np.zeros(100, np.uint8)) is None  # no room


def crc32c_array(path: Path) -> Any:
    array = zarr.create_array(
        str(path), shape=SHAPE, chunks=CHUNKS, dtype="float32",
        compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()],
    )  # fmt: skip
    array[...] = np.round(np.random.default_rng(5).standard_normal(SHAPE) * 100)
    return array


def test_crc32c_is_checked_and_stripped_on_the_host(tmp_path: Path) -> None:
    """Chunks stored with zarr's crc32c: the staged frames are the zstd frames alone; one
    changed byte in one chunk sends the whole panel to the host path (which names it)."""
    array = crc32c_array(tmp_path / "a.zarr")
    out = np.zeros(40_000, np.uint8)
    panel = read_compressed(array, (0, 16), (0, 12), out)
    assert panel is not None and len(panel.pieces) == 4
    for p in panel.pieces:
        frame = out[p.offset : p.offset + p.size].tobytes()
        assert len(numcodecs.Zstd().decode(frame)) == 8 * 6 * 4
    chunk = tmp_path / "a.zarr" / "c" / "1" / "1"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01  # in the frame's blocks: its header still says 192 bytes
    chunk.write_bytes(bytes(data))
    assert read_compressed(array, (0, 16), (0, 12), out) is None
    assert read_compressed(array, (0, 8), (0, 12), out) is not None  # chunk row 0 only


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f[:-3],  # cut short: the last block ends past the chunk
        lambda f: f + b"\0\0\0",  # bytes after the frame
        lambda f: b"\0" + f[1:],  # no zstd magic
        lambda f: numcodecs.Zstd().encode(np.zeros(8 * 6 + 1, "f4").tobytes()),  # 196 bytes
    ],
)
def test_malformed_frames_never_reach_the_device(tmp_path: Path, damage: Any) -> None:
    """Without a stored checksum the host checks what a frame's structure says: the header,
    the blocks ending exactly at the chunk's end, the declared size."""
    array = zstd_array(tmp_path / "a.zarr", "float32")
    chunk = tmp_path / "a.zarr" / "c" / "0" / "0"
    chunk.write_bytes(damage(chunk.read_bytes()))
    assert read_compressed(array, (0, 8), (0, 6), np.zeros(10_000, np.uint8)) is None
    assert read_compressed(array, (0, 8), (6, 12), np.zeros(10_000, np.uint8)) is not None


def test_missing_chunks_decode_on_the_host(tmp_path: Path) -> None:
    array = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=SHAPE, chunks=CHUNKS, dtype="float32",
        compressors=zarr.codecs.ZstdCodec(),
    )  # fmt: skip
    array[:8, :6] = 1.0  # only chunk (0, 0) is stored
    assert read_compressed(array, (0, 16), (0, 6), np.zeros(10_000, np.uint8)) is None


@needs_cuda
@tiny_grid
@pytest.mark.parametrize(("stored", "compute", "fmt"), [
    ("float32", "float32", 3), ("float32", "float64", 2), ("int16", "float64", 3),
])  # fmt: skip
def test_decoded_on_the_device_equals_zarr(
    tmp_path: Path, stored: str, compute: str, fmt: int
) -> None:
    array = zstd_array(tmp_path / "a.zarr", stored, fmt)
    rows, cols = (3, 30), (5, 29)
    expected = np.ascontiguousarray(array[3:30, 5:29], dtype=compute)
    staged = np.zeros(64_000, np.uint8)  # tiny chunks: frames bigger than their elements
    panel = read_compressed(array, rows, cols, staged)
    assert panel is not None
    device = NumbaDevice()
    stream = device.stream()
    dev = device.empty(expected.shape, compute)
    device.decoder(stream).decode_into(staged, panel, dev)
    got = np.full(expected.shape, np.nan, compute)
    device.copy_to_host(dev, got, stream)
    stream.synchronize()
    assert got.tobytes() == expected.tobytes()


@needs_cuda
@tiny_grid
def test_staged_engine_mixes_compressed_and_decoded_panels(tmp_path: Path) -> None:
    """A panels decoded on the device, B panels on the host: the product is bitwise the one
    of panels decoded on the host."""
    a = zstd_array(tmp_path / "a.zarr", "float32", rounded=True)  # 37 x 29
    rng = np.random.default_rng(3)
    b = rng.standard_normal((29, 11)).astype("float32")
    widths = [(0, 12), (12, 24), (24, 29)]
    staged = []

    def compressed(k: tuple[int, int]) -> Any:
        def fill(out: np.ndarray) -> Any:
            panel = read_compressed(a, (0, 37), k, out.reshape(-1).view(np.uint8))
            staged.append(panel is not None)
            return panel if panel is not None else np.copyto(out, a[:, k[0] : k[1]])

        return fill

    def decoded(block: np.ndarray) -> Any:
        return lambda out: np.copyto(out, block)

    def run(panels: list[Panel]) -> bytes:
        engine = StagedProduct(NumbaDevice(), (37, 11), "float32", pool(), decode_threads=2)
        engine.run(panels)
        return engine.result().tobytes()

    on_device = [Panel(k1 - k0, compressed((k0, k1)), decoded(b[k0:k1])) for k0, k1 in widths]
    on_host = [Panel(k1 - k0, decoded(a[:, k0:k1]), decoded(b[k0:k1])) for k0, k1 in widths]
    assert run(on_device) == run(on_host)
    assert staged == [True, True, True]  # every A panel went compressed


def test_emulated_decode_takes_the_compute_engine(tmp_path: Path) -> None:
    """Compressed bytes over the copy engine, then the decode on the compute engine at the
    modelled rate (decoded bytes / decode GB/s)."""
    array = zstd_array(tmp_path / "a.zarr", "float32")
    staged = np.zeros(64_000, np.uint8)
    panel = read_compressed(array, (0, 37), (0, 29), staged)
    assert panel is not None
    with EmulatedDevice(1.0, 1e-4, decode_gbps=1e-4) as device:  # 0.1 MB/s: visible times
        stream = device.stream()
        device.decoder(stream).decode_into(staged, panel, device.empty((37, 29), "f4"))
        stream.synchronize()
        copy, decode = device.timeline
    assert (copy.engine, copy.amount) == ("h2d", panel.nbytes)
    assert (decode.engine, decode.name) == ("compute", "decode")
    assert decode.amount == 5 * 5 * 8 * 6 * 4  # 25 whole chunks decoded
    assert decode.start >= copy.end
    assert decode.end - decode.start == pytest.approx(decode.amount / 1e5, rel=1e-6)


def test_emulated_decode_is_as_wide_as_the_panels_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each frame is one thread block's work: 25 frames at 1 kB/s each decode at 25 kB/s,
    under the device's 100 kB/s peak."""
    import kernels.constants

    monkeypatch.setattr(kernels.constants, "FRAME_DECODE_BYTES_PER_SECOND", 1e3)
    array = zstd_array(tmp_path / "a.zarr", "float32")
    staged = np.zeros(64_000, np.uint8)
    panel = read_compressed(array, (0, 37), (0, 29), staged)
    assert panel is not None and len(panel.pieces) == 25
    with EmulatedDevice(1.0, 1e-4, decode_gbps=1e-4) as device:
        stream = device.stream()
        device.decoder(stream).decode_into(staged, panel, device.empty((37, 29), "f4"))
        stream.synchronize()
        _, decode = device.timeline
    assert decode.end - decode.start == pytest.approx(decode.amount / 25e3, rel=1e-6)


@pytest.mark.gpu
def test_nvcomp_decodes_zarr_zstd_frames(tmp_path: Path) -> None:
    """On a real GPU: nvCOMP's decode of zarr's frames equals numcodecs'."""
    test_decoded_on_the_device_equals_zarr(tmp_path, "float32", "float32", 3)


def pool() -> Any:
    from kernels.memory.buffers import BufferPool

    return BufferPool(numpy_allocator, 1 << 24)


def test_prepare_refuses_inputs_with_no_zstd_frames(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--gpu-decode with neither input decodable on the GPU is refused before anything runs;
    with one, the other is named as decoded on the host."""
    from pipeline import prepare
    from pipeline.errors import UsageError

    blosc = {"compressors": zarr.codecs.BloscCodec()}
    a = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=(8, 6), chunks=(4, 3), dtype="f4", **blosc
    )
    b = zarr.create_array(
        str(tmp_path / "b.zarr"), shape=(6, 5), chunks=(3, 5), dtype="f4", **blosc
    )
    z = zstd_array(tmp_path / "z.zarr", "float32")  # 37 x 29
    with pytest.raises(UsageError, match="A and B both have chunks that are not plain zstd"):
        prepare(a, b, str(tmp_path / "c.zarr"), backend="emulated", gpu_decode=True)
    assert not (tmp_path / "c.zarr").exists()
    zb = zarr.create_array(
        str(tmp_path / "zb.zarr"), shape=(29, 5), chunks=(8, 5), dtype="f4", **blosc
    )
    with caplog.at_level("WARNING", logger="pipeline"):
        prepare(z, zb, str(tmp_path / "c.zarr"), backend="emulated", gpu_decode=True)
    assert "B has chunks that are not plain zstd frames" in caplog.text


@pytest.mark.parametrize(
    ("shape", "grid"),
    [
        ((37, 29), (2, 3)),  # ragged: whole blocks cover it
        ((0, 0), (1, 1)),  # an empty part still gets one block
        ((16 * 65535, 8), (1, 65535)),  # the tallest chunk one pass covers
        ((16 * 65535 + 1, 8), (1, 65535)),  # taller: capped, the kernel strides
        ((10**8, 3), (1, 65535)),
    ],
)
def test_place_grid_never_exceeds_cuda_grid_y(
    shape: tuple[int, int], grid: tuple[int, int]
) -> None:
    from kernels.device.decode import place_grid

    assert place_grid(shape) == grid


@needs_cuda
@tiny_grid
@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("int16", "float64")])
def test_place_strides_over_rows_beyond_the_grid(dtypes: tuple[str, str]) -> None:
    """Two block rows (32 rows) place a 70-row chunk: every row lands, cast like astype."""
    from numba import cuda

    from kernels.device.decode import _place_kernel, place_grid

    src = np.arange(70 * 5).reshape(70, 5).astype(dtypes[0])
    dest = cuda.to_device(np.full((72, 6), -1, dtypes[1]))
    grid = place_grid(src.shape, max_y=2)
    assert grid == (1, 2)
    with cuda_host.launch_lock():
        _place_kernel()[grid, (16, 16)](cuda.to_device(src), dest[1:71, :5])
    out = dest.copy_to_host()
    np.testing.assert_array_equal(out[1:71, :5], src.astype(dtypes[1]))
    assert (out[0] == -1).all() and (out[71] == -1).all() and (out[:, 5] == -1).all()

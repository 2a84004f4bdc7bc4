"""Small chunks read without zarr's per-chunk path (pipeline.store.chunks.unsharded): the same
values as zarr's read, every layout it takes, zarr's path for the ones it does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

from pipeline.errors import ChunkSizeError
from pipeline.store.chunks import unsharded as chunk_read
from pipeline.store.inputs import open_input, read_block

V3 = {"zstd": ZstdCodec(), "blosc": BloscCodec(), "gzip": GzipCodec(), "none": None}
V2 = {"zstd": numcodecs.Zstd(), "lz4": numcodecs.LZ4(), "zlib": numcodecs.Zlib(), "none": None}


def _store(path: Path, data: Any, chunks: tuple[int, int], fmt: int, codec: str) -> Any:
    if fmt == 3:
        compressors: Any = None if V3[codec] is None else [V3[codec]]
        zarr.create_array(str(path), data=data, chunks=chunks, compressors=compressors)
    else:
        zarr.create_array(str(path), data=data, chunks=chunks, zarr_format=2, compressors=V2[codec])
    return open_input(str(path))


@pytest.mark.parametrize(
    ("fmt", "codec", "dtype", "compute"),
    [
        (3, "zstd", "float32", "float32"),  # the common case
        (3, "blosc", "float64", "float64"),
        (3, "gzip", "int16", "float64"),  # cast while copying
        (3, "none", "float32", "float64"),  # stored raw
        (2, "zstd", "float32", "float32"),
        (2, "lz4", "int32", "float64"),
        (2, "zlib", "float64", "float32"),  # narrowed as astype would
        (2, "none", "uint8", "float32"),
    ],
)
@pytest.mark.parametrize(
    ("rows", "cols"),
    [
        ((0, 30), (0, 50)),  # everything, edge chunks cut
        ((3, 17), (5, 44)),  # unaligned both ways
        ((7, 8), (49, 50)),  # one element
    ],
)
def test_same_values_as_zarr(
    tmp_path: Path,
    fmt: int,
    codec: str,
    dtype: str,
    compute: str,
    rows: tuple[int, int],
    cols: tuple[int, int],
) -> None:
    data = (np.random.default_rng(3).standard_normal((30, 50)) * 100).astype(dtype)
    array = _store(tmp_path / "a.zarr", data, (7, 9), fmt, codec)
    assert chunk_read.readable(array)
    out = np.full((rows[1] - rows[0], cols[1] - cols[0]), np.nan, dtype=compute)
    assert chunk_read.read_into(array, rows, cols, out)
    want = np.asarray(data[rows[0] : rows[1], cols[0] : cols[1]]).astype(compute)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(read_block(array, rows, cols, compute), want)


def test_zarr_reads_what_it_does_not_take(tmp_path: Path) -> None:
    data = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    sharded = zarr.create_array(str(tmp_path / "s.zarr"), data=data, chunks=(8, 8), shards=(16, 16))
    big = zarr.create_array(str(tmp_path / "b.zarr"), data=np.zeros((600, 600)), chunks=(600, 600))
    assert chunk_read.layout(sharded) is None
    assert chunk_read.layout(big) is not None and not chunk_read.readable(big)  # 2.9 MB chunk
    np.testing.assert_array_equal(read_block(sharded, (3, 40), (0, 9), "float32"), data[3:40, :9])


def test_an_unstored_chunk_is_zarrs_fill_value(tmp_path: Path) -> None:
    array = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=(8, 8), chunks=(4, 4), dtype="f4", fill_value=np.nan
    )
    array[:4, :] = 1.0  # chunks (1, 0) and (1, 1) never written: NaN
    stored = open_input(str(tmp_path / "a.zarr"))
    out = np.zeros((8, 8), dtype="float32")
    assert not chunk_read.read_into(stored, (0, 8), (0, 8), out)
    block = read_block(stored, (0, 8), (0, 8), "float32")
    assert (block[:4] == 1).all() and np.isnan(block[4:]).all()


def test_a_chunk_declaring_another_size_is_refused_with_its_key(tmp_path: Path) -> None:
    array = _store(tmp_path / "a.zarr", np.ones((8, 8), "float32"), (4, 4), 3, "zstd")
    liar = numcodecs.Zstd().encode(np.ones(32, "float32").tobytes())  # 128 bytes, not 64
    (tmp_path / "a.zarr" / "c" / "1" / "0").write_bytes(liar)
    with pytest.raises(ChunkSizeError, match=r"c/1/0 \(rows 4:8, columns 0:4\).*128"):
        read_block(array, (0, 8), (0, 8), "float32", "A", str(tmp_path / "a.zarr"))


def test_a_store_other_than_local_files() -> None:
    """Not zarr's local store: the chunks come in one round trip through the store."""
    data = np.arange(20 * 20, dtype="float64").reshape(20, 20)
    array = zarr.create_array(zarr.storage.MemoryStore(), data=data, chunks=(6, 6))
    out = np.empty((11, 13))
    assert chunk_read.read_into(array, (2, 13), (5, 18), out)
    np.testing.assert_array_equal(out, data[2:13, 5:18])


@pytest.mark.parametrize("chunk", [16, 64, 256])
def test_memory_within_the_model(tmp_path: Path, chunk: int) -> None:
    """A panel read holds no more than the memory model counts for zarr's read of it."""
    import tracemalloc

    from pipeline.plan.memory import zarr_bytes

    data = np.random.default_rng(1).random((1024, 1024), dtype=np.float32)
    array = _store(tmp_path / "a.zarr", data, (chunk, chunk), 3, "zstd")
    out = np.empty((1024, 256), dtype=np.float32)
    tracemalloc.start()
    try:
        assert chunk_read.read_into(array, (0, 1024), (256, 512), out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, data[:, 256:512])
    assert peak <= zarr_bytes((1024, 256), (chunk, chunk), (1024, 1024), 4), peak


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_a_block_takes_two_buffers_whatever_its_chunks(
    tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read buffer (grown for the largest stored chunk) and one decode buffer per block,
    not a pair per chunk: a 64x64 chunk's fixed costs were most of its time."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal((200, 120)).astype("float32")
    data[:50] = 1  # chunks that compress to a few bytes before ones that do not: it grows
    array = _store(tmp_path / "a.zarr", data, (10, 12), 3, codec)
    taken: list[int] = []
    real = chunk_read.scratch

    def counted(size: int) -> Any:
        taken.append(size)
        return real(size)

    monkeypatch.setattr(chunk_read, "scratch", counted)
    out = np.full((187, 101), np.nan, dtype="float32")
    assert chunk_read.read_into(array, (3, 190), (7, 108), out)  # 190 chunks, most cut
    np.testing.assert_array_equal(out, data[3:190, 7:108])
    assert len(taken) == 2, taken

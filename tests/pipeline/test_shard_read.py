"""Sharded inputs read past zarr's per-chunk path (pipeline.store.chunks.sharded): the same values
as zarr's read for every layout it takes, zarr's path for the rest, and a shard index that
lies refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec

from pipeline.errors import InputError
from pipeline.store.chunks import sharded as shard_read
from pipeline.store.inputs import open_input, read_block

INNER = {"zstd": [ZstdCodec()], "blosc": [BloscCodec()], "gzip": [GzipCodec()], "none": []}


def _store(
    path: Path,
    data: Any,
    shard: tuple[int, int] = (20, 28),
    inner: tuple[int, int] = (10, 7),
    codec: str = "zstd",
    at: str = "end",
    checksum: bool = True,
) -> Any:
    sharding = ShardingCodec(
        chunk_shape=inner,
        codecs=[BytesCodec(), *INNER[codec]],
        index_codecs=[BytesCodec(), Crc32cCodec()] if checksum else [BytesCodec()],
        index_location=at,
    )
    array = zarr.create_array(
        str(path), shape=data.shape, dtype=data.dtype, chunks=shard, serializer=sharding,
        compressors=None, fill_value=0,
    )  # fmt: skip
    array[:] = data
    return open_input(str(path))


@pytest.mark.parametrize(
    ("codec", "at", "checksum", "dtype", "compute"),
    [
        ("zstd", "end", True, "float32", "float32"),  # zarr's default sharding
        ("blosc", "start", True, "float64", "float64"),
        ("gzip", "end", False, "int16", "float64"),  # cast while copying
        ("none", "start", False, "float32", "float64"),  # stored raw
    ],
)
@pytest.mark.parametrize(
    ("rows", "cols"),
    [
        ((0, 53), (0, 71)),  # everything: edge shards and edge chunks cut
        ((3, 47), (5, 60)),  # unaligned both ways, across shards
        ((20, 40), (28, 56)),  # one whole shard
        ((7, 8), (49, 50)),  # one element
    ],
)
def test_same_values_as_zarr(
    tmp_path: Path,
    codec: str,
    at: str,
    checksum: bool,
    dtype: str,
    compute: str,
    rows: tuple[int, int],
    cols: tuple[int, int],
) -> None:
    data = (np.random.default_rng(3).standard_normal((53, 71)) * 100 + 1000).astype(dtype)
    array = _store(tmp_path / "a.zarr", data, codec=codec, at=at, checksum=checksum)
    assert shard_read.readable(array)
    out = np.full((rows[1] - rows[0], cols[1] - cols[0]), np.nan, dtype=compute)
    assert shard_read.read_into(array, rows, cols, out)
    want = np.asarray(data[rows[0] : rows[1], cols[0] : cols[1]]).astype(compute)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(read_block(array, rows, cols, compute), want)


def test_a_shards_chunks_come_in_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = np.random.default_rng(1).standard_normal((64, 64)).astype("float32")
    array = _store(tmp_path / "a.zarr", data, shard=(32, 32), inner=(8, 8))
    reads: list[int] = []
    real = os.preadv

    def counted(fd: int, buffers: Any, offset: int) -> int:
        reads.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(shard_read.os, "preadv", counted)
    out = np.empty((64, 20), "float32")
    assert shard_read.read_into(array, (0, 64), (3, 23), out)  # 2 shards, 24 inner chunks
    np.testing.assert_array_equal(out, data[:, 3:23])
    assert len(reads) == 2


def test_runs_join_neighbours_within_the_span() -> None:
    gap = shard_read.GAP_BYTES
    ranges = np.array([[100, 10], [0, 50], [50, 50], [110 + gap + 1, 5]], dtype=np.uint64)
    assert shard_read._runs(ranges, 1 << 30) == [[1, 2, 0], [3]]
    assert shard_read._runs(ranges, 100) == [[1, 2], [0], [3]]  # 0..110 is past 100 bytes
    assert shard_read._runs(ranges[:1], 1) == [[0]]  # one chunk, however long


def test_zarrs_path_for_what_it_does_not_take(tmp_path: Path) -> None:
    data = np.arange(40 * 40, dtype="float32").reshape(40, 40)
    plain = zarr.create_array(str(tmp_path / "p.zarr"), data=data, chunks=(8, 8))
    memory = zarr.create_array(
        zarr.storage.MemoryStore(), data=data, chunks=(8, 8), shards=(16, 16)
    )
    big = zarr.create_array(
        str(tmp_path / "b.zarr"),
        data=np.zeros((1024, 1024)),
        chunks=(512, 512),
        shards=(1024, 1024),
    )  # 2 MiB inner chunks
    assert shard_read.shard_layout(plain) is None and not shard_read.readable(plain)
    assert shard_read.shard_layout(memory) is None  # not local files
    assert shard_read.shard_layout(big) is not None and not shard_read.readable(big)
    np.testing.assert_array_equal(read_block(memory, (3, 30), (5, 33), "float32"), data[3:30, 5:33])


def test_an_empty_chunk_or_shard_is_zarrs_fill_value(tmp_path: Path) -> None:
    data = np.ones((40, 56), "float32")
    data[:10, :7] = 0  # one inner chunk all fill value: not stored
    data[20:, 28:] = 0  # one whole shard: no file
    array = _store(tmp_path / "a.zarr", data)
    out = np.empty((40, 56), "float32")
    assert not shard_read.read_into(array, (0, 10), (0, 7), out)
    assert not shard_read.read_into(array, (20, 40), (28, 56), out)
    assert shard_read.read_into(array, (10, 20), (0, 28), out[:10, :28])
    np.testing.assert_array_equal(read_block(array, (0, 40), (0, 56), "float32"), data)


def test_an_index_that_lies_is_refused(tmp_path: Path) -> None:
    data = np.random.default_rng(2).standard_normal((20, 28)).astype("float32") + 5
    wrap = (2**64 - 8).to_bytes(8, "little")  # with a length of 8 or more, wraps to < 2**64
    for name, damage in (("crc", b"\x00\x00\x00\x00"), ("range", None), ("wrap", wrap)):
        url = tmp_path / f"{name}.zarr"
        array = _store(url, data, checksum=name == "crc")
        shard = url / "c" / "0" / "0"
        raw = bytearray(shard.read_bytes())
        if name == "crc":
            raw[-4:] = damage  # the index's crc32c
        elif name == "range":
            raw[-16:-8] = (len(raw) * 4).to_bytes(8, "little")  # an offset past the file
        else:
            raw[-16:-8] = damage  # the last chunk's offset
        shard.write_bytes(bytes(raw))
        out = np.empty((20, 28), "float32")
        with pytest.raises(ValueError, match="crc32c|past its"):
            shard_read.read_into(array, (0, 20), (0, 28), out)
        with pytest.raises(InputError, match="c/0/0"):
            read_block(array, (0, 20), (0, 28), "float32", "A", str(url))


@pytest.mark.parametrize("chunk", [16, 64])
def test_memory_within_the_model(tmp_path: Path, chunk: int) -> None:
    """A panel read holds no more than the memory model counts for zarr's read of it."""
    import tracemalloc

    from pipeline.plan.memory import zarr_bytes

    data = np.random.default_rng(1).random((1024, 1024), dtype=np.float32)
    array = _store(tmp_path / "a.zarr", data, shard=(512, 512), inner=(chunk, chunk))
    out = np.empty((1024, 256), dtype=np.float32)
    tracemalloc.start()
    try:
        assert shard_read.read_into(array, (0, 1024), (256, 512), out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, data[:, 256:512])
    assert peak <= zarr_bytes((1024, 256), (chunk, chunk), (1024, 1024), 4), peak

"""Bounded reads of hostile inputs: stores built by hand whose chunk files are FIFOs, folders,
links to devices or sparse giants, whose shard indexes claim gigabytes, and whose codec chains
(Zarr v2 filters, bz2, lzma, v3 chains of compressors) decode a few KB into gigabytes, are
refused within seconds and well under 256 MiB, naming the chunk; honest arrays of the same
codecs multiply as usual. The storage-options file and variable are bounded too."""

from __future__ import annotations

import bz2
import functools
import json
import lzma
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import pytest
import zarr
from distributed import Client
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec

from pipeline import multiply
from pipeline.errors import InputError, StoredObjectError, UsageError
from pipeline.store import inputs
from pipeline.store.chunks.input_store import InputStore
from pipeline.store.chunks.raw import read_compressed
from pipeline.store.options_file import ENV, options_from_env, options_from_file
from tests.helpers import REPO, assert_product, run_cli
from tests.pipeline.test_hostile import GZIP_V3, ZSTD_V3, deflated, rle_frame, v3_meta

GiB, MiB = 2**30, 2**20
PEAK = 256 * MiB

# Each URL opened and read whole in a fresh interpreter; then its own high-water mark (VmHWM:
# ru_maxrss would carry the forking parent's size over into the child).
READ = """
import re, sys
from pipeline.store import inputs
for url in sys.argv[1:]:
    try:
        a = inputs.open_input(url, None, "A")
        inputs.read_block(a, (0, a.shape[0]), (0, a.shape[1]), "float32", "A", url)
        print("read")
    except Exception as e:
        print(type(e).__name__, str(e).replace("\\n", " "))
with open("/proc/self/status") as f:
    print(int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024)
"""


def read_each(urls: list[str]) -> tuple[list[str], int]:
    """Per URL what reading it said, and the peak memory of reading them all; a read that
    blocks (a FIFO opened for reading waits for a writer forever) fails the timeout."""
    done = subprocess.run(
        [sys.executable, "-c", READ, *urls],
        capture_output=True, text=True, cwd=REPO, check=True, timeout=120,
    )  # fmt: skip
    *said, peak = done.stdout.strip().split("\n")
    assert len(said) == len(urls), done.stdout + done.stderr
    return said, int(peak)


# -- what stands where a chunk should be -------------------------------------------------

LAYOUTS: dict[str, tuple[dict[str, Any], tuple[int, int], str]] = {
    # name: (zarr.create_array options, shape, the key replaced)
    "v3-small": ({"chunks": (100, 100)}, (200, 200), "c/1/0"),  # chunk_read's path
    "v3-large": ({"chunks": (600, 600)}, (1200, 600), "c/1/0"),  # zarr's, 1.4 MB chunks
    "v2": ({"chunks": (100, 100), "zarr_format": 2}, (200, 200), "1.0"),
    "sharded": ({"chunks": (100, 100), "shards": (200, 200)}, (400, 200), "c/1/0"),  # shard_read
    "sharded-large": ({"chunks": (600, 600), "shards": (1200, 600)}, (1200, 600), "c/0/0"),
}


def sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # holes: no disk, no page cache until read


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    # name: (put it at the path, what the refusal says is there)
    "fifo": (os.mkfifo, "is a FIFO"),
    "folder": (lambda p: p.mkdir(), "is a folder"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "is a character device"),
    "dev-urandom": (lambda p: p.symlink_to("/dev/urandom"), "is a character device"),
    "sparse-3GiB": (lambda p: sparse(p, 3 * GiB), "is a 3.0 GiB file where at most"),
}


def hostile_store(root: Path, layout: str, hostile: str) -> tuple[str, str]:
    """An honest float32 array in ``layout`` with one stored chunk (or shard) replaced by
    ``hostile``: its URL and that key."""
    options, shape, key = LAYOUTS[layout]
    url = str(root / f"{layout}-{hostile}.zarr")
    zarr.create_array(url, data=np.ones(shape, "float32"), **options)
    (Path(url) / key).unlink()
    HOSTILE[hostile][0](Path(url) / key)
    return url, key


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_what_is_no_chunk_file_is_refused_unread(tmp_path: Path, layout: str) -> None:
    stores = [hostile_store(tmp_path, layout, hostile) for hostile in HOSTILE]
    said, peak = read_each([url for url, _ in stores])
    for (url, key), message, (_, found) in zip(stores, said, HOSTILE.values(), strict=True):
        assert message.startswith(f"StoredObjectError A ({url}) cannot be read: "), message
        assert f"its chunk {url}/{key} {found}" in message, message
        assert "restore that chunk from a good copy or rewrite A" in message, message
    assert peak < PEAK, f"peak {peak / MiB:.0f} MiB"


def test_metadata_is_read_within_its_bound(tmp_path: Path) -> None:
    fifo, huge = tmp_path / "fifo.zarr", tmp_path / "huge.zarr"
    fifo.mkdir()
    os.mkfifo(fifo / "zarr.json")
    huge.mkdir()
    sparse(huge / "zarr.json", 20 * MiB)
    said, peak = read_each([str(fifo), str(huge)])
    assert f"its metadata document {fifo}/zarr.json is a FIFO" in said[0], said
    assert "zarr.json is a 20.0 MiB file where at most 16.0 MiB can be needed" in said[1], said
    assert peak < PEAK


def test_an_input_read_directly_refuses_a_fifo_too(tmp_path: Path) -> None:
    """The GPU path's raw reads and zarr's own reads of an input go through the same checks."""
    url, key = hostile_store(tmp_path, "v3-small", "fifo")
    array = inputs.open_input(url)
    assert isinstance(array.store_path.store, InputStore)
    with pytest.raises(StoredObjectError, match=f"chunk {key} is a FIFO"):
        read_compressed(array, (0, 200), (0, 200), np.empty(2**20, np.uint8))
    with pytest.raises(StoredObjectError, match=f"chunk {key} is a FIFO"):
        array[:, :]


# -- decodes that would not stop ---------------------------------------------------------


@functools.cache
def streams(codec: str, copies: int = 20) -> bytes:
    """64 MiB of zeros as one bz2 or lzma stream, ``copies`` times over (streams one after
    another decode as one): 1.6 KB of bz2, 200 KB of lzma, 1.25 GiB decoded."""
    if codec == "bz2":
        return bz2.compress(bytes(64 * MiB), 9) * copies
    return lzma.compress(bytes(64 * MiB), preset=1) * copies


def v2_store(path: Path, frame: bytes, compressor: dict, filters: list | None = None) -> str:
    """A 1000x1000 float32 Zarr v2 array in one chunk, its stored bytes ``frame``."""
    path.mkdir()
    meta = {"zarr_format": 2, "shape": [1000, 1000], "chunks": [1000, 1000], "dtype": "<f4",
            "compressor": compressor, "fill_value": 0.0, "filters": filters,
            "order": "C"}  # fmt: skip
    (path / ".zarray").write_text(json.dumps(meta))
    (path / "0.0").write_bytes(frame)
    return str(path)


def v3_store(path: Path, frame: bytes, compressors: list[dict]) -> str:
    """The same in Zarr v3, stored through ``bytes`` and then ``compressors``."""
    path.mkdir()
    meta = v3_meta((1000, 1000), (1000, 1000))
    meta["codecs"] = [meta["codecs"][0], *compressors]
    (path / "zarr.json").write_text(json.dumps(meta))
    (path / "c" / "0").mkdir(parents=True)
    (path / "c" / "0" / "0").write_bytes(frame)
    return str(path)


DELTA = [{"id": "delta", "dtype": "<f4"}]
WIDER = [{"id": "astype", "encode_dtype": "<f8", "decode_dtype": "<f4"}]  # 8 MB compressed


@pytest.mark.parametrize(
    ("store", "key", "words"),
    [
        (  # a filter does not let the compressor decode unbounded
            lambda p: v2_store(p, rle_frame(2 * GiB, 2 * GiB), {"id": "zstd"}, DELTA),
            "0.0",
            "zstd chunk declares 2,147,483,648 bytes where it decodes into 1000x1000 float32 "
            "elements through delta, which can need at most 4,000,000",
        ),
        (
            lambda p: v2_store(p, rle_frame(2 * GiB, None), {"id": "zstd"}, DELTA),
            "0.0",
            "zstd chunk declares no size where it decodes into",
        ),
        (  # AsType to float64: the compressor's output may be twice the chunk, not more
            lambda p: v2_store(p, deflated(31), {"id": "gzip"}, WIDER),
            "0.0",
            "gzip chunk decodes past the 8,000,000 bytes 1000x1000 float32 elements through "
            "astype can need",
        ),
        (
            lambda p: v2_store(p, streams("bz2"), {"id": "bz2"}),
            "0.0",
            "bz2 chunk declares no size and decodes past the 4,000,000 bytes",
        ),
        (
            lambda p: v2_store(p, streams("lzma"), {"id": "lzma"}),
            "0.0",
            "lzma chunk declares no size and decodes past the 4,000,000 bytes",
        ),
        (  # the outer of two compressors is capped too
            lambda p: v3_store(p, rle_frame(2 * GiB, 2 * GiB), [GZIP_V3, ZSTD_V3]),
            "c/0/0",
            "zstd chunk declares 2,147,483,648 bytes where it decodes into 1000x1000 float32 "
            "elements through gzip, which can need at most 4,105,536",
        ),
        (
            lambda p: v3_store(p, deflated(31), [ZSTD_V3, GZIP_V3]),
            "c/0/0",
            "gzip chunk decodes past the 4,105,536 bytes 1000x1000 float32 elements through "
            "zstd can need",
        ),
    ],
)
def test_every_decode_is_capped(
    tmp_path: Path, store: Callable[[Path], str], key: str, words: str
) -> None:
    url = store(tmp_path / "a.zarr")
    assert os.path.getsize(Path(url) / key) < 3 * MiB  # 0.5 to 2 GiB decoded
    [message], peak = read_each([url])
    assert message.startswith(f"ChunkSizeError A ({url}) has a chunk of the wrong size: "), message
    assert f"{url}/{key} (rows 0:1000, columns 0:1000)" in message, message
    assert words in message, message
    assert peak < PEAK, f"peak {peak / MiB:.0f} MiB"


@pytest.mark.parametrize(
    ("store", "words"),
    [
        (lambda p: v2_store(p, b"", {"id": "base64"}), "its compressor 'base64' decodes"),
        (lambda p: v2_store(p, b"", None, [{"id": "base64"}]), "its filter 'base64' decodes"),
        (
            lambda p: v2_store(
                p,
                b"",
                {"id": "lzma", "format": lzma.FORMAT_RAW, "filters": [{"id": lzma.FILTER_LZMA2}]},
            ),
            "its compressor 'lzma' decodes",
        ),  # fmt: skip
    ],
)
def test_a_codec_nothing_bounds_is_refused_by_name(
    tmp_path: Path, store: Callable[[Path], str], words: str
) -> None:
    url = store(tmp_path / "a.zarr")
    with pytest.raises(InputError, match=rf"^A \({url}\): {words} .* rewrite the array with zstd"):
        inputs.open_input(url, None, "A")


# -- shards whose index lies --------------------------------------------------------------


def lying_shard(path: Path, length: int, size: int | None = None) -> str:
    """A 1000x1000 float32 array in one shard holding one inner chunk, its index claiming
    ``length`` bytes from offset 0; the shard file ``size`` bytes long (sparse) if given."""
    url = v3_store(path, b"", [])
    meta = v3_meta((1000, 1000), (1000, 1000), sharded=True)
    (path / "zarr.json").write_text(json.dumps(meta))
    index = np.array([0, length], "<u8").tobytes()
    index += google_crc32c.value(index).to_bytes(4, "little")
    frame = numcodecs.Zstd().encode(bytes(4_000_000))
    shard = path / "c" / "0" / "0"
    with open(shard, "wb") as f:
        f.write(frame)
        if size is not None:
            f.truncate(size - len(index))
        f.write(index)
    return url


def test_a_shard_index_claiming_gigabytes_is_read_within_the_file(tmp_path: Path) -> None:
    small = lying_shard(tmp_path / "small.zarr", 3 * GiB)  # the range runs past a small file
    sparse_shard = lying_shard(tmp_path / "sparse.zarr", 3 * GiB, 3 * GiB + 20)
    said, peak = read_each([small, sparse_shard])
    assert said[0].startswith(f"InputError A ({small}) has a chunk that cannot be read: ")
    assert f"{small}/c/0/0 (rows 0:1000, columns 0:1000)" in said[0], said
    assert f"its chunk {sparse_shard}/c/0/0 is a 3.0 GiB file where at most 3.9 MiB" in said[1]
    assert peak < PEAK, f"peak {peak / MiB:.0f} MiB"


def test_a_shard_index_giving_an_inner_chunk_too_much_is_refused(tmp_path: Path) -> None:
    """Within a shard no larger than it may be, one inner chunk's range is longer than any
    inner chunk can be (shard_read's path: 100x100 inner chunks of a 200x200 shard)."""
    url = str(tmp_path / "a.zarr")
    data = np.random.default_rng(0).random((200, 200)).astype("float32")
    zarr.create_array(url, data=data, chunks=(100, 100), shards=(200, 200))
    shard = Path(url) / "c" / "0" / "0"
    stored = shard.read_bytes()
    table = np.frombuffer(stored[-68:-4], "<u8").reshape(4, 2).copy()
    body = stored[: int(table[:, 0].max() + table[:, 1].max())] + bytes(250_000)
    table[0] = (0, len(body))  # inner chunk (0, 0) claims the whole body: ~400 KB
    index = table.tobytes() + google_crc32c.value(table.tobytes()).to_bytes(4, "little")
    shard.write_bytes(body + index)
    array = inputs.open_input(url, None, "A")
    claim = r"c/0/0 is a shard whose index gives [\d.]+ KiB for an inner chunk where at most"
    with pytest.raises(StoredObjectError, match=rf"{claim} 103\.5 KiB can be needed"):
        inputs.read_block(array, (0, 100), (0, 100), "float32", "A", url)


# -- the whole job ------------------------------------------------------------------------


def test_the_cli_names_a_refused_chunk_and_exits_2(tmp_path: Path) -> None:
    url, key = hostile_store(tmp_path, "v3-small", "fifo")
    b = str(tmp_path / "b.zarr")
    zarr.create_array(b, data=np.ones((200, 50), "float32"), chunks=(100, 50))
    out = tmp_path / "out.zarr"
    done = run_cli("multiply", url, b, str(out), "--no-progress", timeout=180)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    said = f"error: A ({url}) cannot be read: its chunk {url}/{key} is a FIFO; restore"
    assert errors[0].startswith(said), errors


def _v2(**options: Any) -> Callable[[str, np.ndarray, tuple[int, int]], None]:
    def write(url: str, data: np.ndarray, chunks: tuple[int, int]) -> None:
        zarr.create_array(url, data=data, chunks=chunks, zarr_format=2, **options)

    return write


def _v3(**options: Any) -> Callable[[str, np.ndarray, tuple[int, int]], None]:
    def write(url: str, data: np.ndarray, chunks: tuple[int, int]) -> None:
        zarr.create_array(url, data=data, chunks=chunks, **options)

    return write


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(
            _v2(filters=[numcodecs.Delta("<f4")], compressors=numcodecs.Zstd()), id="v2-delta"
        ),
        pytest.param(
            _v2(filters=[numcodecs.AsType("<f8", "<f4")], compressors=numcodecs.BZ2()),
            id="v2-astype-bz2",
        ),
        pytest.param(
            _v2(filters=[numcodecs.Shuffle(4)], compressors=numcodecs.LZ4()), id="v2-shuffle-lz4"
        ),
        pytest.param(_v2(compressors=numcodecs.BZ2()), id="v2-bz2"),
        pytest.param(_v2(compressors=numcodecs.LZMA()), id="v2-lzma"),
        pytest.param(
            _v3(serializer=BytesCodec(), compressors=[GzipCodec(), ZstdCodec(), Crc32cCodec()]),
            id="v3-gzip-zstd",
        ),
        pytest.param(
            _v3(
                serializer=ShardingCodec(
                    chunk_shape=(16, 16), codecs=[BytesCodec(), GzipCodec(), ZstdCodec()]
                ),
                compressors=None,
            ),
            id="v3-sharded-gzip-zstd",
        ),  # fmt: skip
    ],
)
def test_honest_arrays_of_these_codecs_multiply(
    tmp_path: Path, client: Client, write: Callable[[str, np.ndarray, tuple[int, int]], None]
) -> None:
    rng = np.random.default_rng(4)
    a = rng.integers(-8, 8, (96, 80)).astype("float32")  # Delta of integers is exact
    b = rng.integers(-8, 8, (80, 64)).astype("float32")
    a_url, b_url, out = (str(tmp_path / f"{n}.zarr") for n in "abc")
    write(a_url, a, (32, 16))
    write(b_url, b, (16, 32))
    np.testing.assert_array_equal(inputs.read_block(inputs.open_input(a_url), (0, 96), (0, 80),
                                                    "float32"), a)  # fmt: skip
    multiply(a_url, b_url, out, client=client)
    assert_product(zarr.open_array(out, mode="r")[:], a, b)


# -- the storage options ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (os.mkfifo, "is a FIFO, not a regular file"),
        (lambda p: p.symlink_to("/dev/zero"), "is a device or special file"),
        (lambda p: p.mkdir(), "is a folder"),
        (lambda p: sparse(p, 2 * MiB), "holds more than 1,048,576 bytes"),
        (lambda p: p.write_text('{"a": ' * 50 + "1" + "}" * 50), "nests objects or lists more"),
        (lambda p: p.write_text("[" * 100_000), "nests objects or lists more than 32 deep"),
        (lambda p: p.write_bytes(b'{"key": "\xff"}'), "is not UTF-8 text"),
    ],
)
def test_the_storage_options_file_is_bounded(
    tmp_path: Path, make: Callable[[Path], None], words: str
) -> None:
    path = tmp_path / "so.json"
    make(path)
    with pytest.raises(UsageError, match=f"^--storage-options-file {path} {words}"):
        options_from_file(str(path))


def test_the_storage_options_variable_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "[" * 100_000)
    with pytest.raises(UsageError, match=r"nests objects or lists more than 32 deep"):
        options_from_env()
    monkeypatch.setenv(ENV, json.dumps({"client_kwargs": {"config": {"retries": {"max": 3}}}}))
    assert options_from_env()["client_kwargs"]["config"]["retries"]["max"] == 3
    monkeypatch.setenv(ENV, " " * (MiB + 1))
    with pytest.raises(UsageError, match=r"holds more than 1,048,576 characters"):
        options_from_env()


# -- the store itself ---------------------------------------------------------------------


def test_input_store_reads_ranges_as_zarrs_local_store(tmp_path: Path) -> None:
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    from zarr.storage import LocalStore

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "0").write_bytes(bytes(range(100)))
    ours, theirs = InputStore(tmp_path, chunk_bytes=100), LocalStore(tmp_path, read_only=True)
    proto = default_buffer_prototype()
    ranges = (RangeByteRequest(10, 20), RangeByteRequest(90, 200), OffsetByteRequest(95))
    for byte_range in (None, *ranges, SuffixByteRequest(7), SuffixByteRequest(500)):
        got = sync(ours.get("c/0", proto, byte_range))
        want = sync(theirs.get("c/0", proto, byte_range))
        assert got is not None and want is not None
        assert got.to_bytes() == want.to_bytes(), byte_range
    assert sync(ours.get("c/1", proto)) is None  # not stored: the fill value
    assert sync(ours.get("c/0/0", proto)) is None  # under a file: not stored either
    with pytest.raises(StoredObjectError, match="a 100 B file where at most 99 B"):
        sync(ours.with_chunk_bytes(99).get("c/0", proto))

"""Hostile metadata is bounded: stores built by hand (zarr.json and raw chunk files written
here) whose metadata or frames claim absurd sizes are planned or refused in bounded time and
memory, before OUT exists, and a chunk never decodes into more than its own size."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
import zarr
from numcodecs import LZ4, Blosc, GZip, Zlib, Zstd

import pipeline
from pipeline.errors import ChunkSizeError, MemoryBudgetError, PlanLimitError
from pipeline.plan.limits import PlanLimits
from pipeline.plan.memory import ZARR_BYTES_PER_CHUNK, calculate_task_bytes, chunks_touched
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec
from pipeline.store import inputs
from pipeline.store.chunks.bounded import bounded
from pipeline.store.chunks.raw import read_compressed
from pipeline.store.chunks.zstd_frames import declared_size, first_frame_size
from tests.helpers import REPO, run_cli

GiB, MiB = 2**30, 2**20
MAGIC = (0xFD2FB528).to_bytes(4, "little")


def rle_frame(content: int, declared: int | None) -> bytes:
    """A zstd frame holding ``content`` zero bytes in 128 KiB RLE blocks (4 bytes each: 2 GiB
    is 64 KiB), its header declaring ``declared`` bytes (None: no size, a 128 KiB window)."""
    head = bytes([0x00, 0x38]) if declared is None else b"\xa0" + declared.to_bytes(4, "little")
    blocks, left = [], content
    while left:
        size = min(left, 2**17)
        left -= size
        header = size << 3 | 1 << 1 | (0 if left else 1)  # RLE, last block flag
        blocks.append(header.to_bytes(3, "little") + b"\0")
    return MAGIC + head + b"".join(blocks)


ZSTD_V3 = {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
BLOSC_V3 = {"name": "blosc", "configuration": {"typesize": 4, "cname": "lz4", "clevel": 5,
                                              "shuffle": "shuffle", "blocksize": 0}}  # fmt: skip
GZIP_V3 = {"name": "gzip", "configuration": {"level": 1}}


def v3_meta(
    shape: tuple[int, int], chunks: tuple[int, int], sharded: bool = False, codec: dict = ZSTD_V3
) -> dict:
    inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}, codec]
    codecs = inner
    if sharded:  # one inner chunk per shard
        index = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
        config = {"chunk_shape": list(chunks), "codecs": inner, "index_codecs": index,
                  "index_location": "end"}  # fmt: skip
        codecs = [{"name": "sharding_indexed", "configuration": config}]
    return {
        "zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0, "codecs": codecs, "attributes": {},
    }  # fmt: skip


def write_store(path: Path, frame: bytes, layout: str = "v3", codec: dict | None = None) -> str:
    """A 1000x1000 float32 array in one chunk whose stored bytes are ``frame``, by hand:
    ``layout`` v3, v3-sharded or v2; ``codec`` its compressor (default zstd)."""
    path.mkdir()
    if layout == "v2":
        meta = {"zarr_format": 2, "shape": [1000, 1000], "chunks": [1000, 1000], "dtype": "<f4",
                "compressor": codec or {"id": "zstd", "level": 1}, "fill_value": 0.0,
                "filters": None, "order": "C"}  # fmt: skip
        (path / ".zarray").write_text(json.dumps(meta))
        (path / "0.0").write_bytes(frame)
        return str(path)
    sharded = layout == "v3-sharded"
    meta = v3_meta((1000, 1000), (1000, 1000), sharded, codec or ZSTD_V3)
    (path / "zarr.json").write_text(json.dumps(meta))
    if sharded:  # the frame, then the index: offset and size (uint64), its crc32c
        index = np.array([0, len(frame)], "<u8").tobytes()
        frame += index + google_crc32c.value(index).to_bytes(4, "little")
    (path / "c" / "0").mkdir(parents=True)
    (path / "c" / "0" / "0").write_bytes(frame)
    return str(path)


def blosc_header(nbytes: int) -> bytes:
    """A Blosc chunk's 16-byte header declaring ``nbytes``, then junk."""
    fields = [2, 1, 1, 4, nbytes, 2**16, 64]  # versions, flags, typesize, sizes
    return bytes(fields[:4]) + np.array(fields[4:], "<u4").tobytes() + bytes(48)


@functools.cache
def deflated(wbits: int, content: int = 512 * MiB) -> bytes:
    """``content`` zero bytes as one zlib (15) or gzip (31) stream, which declares no size."""
    stream, zeros = zlib.compressobj(1, zlib.DEFLATED, wbits), bytes(MiB)
    return b"".join(stream.compress(zeros) for _ in range(content // MiB)) + stream.flush()


def metadata_only(path: Path, shape: tuple[int, int], chunks: tuple[int, int]) -> str:
    path.mkdir()
    (path / "zarr.json").write_text(json.dumps(v3_meta(shape, chunks)))
    return str(path)


# -- the frame header reader (pure) ------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "limit", "expected"),
    [
        (lambda: Zstd().encode(bytes(1000)), 10**9, 1000),  # numcodecs' frame
        (lambda: Zstd(checksum=True).encode(bytes(300)), 10**9, 300),  # with a checksum
        (lambda: Zstd().encode(bytes(7)) + Zstd().encode(bytes(9)), 10**9, 16),  # two frames
        (lambda: b"\x50\x2a\x4d\x18" + b"\3\0\0\0abc" + Zstd().encode(bytes(5)), 99, 5),  # skip
        (lambda: rle_frame(2 * GiB, 2 * GiB), 10**12, 2 * GiB),  # 64 KiB declaring 2 GiB
        (lambda: rle_frame(4 * MiB, 2 * GiB), 4 * MiB, 2 * GiB),  # stops past the limit
        (lambda: rle_frame(2 * GiB, None), 10**12, None),  # declares nothing
        (lambda: Zstd().encode(bytes(1000))[:-2], 10**9, None),  # cut short
        (lambda: b"", 10**9, None),  # empty: no frame
        (lambda: b"not zstd at all", 10**9, None),  # another codec's bytes
    ],
)
def test_declared_size(frames: Callable[[], bytes], limit: int, expected: int | None) -> None:
    assert declared_size(frames(), limit) == expected


def test_first_frame_size_reads_one_header() -> None:
    assert first_frame_size(rle_frame(4 * MiB, 2 * GiB)) == 2 * GiB
    assert first_frame_size(Zstd().encode(bytes(256))) == 256  # the two-byte field, +256
    assert first_frame_size(rle_frame(4 * MiB, None)) is None


# -- the planner counts, never lists ------------------------------------------------------


def prepare(a: str, b: str, out: str, **options: Any) -> Any:
    """pipeline.prepare's job, or the error it raised."""
    try:
        return pipeline.prepare(a, b, out, **options)
    except Exception as e:  # noqa: BLE001 - returned for the test to check
        return e


def measured_prepare(a: str, b: str, out: str, **options: Any) -> tuple[Any, float, int]:
    """(job or error, CPU seconds, traced peak bytes) of pipeline.prepare, warmed up first (its
    lazy imports). The time is the best of three in this process's CPU seconds, so other work
    on the machine does not count; untraced, tracemalloc slowing Python down several times."""
    prepare(a, b, out, **options)
    times = []
    for _ in range(3):
        started = time.process_time()
        got = prepare(a, b, out, **options)
        times.append(time.process_time() - started)
    tracemalloc.start()
    try:
        prepare(a, b, out, **options)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return got, min(times), peak


@pytest.mark.parametrize(
    ("a", "b", "backend", "outcome"),
    [
        # 10^12-wide K in 10^7 chunks: 10^5 panels per tile, planned (four ints, not a list)
        (((1, 10**12), (1, 10**7)), ((10**12, 1), (10**7, 1)), "cpu", 100_000),
        # the same K in 1000-wide chunks: 10^9 panels, refused
        (((1, 10**12), (1, 1000)), ((10**12, 1), (1000, 1)), "cpu", "1,000,000,000 panels"),
        # a 10^12 x 10^12 OUT: ~10^15 tasks, refused
        (((10**12, 1), (1000, 1)), ((1, 10**12), (1, 1000)), "cpu", "tasks"),
        # the same in 1x1 chunks on cuda (gemm blocks of one element: 10^12 per axis)
        (((10**12, 1), (1, 1)), ((1, 10**12), (1, 1)), "cuda", "tasks"),
    ],
)
def test_any_shape_plans_in_bounded_time_and_memory(
    tmp_path: Path, a: tuple, b: tuple, backend: str, outcome: int | str
) -> None:
    a_url = metadata_only(tmp_path / "a.zarr", *a)
    b_url = metadata_only(tmp_path / "b.zarr", *b)
    out = str(tmp_path / "out.zarr")
    got, seconds, peak = measured_prepare(a_url, b_url, out, backend=backend, memory_limit="4GiB")
    # A fraction of a CPU second; listing 10^9 panels or 10^15 tasks would take hours.
    assert seconds < 3 and peak < 100 * MiB, (seconds, peak)
    if isinstance(outcome, int):
        assert len(got.plan.k_panels) == outcome, got
        assert "100000 per tile" in got.describe()
    else:
        assert isinstance(got, PlanLimitError) and outcome in str(got), got
    assert not Path(out).exists()


def test_plans_within_the_task_limit_or_says_why() -> None:
    a = ArraySpec((4096, 512), (256, 512), "float32")
    b = ArraySpec((512, 4096), (512, 256), "float32")
    free = plan_matmul(a, b, workers=1, threads_per_worker=4, memory_limit_bytes=8 * GiB)
    capped = plan_matmul(
        a, b, workers=1, threads_per_worker=4, memory_limit_bytes=8 * GiB,
        limits=PlanLimits(max_tasks=2),
    )  # fmt: skip
    assert free.n_tasks > 2 >= capped.n_tasks  # the fastest plan within the limit
    with pytest.raises(PlanLimitError, match=r"needs at least [\d,]+ tasks .* limit of 3;"):
        plan_matmul(
            a, b, workers=1, threads_per_worker=1, memory_limit_bytes=300 * MiB,
            limits=PlanLimits(max_tasks=3),
        )  # fmt: skip
    with pytest.raises(PlanLimitError, match=r"tiles of 1x1 kept from OUT\) .* pass --overwrite"):
        plan_matmul(  # --resume keeps OUT's tiling: a hostile one is refused too
            a, b, workers=1, threads_per_worker=1, memory_limit_bytes=8 * GiB, tile_shape=(1, 1)
        )
    with pytest.raises(PlanLimitError, match=r"in 8 panels of 512 per tile, more than the limit"):
        plan_matmul(
            ArraySpec((8, 4096), (8, 512), "float32"), ArraySpec((4096, 8), (512, 8), "float32"),
            workers=1, threads_per_worker=1, memory_limit_bytes=8 * GiB,
            limits=PlanLimits(max_panels=7),
        )  # fmt: skip


def test_absurd_task_count_is_refused_before_out_exists(tmp_path: Path) -> None:
    a = metadata_only(tmp_path / "a.zarr", (10**12, 1), (1000, 1))
    b = metadata_only(tmp_path / "b.zarr", (1, 10**12), (1, 1000))
    out = tmp_path / "out.zarr"
    done = run_cli("multiply", a, b, str(out), "--memory-limit", "4GiB", "--no-progress")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: the plan needs at least "), done.stderr
    assert "more than the limit of 1,000,000; raise --memory-limit" in done.stderr
    assert not out.exists()


# -- the memory model counts stored chunks whole -----------------------------------------


@pytest.mark.parametrize(
    ("span", "chunk", "extent", "touched"),
    [
        (512, 256, 4096, 2),  # aligned runs: whole chunks
        (2000, 20000, 2000, 1),  # one chunk larger than the array: read whole
        (1000, 300, 5000, 4),  # misaligned runs: one more chunk at most where they can start
        (1000, 300, 1000, 4),  # the whole axis: its chunks, the last one whole
        (3, 2, None, 2),  # runs at 0, 3, 6: at most two chunks
        (0, 5, 0, 0),  # an empty axis
    ],
)
def test_chunks_touched(span: int, chunk: int, extent: int | None, touched: int) -> None:
    assert chunks_touched(span, chunk, extent) == touched


def test_memory_counts_a_chunk_larger_than_its_array() -> None:
    """A 2000² array stored in one 20000² chunk: zarr decodes all 1.6 GB of it."""
    host, _ = calculate_task_bytes(
        tile_shape=(2000, 500), panel_width=2000, dtypes=("float32",) * 4,
        chunks=((20000, 20000), (500, 500), (2000, 500)), split_k=1, first_band_rows=256,
        shape=(2000, 2000, 2000),
    )  # fmt: skip
    assert host >= 2 * 20000**2 * 4  # a stored and a decoded copy of the one chunk


def test_memory_counts_zarrs_bookkeeping_per_chunk() -> None:
    """1x1 chunks: zarr makes ~2.2 KB of bookkeeping per chunk of a read, all up front,
    whatever its concurrency."""
    a = ArraySpec((20000, 20000), (1, 1), "float32")
    plan = plan_matmul(a, a, workers=1, threads_per_worker=1, memory_limit_bytes=4 * GiB)
    (tm, tn), width = plan.tile_shape, plan.panel_width
    assert plan.task_bytes >= (tm * width + width * tn) * ZARR_BYTES_PER_CHUNK


def test_stored_chunk_size_refuses_the_plan(tmp_path: Path) -> None:
    a = metadata_only(tmp_path / "a.zarr", (2000, 2000), (20000, 20000))
    b = metadata_only(tmp_path / "b.zarr", (2000, 2000), (500, 500))
    with pytest.raises(MemoryBudgetError, match=r"needs 3\.\d GiB per worker .* 512\.0 MiB"):
        pipeline.prepare(a, b, tmp_path / "c.zarr", memory_limit="512MiB")
    out = tmp_path / "out.zarr"
    done = run_cli("multiply", a, b, str(out), "--memory-limit", "512MiB", "--no-progress")
    assert done.returncode == 2 and "no plan fits the memory limit" in done.stderr
    assert not out.exists()


# -- a chunk never decodes into more than its own size -----------------------------------

# The peak is this process's own high-water mark (VmHWM, reset by exec): ru_maxrss would
# carry the forking parent's (pytest's) size over into the child.
READ = """
import re, sys
from pipeline.store import inputs
a = inputs.open_input(sys.argv[1], None, "A")
try:
    inputs.read_block(a, (0, 1000), (0, 1000), "float32", "A", sys.argv[1])
except Exception as e:
    print(type(e).__name__, e)
with open("/proc/self/status") as f:
    print(int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024)
"""


TWO_GIB = "declares 2,147,483,648 bytes"


@pytest.mark.parametrize(
    ("frame", "layout", "codec", "words"),
    [
        (lambda: rle_frame(2 * GiB, 2 * GiB), "v3", None, TWO_GIB),  # and holds it
        (lambda: rle_frame(4 * MiB, 2 * GiB), "v3", None, TWO_GIB),  # holds less
        (lambda: rle_frame(2 * GiB, None), "v3", None, "zstd chunk declares no size and"),
        (lambda: rle_frame(2 * GiB, 2 * GiB), "v2", None, TWO_GIB),  # Zarr v2
        (lambda: rle_frame(2 * GiB, 2 * GiB), "v3-sharded", None, TWO_GIB),  # in a shard
        (lambda: rle_frame(1000, 1000), "v3", None, "declares 1,000 bytes"),  # too few
        (
            lambda: Zstd().encode(bytes(4_000_000)) + rle_frame(2 * GiB, 2 * GiB),
            "v3",
            None,
            "declares 2,151,483,648 bytes",
        ),  # a second frame  # fmt: skip
        (lambda: blosc_header(2 * GiB), "v2", {"id": "blosc"}, "blosc chunk " + TWO_GIB),
        (lambda: blosc_header(2 * GiB), "v3", BLOSC_V3, "blosc chunk " + TWO_GIB),
        (
            lambda: (2**31 - 1).to_bytes(4, "little") + bytes(9),
            "v2",
            {"id": "lz4"},
            "lz4 chunk declares 2,147,483,647 bytes",
        ),  # fmt: skip
        (lambda: deflated(31), "v2", {"id": "gzip", "level": 1}, "gzip chunk declares no size"),
        (lambda: deflated(31), "v3", GZIP_V3, "gzip chunk declares no size"),
        (lambda: deflated(15), "v2", {"id": "zlib", "level": 1}, "zlib chunk declares no size"),
    ],
)
def test_lying_chunk_is_refused_within_its_size(
    tmp_path: Path, frame: Callable[[], bytes], layout: str, codec: dict | None, words: str
) -> None:
    url = write_store(tmp_path / "a.zarr", frame(), layout, codec)
    done = subprocess.run(
        [sys.executable, "-c", READ, url], capture_output=True, text=True, cwd=REPO, check=True
    )
    message, peak = done.stdout.strip().rsplit("\n", 1)
    key = "0.0" if layout == "v2" else "c/0/0"
    assert message.startswith(f"ChunkSizeError A ({url}) has a chunk of the wrong size: "), message
    assert f"{url}/{key} (rows 0:1000, columns 0:1000)" in message
    assert words in message and "4,000,000" in message and "1000x1000 float32" in message
    assert "restore that chunk from a good copy or rewrite A" in message
    assert int(peak) < 400 * MiB, f"peak {int(peak) / MiB:.0f} MiB"  # zarr alone: 0.5-4 GiB


def test_gpu_decode_sends_a_lying_chunk_to_the_bounded_host_path(tmp_path: Path) -> None:
    url = write_store(tmp_path / "a.zarr", rle_frame(2 * GiB, 2 * GiB))
    array = inputs.open_input(url, None, "A")  # bounded, as every input is opened
    assert read_compressed(array, (0, 1000), (0, 1000), np.empty(2**20, np.uint8)) is None
    with pytest.raises(ChunkSizeError, match="declares 2,147,483,648 bytes"):
        inputs.read_block(array, (0, 10), (0, 10), "float32", "A", url)


@pytest.mark.parametrize(
    ("layout", "codec"),
    [
        ({"zarr_format": 3}, zarr.codecs.ZstdCodec()),
        ({"zarr_format": 3, "shards": (8, 8)}, zarr.codecs.ZstdCodec()),
        ({"zarr_format": 3}, zarr.codecs.BloscCodec()),
        ({"zarr_format": 3}, zarr.codecs.GzipCodec()),
        ({"zarr_format": 2}, Zstd()),
        ({"zarr_format": 2}, Blosc()),
        ({"zarr_format": 2}, LZ4()),
        ({"zarr_format": 2}, GZip()),
        ({"zarr_format": 2}, Zlib()),
    ],
)
def test_honest_chunks_read_as_before(tmp_path: Path, layout: dict[str, Any], codec: Any) -> None:
    data = np.random.default_rng(0).random((10, 12)).astype("float32")
    zarr.create_array(
        str(tmp_path / "a.zarr"), data=data, chunks=(4, 4), **layout, compressors=codec
    )
    plain = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    array = bounded(plain)
    assert array is not plain and array.metadata.to_dict() == plain.metadata.to_dict()
    np.testing.assert_array_equal(
        inputs.read_block(array, (1, 9), (2, 11), "float32"), data[1:9, 2:11]
    )


def test_task_limit_is_a_setting(tmp_path: Path) -> None:
    """A 10^6-square OUT under 4 GiB plans within the default limit, not within 100 tasks."""
    a = metadata_only(tmp_path / "a.zarr", (10**6, 1000), (1000, 1000))
    b = metadata_only(tmp_path / "b.zarr", (1000, 10**6), (1000, 1000))
    out = tmp_path / "out.zarr"
    argv = ("multiply", a, b, str(out), "--dry-run", "--memory-limit", "4GiB")
    assert run_cli(*argv).returncode == 0
    done = run_cli(*argv, env={"DASK_TILEGEMM__MAX_TASKS": "100"})
    assert done.returncode == 2, done.stderr
    assert (
        "more than the limit of 100;" in done.stderr and "DASK_TILEGEMM__MAX_TASKS" in done.stderr
    )

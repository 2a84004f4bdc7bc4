"""Every decode of an input capped, in this process (no cluster, no subprocess): a single
bz2 or lzma stream that would decode to many times its chunk is refused within the chunk's
bytes, next to the elements or behind a filter or another compressor; the most bytes a stored
chunk may take, codec by codec; a codec nothing bounds refused by name."""

from __future__ import annotations

import bz2
import copy
import json
import lzma
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

from pipeline.errors import ChunkSizeError, InputError, StoredObjectError
from pipeline.store import inputs
from pipeline.store.chunks import bounded as bounded_module
from pipeline.store.chunks.bounded import (
    BoundedCompressor,
    bounded,
    open_input_array,
    stored_bytes,
    stored_codec,
)
from pipeline.store.chunks.codec_bounds import (
    CHECKSUM_BYTES,
    COMPRESSOR_SLACK_BYTES,
    compressed_bytes,
    unbounded,
    v2_filtered_bytes,
)
from pipeline.store.chunks.input_store import InputStore

MiB = 2**20
CHUNK = 1000 * 1000 * 4  # one 1000x1000 float32 chunk
numcodecs_v3 = pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3")


BOMBS = {
    "bz2": bz2.compress(bytes(64 * MiB), 9),
    "lzma": lzma.compress(bytes(64 * MiB), preset=1),
}
"""64 MiB of zeros as one bz2 or lzma stream (not streams one after another): 16 times a
chunk's bytes, from 79 bytes of bz2 or 10 KB of lzma. Made once, on import (mutmut's
forkserver imports the tests once, then runs them for each mutant)."""


def bomb(codec: str) -> bytes:
    return BOMBS[codec]


def _v2(path: Path, frame: bytes, compressor: dict[str, Any] | None, filters: Any = None) -> str:
    path.mkdir()
    meta = {"zarr_format": 2, "shape": [1000, 1000], "chunks": [1000, 1000], "dtype": "<f4",
            "compressor": compressor, "fill_value": 0.0, "filters": filters,
            "order": "C"}  # fmt: skip
    (path / ".zarray").write_text(json.dumps(meta))
    (path / "0.0").write_bytes(frame)
    return str(path)


def _v3(path: Path, frame: bytes, codecs: list[dict[str, Any]]) -> str:
    path.mkdir()
    meta = {
        "zarr_format": 3, "node_type": "array", "shape": [1000, 1000], "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1000, 1000]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                      *codecs],
    }  # fmt: skip
    (path / "zarr.json").write_text(json.dumps(meta))
    (path / "c" / "0").mkdir(parents=True)
    (path / "c" / "0" / "0").write_bytes(frame)
    return str(path)


def _read(url: str) -> tuple[Exception | None, int]:
    """What reading the whole input said, and the most memory the read took."""
    tracemalloc.start()
    try:
        array = inputs.open_input(url, None, "A")
        inputs.read_block(array, (0, 1000), (0, 1000), "float32", "A", url)
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        return e, tracemalloc.get_traced_memory()[1]
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return None, peak


DELTA = {"id": "delta", "dtype": "<f4"}
BZ2_V3 = {"name": "numcodecs.bz2", "configuration": {"level": 1}}
LZMA_V3 = {"name": "numcodecs.lzma", "configuration": {}}
ZSTD_V3 = {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
GZIP_V3 = {"name": "gzip", "configuration": {"level": 1}}


@numcodecs_v3
@pytest.mark.parametrize(
    ("store", "words"),
    [
        (lambda p: _v2(p, bomb("bz2"), {"id": "bz2"}),
         "a stored bz2 chunk declares no size and decodes past the 4,000,000 bytes its "
         "1000x1000 float32 elements hold; refused there"),
        (lambda p: _v2(p, bomb("lzma"), {"id": "lzma"}),
         "a stored lzma chunk declares no size and decodes past the 4,000,000 bytes its "
         "1000x1000 float32 elements hold"),
        (lambda p: _v2(p, bomb("bz2"), {"id": "bz2"}, [{"id": "delta", "dtype": "<f4"}]),
         "a stored bz2 chunk decodes past the 4,000,000 bytes 1000x1000 float32 elements "
         "through delta can need; refused there"),
        (lambda p: _v2(p, bomb("bz2"), {"id": "bz2"}, [DELTA, {"id": "crc32"}]),
         "a stored bz2 chunk decodes past the 4,000,064 bytes 1000x1000 float32 elements "
         "through delta, crc32 can need"),
        (lambda p: _v3(p, bomb("bz2"), [BZ2_V3]),
         "a stored bz2 chunk declares no size and decodes past the 4,000,000 bytes its "
         "1000x1000 float32 elements hold"),
        (lambda p: _v3(p, bomb("lzma"), [LZMA_V3]),
         "a stored lzma chunk declares no size and decodes past the 4,000,000 bytes"),
        (lambda p: _v3(p, bomb("bz2"), [ZSTD_V3, BZ2_V3]),
         "a stored bz2 chunk decodes past the 4,105,536 bytes 1000x1000 float32 elements "
         "through zstd can need"),
        (lambda p: _v3(p, bomb("lzma"), [GZIP_V3, {"name": "crc32c"}, LZMA_V3]),
         "a stored lzma chunk decodes past the 4,105,600 bytes 1000x1000 float32 elements "
         "through gzip, crc32c can need"),
    ],
)  # fmt: skip
def test_a_single_stream_bomb_is_refused_within_its_chunk(
    tmp_path: Path, store: Any, words: str
) -> None:
    url = store(tmp_path / "a.zarr")
    refused, peak = _read(url)
    assert isinstance(refused, ChunkSizeError), refused
    assert words in str(refused), str(refused)
    assert peak < 48 * MiB, f"peak {peak / MiB:.0f} MiB"  # the bomb holds 64 MiB


def test_a_stored_object_larger_than_any_chunk_is_refused_unread(tmp_path: Path) -> None:
    url = _v3(tmp_path / "a.zarr", b"", [ZSTD_V3])
    with open(Path(url) / "c" / "0" / "0", "wb") as f:
        f.truncate(compressed_bytes(CHUNK) + 1)  # sparse: one byte past the bound
    refused, peak = _read(url)
    assert isinstance(refused, StoredObjectError), refused
    assert "where at most 3.9 MiB" in str(refused), str(refused)
    assert peak < 48 * MiB
    with open(Path(url) / "c" / "0" / "0", "wb") as f:
        f.write(numcodecs.Zstd().encode(bytes(CHUNK)))
    assert _read(url)[0] is None


def _array(tmp_path: Path, **options: Any) -> zarr.Array[Any]:
    options = {"shape": (10, 20), "chunks": (5, 4), "dtype": "f4", **options}
    array = zarr.create_array(str(tmp_path / "a.zarr"), **options)
    array[:] = np.arange(200, dtype="f4").reshape(10, 20)
    return array


ELEMENTS = 5 * 4 * 4  # one 5x4 float32 chunk


@numcodecs_v3
@pytest.mark.parametrize(
    ("options", "most", "codec"),
    [
        ({"compressors": None}, ELEMENTS, None),
        ({"compressors": [ZstdCodec()]}, ELEMENTS + COMPRESSOR_SLACK_BYTES, "zstd"),
        ({"compressors": [BloscCodec(cname="lz4")]}, ELEMENTS + COMPRESSOR_SLACK_BYTES, "blosc"),
        ({"compressors": [GzipCodec(), ZstdCodec()]},
         compressed_bytes(ELEMENTS + COMPRESSOR_SLACK_BYTES), None),  # 1 % of the inner bound
        ({"compressors": [Crc32cCodec()]}, ELEMENTS + CHECKSUM_BYTES, None),
        ({"compressors": [ZstdCodec(), Crc32cCodec()]},
         ELEMENTS + COMPRESSOR_SLACK_BYTES + CHECKSUM_BYTES, "zstd"),
        ({"filters": [TransposeCodec(order=(1, 0))], "compressors": [ZstdCodec()]},
         ELEMENTS + COMPRESSOR_SLACK_BYTES, "zstd"),
        ({"compressors": None, "zarr_format": 2}, ELEMENTS, None),
        ({"compressors": numcodecs.Zstd(), "zarr_format": 2}, ELEMENTS + COMPRESSOR_SLACK_BYTES,
         "zstd"),
        ({"compressors": numcodecs.LZ4(), "zarr_format": 2}, ELEMENTS + COMPRESSOR_SLACK_BYTES,
         "lz4"),
        ({"compressors": numcodecs.Zstd(), "filters": [numcodecs.AsType("<f8", "<f4")],
          "zarr_format": 2}, 2 * ELEMENTS + 1 + COMPRESSOR_SLACK_BYTES, None),
        ({"compressors": None, "filters": [numcodecs.AsType("<f8", "<f4")], "zarr_format": 2},
         2 * ELEMENTS, None),
    ],
)  # fmt: skip
def test_the_most_a_stored_chunk_takes(
    tmp_path: Path, options: dict[str, Any], most: int, codec: str | None
) -> None:
    array = _array(tmp_path, **options)
    assert stored_bytes(array) == most
    again = bounded(array)
    assert stored_bytes(again) == most  # bounded twice: the same bound
    assert stored_bytes(bounded(again)) == most
    assert stored_codec(again) == codec
    assert stored_codec(array) is None  # not opened through ``bounded``
    assert np.array_equal(again[:], array[:])
    opened = open_input_array(str(tmp_path / "a.zarr"), None)
    assert opened.store.chunk_bytes == most
    assert np.array_equal(opened[:], array[:])


def test_a_shard_takes_its_inner_chunks_and_its_index(tmp_path: Path) -> None:
    array = _array(tmp_path, shards=(10, 8), compressors=[ZstdCodec()])
    per = (10 // 5) * (8 // 4)
    index = per * 16 + CHECKSUM_BYTES  # two uint64 per inner chunk, and its crc32c
    assert stored_bytes(array) == per * (ELEMENTS + COMPRESSOR_SLACK_BYTES) + index
    assert stored_codec(bounded(array)) is None
    assert np.array_equal(bounded(array)[:], array[:])


def test_a_non_numeric_array_is_left_as_it_is(tmp_path: Path) -> None:
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(2,), dtype="U4", zarr_format=2)
    assert bounded(array) is array
    opened = open_input_array(str(tmp_path / "a.zarr"), None)
    assert opened.store.chunk_bytes == InputStore(str(tmp_path)).chunk_bytes  # its default


def test_a_remote_input_is_opened_as_zarr_opens_it(tmp_path: Path) -> None:
    url = f"memory://bounded-{tmp_path.name}/a.zarr"
    zarr.create_array(url, shape=(4, 4), dtype="f4", fill_value=1.5)
    opened = open_input_array(url, None)
    assert opened[0, 0] == 1.5 and opened.read_only  # inputs are never written


@numcodecs_v3
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"compressors": numcodecs.Base64(), "zarr_format": 2}, "its compressor 'base64'"),
        ({"compressors": None, "filters": [numcodecs.Base64()], "zarr_format": 2},
         "its filter 'base64'"),
        ({"compressors": numcodecs.LZMA(format=lzma.FORMAT_RAW,
                                        filters=[{"id": lzma.FILTER_LZMA2}]),
          "zarr_format": 2}, "its compressor 'lzma'"),
    ],
)  # fmt: skip
def test_a_codec_nothing_bounds_is_refused_by_name(
    tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    array = zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 4), dtype="f4", **options)
    with pytest.raises(InputError, match=f"^{named} decodes into a size that cannot be bounded"):
        bounded(array)


@numcodecs_v3
def test_v3_codecs_nothing_bounds_are_refused_by_name(tmp_path: Path) -> None:
    from zarr.codecs.numcodecs import LZMA, BitRound, Shuffle

    raw = LZMA(format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
    for codecs, named in (
        ({"compressors": [raw]}, "its codec 'numcodecs.lzma'"),
        ({"filters": [BitRound(keepbits=3)], "compressors": None}, None),  # bounded
        ({"compressors": [Shuffle(elementsize=4)]}, None),  # reorders, keeps the size
    ):
        array = zarr.create_array(
            str(tmp_path / f"{len(str(codecs))}.zarr"), shape=(4, 4), dtype="f4", **codecs
        )
        if named is None:
            assert stored_bytes(array) == 64
            continue
        with pytest.raises(InputError, match=f"^{named} decodes into a size"):
            bounded(array)
    xz = zarr.create_array(str(tmp_path / "xz.zarr"), shape=(4, 4), dtype="f4",
                           compressors=[LZMA(format=lzma.FORMAT_XZ)])  # fmt: skip
    assert stored_bytes(xz) == 64 + COMPRESSOR_SLACK_BYTES


@numcodecs_v3
def test_a_v3_codec_nothing_bounds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zarr.codecs.numcodecs import Shuffle

    transposed = _array(tmp_path, filters=[TransposeCodec(order=(1, 0))])
    shuffled = zarr.create_array(str(tmp_path / "s.zarr"), shape=(4, 4), dtype="f4",
                                 compressors=[Shuffle(elementsize=4)])  # fmt: skip
    monkeypatch.setattr(bounded_module, "V3_ARRAY_TO_ARRAY", frozenset())
    monkeypatch.setattr(bounded_module, "V3_SAME_SIZE", frozenset())
    with pytest.raises(InputError, match="^its codec 'transpose' decodes"):
        bounded(transposed)
    with pytest.raises(InputError, match="^its codec 'numcodecs.shuffle' decodes"):
        bounded(shuffled)


def test_a_wrapped_v2_compressor_is_the_inner_one_but_for_its_decodes() -> None:
    inner = numcodecs.Zstd(level=3)
    codec = bounded_module.V2["zstd"](inner, 100, True, "10x10 uint8 elements")
    assert codec.level == 3 and codec.codec_id == "zstd"
    assert codec.get_config() == inner.get_config() and codec.get_config() is not None

    class Inner:
        _secret = "the inner codec's own"

    with pytest.raises(AttributeError, match="^_secret$"):
        bounded_module.V2["zstd"](Inner(), 1, True, "")._secret  # noqa: B018 - never the inner's
    copied = copy.copy(codec)  # made without __init__: no lookup may reach a missing _inner
    assert copied.level == 3 and copied.get_config() == inner.get_config()
    data = bytes(range(100))
    stored = codec.encode(data)
    assert stored == inner.encode(data)
    assert codec.decode(stored).tobytes() == data
    out = np.zeros(100, np.uint8)
    codec.decode(stored, out)
    assert out.tobytes() == data
    with pytest.raises(ChunkSizeError, match="declares 100 bytes but its 10x10 uint8 elements"):
        bounded_module.V2["zstd"](inner, 99, True, "10x10 uint8 elements").decode(stored)
    capped = bounded_module.V2["zstd"](inner, 100, False, "delta")
    assert capped.decode(stored).tobytes() == data
    with pytest.raises(ChunkSizeError, match="declares 100 bytes where it decodes into delta"):
        bounded_module.V2["zstd"](inner, 99, False, "delta").decode(stored)
    assert isinstance(codec, BoundedCompressor)


# -- codec_bounds: numbers and names --------------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "most"),
    [(0, 65536), (99, 99 + 65536), (100, 101 + 65536), (4_000_000, 4_040_000 + 65536)],
)
def test_compressed_bytes(nbytes: int, most: int) -> None:
    assert compressed_bytes(nbytes) == most


@pytest.mark.parametrize(
    ("filters", "nbytes", "most"),
    [
        ((), 1000, 1000),
        ((numcodecs.Delta(dtype="<f4"),), 1000, 1000),
        ((numcodecs.Delta(dtype="<f4", astype="<i8"),), 1000, 2000),
        ((numcodecs.Delta(dtype="<f8", astype="<f4"),), 1001, 504),  # 126 elements, rounded up
        ((numcodecs.AsType(encode_dtype="<f8", decode_dtype="<f4"),), 1000, 2000),
        ((numcodecs.AsType(encode_dtype="<f2", decode_dtype="<f4"),), 1000, 500),
        ((numcodecs.FixedScaleOffset(0, 10, dtype="<f8", astype="<u1"),), 800, 100),
        ((numcodecs.Quantize(2, dtype="<f4", astype="<f8"),), 400, 800),
        ((numcodecs.PackBits(),), 800, 102),  # eight booleans a byte, and one for the count
        ((numcodecs.PackBits(),), 7, 2),
        ((numcodecs.CRC32(),), 1000, 1000 + CHECKSUM_BYTES),
        ((numcodecs.Adler32(),), 1000, 1000 + CHECKSUM_BYTES),
        ((numcodecs.BitRound(3),), 1000, 1000),
        ((numcodecs.Shuffle(4),), 1000, 1000),
        ((numcodecs.AsType("<f8", "<f4"), numcodecs.CRC32()), 1000, 2000 + CHECKSUM_BYTES),
    ],
)
def test_v2_filtered_bytes(filters: tuple[Any, ...], nbytes: int, most: int) -> None:
    assert v2_filtered_bytes(filters, nbytes) == most


def test_a_filter_nothing_bounds_is_refused_by_name() -> None:
    class Mystery:
        pass

    with pytest.raises(InputError, match="^its filter 'Mystery' decodes"):
        v2_filtered_bytes((Mystery(),), 10)
    with pytest.raises(InputError, match="^its filter 'base64' decodes"):
        v2_filtered_bytes((numcodecs.Base64(),), 10)


def test_the_refusal_says_what_is_bounded_and_how_to_rewrite() -> None:
    assert str(unbounded("base64", "filter")) == (
        "its filter 'base64' decodes into a size that cannot be bounded before decoding "
        "(bounded here: zstd, blosc, lz4, gzip, zlib, bz2 and lzma compressors, dtype, delta, "
        "scale-offset, quantize, bitround, shuffle and checksum filters, sharding), so a "
        "hostile chunk could take any amount of memory; rewrite the array with zstd, e.g. "
        "zarr.create_array(NEW, data=zarr.open_array(OLD)[...], compressors=zarr.codecs."
        "ZstdCodec())"
    )


def test_a_bounded_v3_compressor_is_named_for_what_it_wraps(tmp_path: Path) -> None:
    array = bounded(_array(tmp_path, compressors=[ZstdCodec(level=3)]))
    compressor = array.metadata.codecs[-1]
    assert type(compressor).__name__ == "BoundedZstdCodec"
    assert isinstance(compressor, ZstdCodec) and compressor.level == 3
    assert type(bounded(array).metadata.codecs[-1]) is type(compressor)  # one class per codec


@numcodecs_v3
def test_a_bomb_inside_a_shard_is_refused_within_its_chunk(tmp_path: Path) -> None:
    from zarr.codecs.numcodecs import BZ2

    url = str(tmp_path / "a.zarr")
    zarr.create_array(url, shape=(1000, 1000), chunks=(1000, 1000), shards=(1000, 1000),
                      dtype="f4", compressors=[BZ2(level=1)], fill_value=0.0)  # fmt: skip
    index = np.array([0, len(bomb("bz2"))], "<u8").tobytes()
    index += google_crc32c.value(index).to_bytes(4, "little")
    (Path(url) / "c" / "0").mkdir(parents=True)
    (Path(url) / "c" / "0" / "0").write_bytes(bomb("bz2") + index)
    refused, peak = _read(url)
    assert isinstance(refused, ChunkSizeError), refused
    assert "bz2 chunk declares no size and decodes past the 4,000,000 bytes" in str(refused)
    assert peak < 48 * MiB, f"peak {peak / MiB:.0f} MiB"


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec disables partial reads")
def test_a_compressor_around_whole_shards_is_capped_not_exact(tmp_path: Path) -> None:
    from zarr.codecs import BytesCodec, ShardingCodec

    url = str(tmp_path / "a.zarr")
    data = np.arange(1000 * 1000, dtype="f4").reshape(1000, 1000)
    shard = ShardingCodec(chunk_shape=(500, 500), codecs=[BytesCodec(), ZstdCodec()])
    array = zarr.create_array(url, shape=(1000, 1000), chunks=(1000, 1000), dtype="f4",
                              serializer=shard, compressors=[GzipCodec()])  # fmt: skip
    array[:] = data
    assert _read(url)[0] is None  # an honest shard is smaller than the most it may take
    assert np.array_equal(bounded(array)[:], data)
    zeros = zlib.compressobj(1, zlib.DEFLATED, 31)
    gzip_bomb = b"".join(zeros.compress(bytes(MiB)) for _ in range(64)) + zeros.flush()
    (Path(url) / "c" / "0" / "0").write_bytes(gzip_bomb)
    refused, peak = _read(url)
    assert isinstance(refused, ChunkSizeError), refused
    most = 4 * compressed_bytes(500 * 500 * 4) + 4 * 16 + CHECKSUM_BYTES  # a shard, its index
    assert f"gzip chunk decodes past the {most:,} bytes 1000x1000 float32 elements through " \
        "sharding can need" in str(refused), str(refused)  # fmt: skip
    assert peak < 48 * MiB, f"peak {peak / MiB:.0f} MiB"


def test_a_v3_codec_without_a_name_is_refused_by_its_class() -> None:
    class Mystery:
        pass

    with pytest.raises(InputError, match="^its codec 'Mystery' decodes"):
        bounded_module._bound_chain((Mystery(),), None)  # type: ignore[arg-type]


def test_a_remote_input_is_opened_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"memory://bounded-options-{tmp_path.name}/a.zarr"
    zarr.create_array(url, shape=(2, 2), dtype="f4")
    seen: list[object] = []
    open_array = zarr.open_array

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("storage_options"))
        return open_array(*args, **{**kwargs, "storage_options": None})

    monkeypatch.setattr(zarr, "open_array", spy)
    options = {"token": "the user's"}
    open_input_array(url, options)
    assert seen == [options]

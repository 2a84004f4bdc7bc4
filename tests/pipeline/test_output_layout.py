"""OUT's layout: --chunks and --shards, the defaults that follow the inputs (sharded ones too),
tiles of whole shards (one writer each), the memory model's shard buffers, the fingerprint."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import multiply, prepare
from pipeline.errors import UsageError
from pipeline.job import fingerprint
from pipeline.plan.layout import output_spec, parse_pair
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec, OutputSpec
from tests.helpers import assert_product, random_matrix, run_cli

GiB = 2**30
A = ArraySpec((100, 60), (10, 20), "float32")
B = ArraySpec((60, 80), (20, 16), "float32")
A_SHARDED = ArraySpec((100, 60), (10, 20), "float32", (50, 60))
B_SHARDED = ArraySpec((60, 80), (20, 16), "float32", (60, 32))


@pytest.mark.parametrize(
    ("a", "b", "request_", "chunks", "shards"),
    [
        (A, B, OutputSpec(), (10, 16), None),  # unsharded inputs: their chunks, no shards
        (A_SHARDED, B_SHARDED, OutputSpec(), (10, 16), (50, 32)),  # follow the input shards
        (A_SHARDED, B, OutputSpec(), (10, 16), (50, 16)),  # only A sharded: B's chunk as is
        (A_SHARDED, B_SHARDED, OutputSpec(chunks=(5, 8)), (5, 8), None),  # --chunks alone
        (A, B, OutputSpec(shards=(40, 64)), (10, 16), (40, 64)),  # --shards alone
        (A, B, OutputSpec(chunks=(4, 4), shards=(8, 12)), (4, 4), (8, 12)),  # both
        (A, B, OutputSpec(chunks=(500, 500)), (500, 500), None),  # bigger than OUT: allowed
        (A_SHARDED, B_SHARDED, OutputSpec(zarr_format=2), (10, 16), None),  # v2 group: none
    ],
)
def test_layout(
    a: ArraySpec,
    b: ArraySpec,
    request_: OutputSpec,
    chunks: tuple[int, int],
    shards: tuple[int, int] | None,
) -> None:
    out, _ = output_spec(a, b, request_)
    assert (out.shape, out.chunks, out.shards) == ((100, 80), chunks, shards)


SMALL_A = ArraySpec((4096, 4096), (64, 64), "float32")
SMALL_B = ArraySpec((4096, 4096), (64, 48), "float32")


@pytest.mark.parametrize(
    ("a", "b", "request_", "chunks", "shards"),
    [
        (SMALL_A, SMALL_B, OutputSpec(), (512, 528), None),  # 64x86 chunks: grown past 512
        (SMALL_A, SMALL_B, OutputSpec(chunks=(64, 48)), (64, 48), None),  # --chunks: exactly
        (SMALL_A, SMALL_B, OutputSpec(shards=(128, 96)), (64, 48), (128, 96)),  # inside shards
        # 32 x 32 = 1,024 chunks: not over the limit, so the inputs' chunks as they are
        (ArraySpec((4096, 64), (128, 64), "f4"), ArraySpec((64, 4096), (64, 128), "f4"),
         OutputSpec(), (128, 128), None),
        # tall and skinny: rows grow, the 3 columns stay one chunk
        (ArraySpec((100_000, 5), (10, 5), "f4"), ArraySpec((5, 3), (5, 3), "f4"),
         OutputSpec(), (520, 3), None),
    ],
)  # fmt: skip
def test_small_default_chunks_grow(
    a: ArraySpec,
    b: ArraySpec,
    request_: OutputSpec,
    chunks: tuple[int, int],
    shards: tuple[int, int] | None,
) -> None:
    out, _ = output_spec(a, b, request_)
    assert (out.chunks, out.shards) == (chunks, shards)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (OutputSpec(chunks=(0, 4)), r"--chunks 0x4 must be at least 1x1"),
        (OutputSpec(shards=(8, -1)), r"--shards 8x-1 must be at least 1x1"),
        (OutputSpec(shards=(25, 32)), r"--shards 25x32 is not a whole number of chunks 10x16 "
         r"\(A's row chunk, B's column chunk: pass --chunks to choose\).* --chunks 5x16"),
        (OutputSpec(chunks=(4, 4), shards=(6, 8)), r"--shards 6x8 is not a whole number of "
         r"chunks 4x4;.* e\.g\. --chunks 2x4, or shards that are multiples of 4x4"),
        (OutputSpec(shards=(20, 32), zarr_format=2), r"--shards 20x32 needs Zarr v3, but OUT "
         r"goes into a Zarr v2 group"),
    ],
)  # fmt: skip
def test_layout_refused(request_: OutputSpec, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        output_spec(A, B, request_)


@pytest.mark.parametrize(
    ("value", "pair"),
    [(None, None), ("64x32", (64, 32)), ("64X32", (64, 32)), ((8, 4), (8, 4)), ([8, 4], (8, 4)),
     ((np.int64(8), 4), (8, 4))],
)  # fmt: skip
def test_parse_pair(value: object, pair: tuple[int, int] | None) -> None:
    assert parse_pair(value, "--chunks") == pair  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["64", "64x", "axb", "1x2x3", (1.5, 2), (True, 2), 64])
def test_parse_pair_refused(value: object) -> None:
    with pytest.raises(UsageError, match=r"--shards .* is not RxC with two positive integers"):
        parse_pair(value, "--shards")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 3000),
    n=st.integers(1, 3000),
    chunk=st.tuples(st.integers(1, 300), st.integers(1, 300)),
    per_shard=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    workers=st.integers(1, 4),
    backend=st.sampled_from(["cpu", "cuda"]),
)
def test_tiles_and_bands_hold_whole_shards(
    m: int,
    n: int,
    chunk: tuple[int, int],
    per_shard: tuple[int, int],
    workers: int,
    backend: str,
) -> None:
    """Every tile (and gemm block, hence every written band) starts on a shard boundary and
    ends on one or at the array's edge: a shard never has two writers."""
    from pipeline.plan.matmul import row_bands

    shards = (chunk[0] * per_shard[0], chunk[1] * per_shard[1])
    a, b = (
        ArraySpec((m, 64), (chunk[0], 64), "float32"),
        ArraySpec((64, n), (64, chunk[1]), "float32"),
    )
    plan = plan_matmul(
        a, b, workers=workers, threads_per_worker=2, memory_limit_bytes=64 * GiB,
        backend=backend, output=OutputSpec(shards=shards),
    )  # fmt: skip
    assert plan.out.shards == shards
    for tile in plan.tiles():
        for (lo, hi), size, edge in ((tile.rows, shards[0], m), (tile.cols, shards[1], n)):
            assert lo % size == 0 and (hi % size == 0 or hi == edge)
        for r0, r1 in row_bands(tile.shape[0], plan.block_shape[0]):
            assert r0 % shards[0] == 0 and (
                (tile.rows[0] + r1) % shards[0] == 0 or r1 == tile.shape[0]
            )


def test_memory_counts_shard_sized_write_buffers() -> None:
    """Zarr encodes a shard whole: writing a band needs shard-sized buffers, not chunk-sized."""
    from pipeline.plan.memory import ZARR_BYTES_PER_CHUNK, calculate_task_bytes

    def task(out_unit: tuple[int, int]) -> int:
        host, _ = calculate_task_bytes(
            tile_shape=(2048, 2048), panel_width=1, dtypes=("float32",) * 4,
            chunks=((64, 1), (1, 64), out_unit), split_k=1, first_band_rows=1024,
        )  # fmt: skip
        return host

    # Writing 1024 rows: ten 1024² shards in flight (two copies each) vs ten 64² chunks, and
    # zarr's bookkeeping for 2 shards vs 16x32 chunks.
    bookkeeping = (2 - 16 * 32) * ZARR_BYTES_PER_CHUNK
    assert task((1024, 1024)) - task((64, 64)) == 2 * (1024 * 2048 - 10 * 64 * 64) * 4 + bookkeeping
    a = ArraySpec((4096, 512), (64, 512), "float32")
    b = ArraySpec((512, 4096), (512, 64), "float32")
    kwargs = {"workers": 1, "threads_per_worker": 1, "memory_limit_bytes": 64 * GiB,
              "tile_shape": (2048, 2048)}  # fmt: skip
    plain = plan_matmul(a, b, **kwargs)  # type: ignore[arg-type]
    sharded = plan_matmul(a, b, output=OutputSpec(shards=(1024, 1024)), **kwargs)  # type: ignore[arg-type]
    assert sharded.task_bytes > plain.task_bytes


def test_default_plan_and_fingerprint_did_not_change() -> None:
    """Without output options, the plan and its fingerprint are those of the formula without
    them (--resume of an OUT fingerprinted that way still matches)."""
    plan = plan_matmul(A, B, workers=2, threads_per_worker=2, memory_limit_bytes=8 * GiB)
    assert plan == plan_matmul(
        A, B, workers=2, threads_per_worker=2, memory_limit_bytes=8 * GiB, output=OutputSpec()
    )
    assert (plan.out.chunks, plan.out.shards, plan.out.dtype) == ((10, 16), None, "float32")
    old = {  # the formula without output options: asdict of the specs, no shards field
        "inputs": "digest",
        "a": _without_shards(plan.a),
        "b": _without_shards(plan.b),
        "out": _without_shards(plan.out),
        "tile": plan.tile_shape,
        "panels": list(plan.k_panels),
    }
    digest = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert fingerprint(plan, "digest") == digest


def _without_shards(spec: ArraySpec) -> dict[str, object]:
    return {k: v for k, v in asdict(spec).items() if k != "shards"}


@pytest.mark.parametrize(
    "output",
    [OutputSpec(chunks=(5, 16)), OutputSpec(shards=(20, 32)), OutputSpec(dtype="float64")],
)
def test_fingerprint_covers_the_layout(output: OutputSpec) -> None:
    options = {"workers": 1, "threads_per_worker": 1, "memory_limit_bytes": 8 * GiB,
               "tile_shape": (100, 80)}  # fmt: skip
    plain = plan_matmul(A, B, **options)  # type: ignore[arg-type]
    other = plan_matmul(A, B, output=output, **options)  # type: ignore[arg-type]
    assert plain.tile_shape == other.tile_shape and plain.k_panels == other.k_panels
    assert fingerprint(plain) != fingerprint(other)


def write_sharded(
    path: Path, data: np.ndarray, chunks: tuple[int, int], shards: tuple[int, int]
) -> str:
    zarr.create_array(str(path), data=data, chunks=chunks, shards=shards)
    return str(path)


def test_sharded_inputs_give_a_sharded_out(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(2)
    a, b = random_matrix(rng, (300, 90), "float32"), random_matrix(rng, (90, 260), "float32")
    a_url = write_sharded(tmp_path / "a.zarr", a, (20, 30), (100, 90))
    b_url = write_sharded(tmp_path / "b.zarr", b, (30, 20), (90, 60))
    out = str(tmp_path / "c.zarr")
    result = multiply(a_url, b_url, out, client=client, memory_limit="2GiB")
    c = zarr.open_array(out)
    assert (c.chunks, c.shards) == ((20, 20), (100, 60))
    assert_product(c[:], a, b)
    assert result.plan.out.shards == (100, 60)


@pytest.mark.parametrize(
    ("chunks", "shards"),
    [
        ((16, 16), (48, 32)),  # several shards per tile, ragged edge shards
        ((8, 8), None),  # --chunks alone: unsharded
        (None, (64, 64)),  # --shards alone around the default chunks
    ],
)
def test_chunks_and_shards_options(
    tmp_path: Path,
    client: Client,
    chunks: tuple[int, int] | None,
    shards: tuple[int, int] | None,
) -> None:
    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, (200, 70), "float64"), random_matrix(rng, (70, 150), "float64")
    zarr.create_array(str(tmp_path / "a.zarr"), data=a, chunks=(32, 35))
    zarr.create_array(str(tmp_path / "b.zarr"), data=b, chunks=(35, 32))
    out = str(tmp_path / "c.zarr")
    multiply(
        str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), out, client=client,
        chunks=chunks, shards=shards,
    )  # fmt: skip
    c = zarr.open_array(out)
    assert c.chunks == (chunks or (32, 32)) and c.shards == shards
    assert_product(c[:], a, b)


def test_many_writers_of_small_shards(tmp_path: Path, client: Client) -> None:
    """Many tiles on two workers, each writing whole shards at once: no shard is torn (the
    output is NaN-filled at creation, so an element lost to a racing writer fails)."""
    rng = np.random.default_rng(4)
    a, b = random_matrix(rng, (600, 40), "float32"), random_matrix(rng, (40, 600), "float32")
    zarr.create_array(str(tmp_path / "a.zarr"), data=a, chunks=(25, 40))
    zarr.create_array(str(tmp_path / "b.zarr"), data=b, chunks=(40, 25))
    out = str(tmp_path / "c.zarr")
    result = multiply(
        str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), out, client=client,
        chunks=(25, 25), shards=(50, 75), memory_limit="2GiB",
    )  # fmt: skip
    assert result.plan.n_tiles >= 2
    assert_product(zarr.open_array(out)[:], a, b)


def test_resume_keeps_the_layout_and_refuses_another(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, (64, 30), "float32"), random_matrix(rng, (30, 48), "float32")
    zarr.create_array(str(tmp_path / "a.zarr"), data=a, chunks=(16, 30))
    zarr.create_array(str(tmp_path / "b.zarr"), data=b, chunks=(30, 16))
    paths = [str(tmp_path / n) for n in ("a.zarr", "b.zarr", "c.zarr")]
    multiply(*paths, client=client, chunks="8x8", shards="32x16", dtype="float64")
    with pytest.raises(UsageError, match=r"OUT \(.*c\.zarr\) has chunks 8x8 and chunks=\(16, 16\)"):
        prepare(*paths, resume=True, chunks="16x16")
    with pytest.raises(UsageError, match=r"has shards 32x16 and shards=\(64, 16\) was given"):
        prepare(*paths, resume=True, shards="64x16")
    with pytest.raises(UsageError, match=r"has dtype float64 and dtype='float32'"):
        prepare(*paths, resume=True, dtype="float32")
    resumed = multiply(*paths, client=client, resume=True)  # no flags: OUT's own layout
    assert resumed.tiles_skipped == resumed.plan.n_tiles and resumed.tiles_computed == 0
    assert (resumed.plan.out.chunks, resumed.plan.out.shards) == ((8, 8), (32, 16))
    assert_product(zarr.open_array(paths[2])[:], a, b, "float64")


def test_dry_run_names_the_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    zarr.create_array(
        str(tmp_path / "a.zarr"), data=random_matrix(rng, (40, 20), "float32"), chunks=(10, 10)
    )
    zarr.create_array(
        str(tmp_path / "b.zarr"), data=random_matrix(rng, (20, 30), "float32"), chunks=(10, 10)
    )
    done = run_cli(
        "multiply", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), str(tmp_path / "c.zarr"),
        "--chunks", "5x5", "--shards", "20x15", "--dtype", "float64", "--dry-run",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "output chunks      5x5 in shards of 20x15" in done.stdout
    assert "-> 40x30 float64 (accumulate in float64)" in done.stdout
    assert not (tmp_path / "c.zarr").exists()

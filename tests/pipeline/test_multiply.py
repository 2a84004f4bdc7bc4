"""End to end through the Python API on a LocalCluster, against float64 numpy."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.store.record import of_array
from tests.helpers import assert_product, cpu_tile_task, random_matrix, write_array


def tree_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return digest.hexdigest()


def run_case(
    tmp_path: Path,
    client: Client,
    m: int,
    k: int,
    n: int,
    a_chunks: tuple[int, int],
    b_chunks: tuple[int, int],
    a_dtype: str = "float32",
    b_dtype: str = "float32",
    zarr_format: int = 3,
    **kwargs: object,
) -> None:
    rng = np.random.default_rng(m * 1_000_003 + k * 1009 + n)
    a, b = random_matrix(rng, (m, k), a_dtype), random_matrix(rng, (k, n), b_dtype)
    a_url = write_array(tmp_path / "a.zarr", a, a_chunks, zarr_format)
    b_url = write_array(tmp_path / "b.zarr", b, b_chunks, zarr_format)
    before = _inputs_digest(tmp_path)
    out = str(tmp_path / "out.zarr")
    result = multiply(a_url, b_url, out, client=client, **kwargs)  # type: ignore[arg-type]
    assert _inputs_digest(tmp_path) == before, "an input changed"
    c = zarr.open_array(out, mode="r")
    assert c.metadata.zarr_format == 3
    assert c.chunks == (max(a_chunks[0], 1), max(b_chunks[1], 1))
    assert_product(c[:], a, b, kwargs.get("dtype"))  # type: ignore[arg-type]
    assert result.shape == (m, n)
    assert result.tiles_computed == result.plan.n_tiles
    assert of_array(c).complete is True


def _inputs_digest(tmp_path: Path) -> str:
    return tree_digest(tmp_path / "a.zarr") + tree_digest(tmp_path / "b.zarr")


@pytest.mark.parametrize(
    ("m", "k", "n", "a_chunks", "b_chunks"),
    [
        (64, 48, 80, (16, 16), (16, 16)),  # aligned, many tiles
        (97, 61, 53, (20, 17), (23, 11)),  # ragged everywhere, A's K chunks != B's K chunks
        (1, 300, 1, (1, 7), (13, 1)),  # 1x1 output, long K
        (1, 40, 77, (1, 40), (40, 10)),  # one row
        (77, 40, 1, (10, 40), (40, 1)),  # one column
        (33, 1, 29, (8, 1), (1, 8)),  # K = 1 (outer product)
        (50, 70, 60, (50, 70), (70, 60)),  # a single chunk each
        (40, 30, 20, (100, 100), (100, 100)),  # chunks bigger than the arrays
        (8, 120_000, 8, (8, 7_000), (9_000, 8)),  # tall-skinny with a huge K: split-K
    ],
)
def test_shapes_and_chunkings(
    tmp_path: Path,
    client: Client,
    m: int,
    k: int,
    n: int,
    a_chunks: tuple[int, int],
    b_chunks: tuple[int, int],
) -> None:
    run_case(tmp_path, client, m, k, n, a_chunks, b_chunks)


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype", "dtype"),
    [
        ("float64", "float64", None),  # double
        ("float32", "float64", None),  # mixed: float64 output
        ("float16", "float16", None),  # half, accumulated in float32
        ("int32", "int16", "int64"),  # integers: exact (int32 could overflow: refused)
        ("complex64", "complex64", None),  # complex
    ],
)
def test_dtypes(
    tmp_path: Path, client: Client, a_dtype: str, b_dtype: str, dtype: str | None
) -> None:
    options = {"dtype": dtype} if dtype else {}
    run_case(tmp_path, client, 45, 37, 29, (10, 9), (12, 8), a_dtype, b_dtype, **options)


def test_zarr_v2_inputs(tmp_path: Path, client: Client) -> None:
    run_case(tmp_path, client, 40, 33, 27, (16, 10), (11, 9), zarr_format=2)


@pytest.mark.parametrize(
    ("m", "k", "n"),
    [
        (0, 5, 4),  # no rows
        (4, 5, 0),  # no columns
        (4, 0, 6),  # empty K: the product is all zeros
    ],
)
def test_empty_dimensions(tmp_path: Path, client: Client, m: int, k: int, n: int) -> None:
    run_case(tmp_path, client, m, k, n, (2, 2), (2, 2))


def test_split_k_is_summed(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, (16, 4000), "float64"), random_matrix(rng, (4000, 16), "float64")
    out = str(tmp_path / "c.zarr")
    result = multiply(
        write_array(tmp_path / "a.zarr", a, (16, 500)),
        write_array(tmp_path / "b.zarr", b, (500, 16)),
        out,
        client=client,
    )
    assert result.plan.split_k > 1
    assert_product(zarr.open_array(out)[:], a, b)


@pytest.fixture(scope="module")
def four_threads() -> Iterator[Client]:
    """In-process, 4 threads: plans of at least 4 tiles."""
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=4, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def test_overwrite_and_resume(tmp_path: Path, four_threads: Client) -> None:
    client = four_threads
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, (1100, 50), "float32"), random_matrix(rng, (50, 1000), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (256, 25))
    b_url = write_array(tmp_path / "b.zarr", b, (25, 250))
    out = tmp_path / "c.zarr"
    first = multiply(a_url, b_url, str(out), client=client)
    assert first.tiles_computed >= 4
    # Lose one tile's journal entry and damage another tile's data: both are redone.
    journal = sorted((out / "journal").iterdir())
    journal[0].unlink()
    entry = json.loads(journal[1].read_text())
    c = zarr.open_array(str(out), mode="r+")
    r0, c0 = (
        entry["index"][0] * first.plan.tile_shape[0],
        entry["index"][1] * first.plan.tile_shape[1],
    )
    c[r0, c0] = np.nan
    resumed = multiply(a_url, b_url, str(out), client=client, resume=True)
    assert resumed.tiles_skipped == first.tiles_computed - 2
    assert resumed.tiles_computed == 2
    assert_product(zarr.open_array(str(out))[:], a, b)
    again = multiply(a_url, b_url, str(out), client=client, overwrite=True)
    assert again.tiles_computed == first.tiles_computed


def test_verify_in_multiply(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(9)
    a, b = random_matrix(rng, (30, 20), "float32"), random_matrix(rng, (20, 25), "float32")
    out = str(tmp_path / "c.zarr")
    result = multiply(
        write_array(tmp_path / "a.zarr", a, (8, 8)),
        write_array(tmp_path / "b.zarr", b, (8, 8)),
        out,
        client=client,
        verify=True,
    )
    assert result.verified is True
    assert of_array(zarr.open_array(out)).verified is True


def test_banded_write_journals_the_crc_of_each_tile(tmp_path: Path, client: Client) -> None:
    """Tiles are written band by band during their last panel; each journal entry must still
    hold the crc32 of the whole tile as stored (what --resume trusts), every band written."""
    import zlib

    from pipeline.plan.matmul import row_bands

    rng = np.random.default_rng(4)
    a, b = random_matrix(rng, (1100, 300), "float32"), random_matrix(rng, (300, 520), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (64, 100))
    b_url = write_array(tmp_path / "b.zarr", b, (100, 64))
    out = tmp_path / "out.zarr"
    result = multiply(a_url, b_url, str(out), client=client)
    plan = result.plan
    assert result.tiles_computed == plan.n_tiles and plan.split_k == 1
    assert len(row_bands(plan.tile_shape[0], plan.block_shape[0])) > 1, "one band: nothing tested"
    c = zarr.open_array(str(out), mode="r")
    assert_product(c[:], a, b)  # NaN-filled at creation: a band never written fails here
    for tile in plan.tiles():
        name = f"tile-{tile.index[0]}-{tile.index[1]}.json"
        entry = json.loads((out / "journal" / name).read_text())
        stored = np.ascontiguousarray(c[tile.rows[0] : tile.rows[1], tile.cols[0] : tile.cols[1]])
        assert entry["checksum"] == zlib.crc32(stored.data)


def test_a_failed_band_write_fails_the_tile_unjournaled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A band write that fails (disk full, lost connection) must fail the tile task with that
    error and leave no entry for the tile: the failed band's entry (journaled ahead of its
    write) names a crc32 its rows do not give, so --resume keeps the first band only."""
    from pipeline.plan.matmul import row_bands
    from pipeline.run import worker
    from pipeline.store.output import Output

    rng = np.random.default_rng(9)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (900, 200), "float32"), (64, 100))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (200, 300), "float32"), (100, 64))
    out = tmp_path / "c.zarr"
    plan, spec = cpu_tile_task(a_url, b_url, out)
    tile = next(plan.tiles())
    assert len(row_bands(tile.shape[0], plan.block_shape[0])) > 1

    class FailsSecondBand:
        calls = 0

        def __setitem__(self, key: object, value: object) -> None:
            FailsSecondBand.calls += 1
            if FailsSecondBand.calls == 2:
                raise OSError("No space left on device")

    monkeypatch.setattr(Output, "writable", lambda self, token: FailsSecondBand())
    with pytest.raises(OSError, match="No space left"):
        worker.tile_product_write(spec, tile, plan.k_groups()[0])
    # no tile entry; band entries for the band written and the one that failed, no later one
    journal = sorted(p.name for p in (out / "journal").iterdir())
    assert journal == ["band-0-0-0.json", "band-0-0-256.json"], journal

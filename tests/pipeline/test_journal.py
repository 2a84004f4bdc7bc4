"""The journal --resume trusts, in one process, fast: a tile counts as written only when its
entry is of this job's fingerprint and its bytes still match; a tile in flight keeps only an
unbroken, checked run of bands from its first row; a changed input object marks exactly the
tiles that read it; forgetting removes exactly the named tiles' entries."""

from __future__ import annotations

import dataclasses
import json
import logging
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr

from pipeline.errors import UsageError
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec
from pipeline.store import journal
from pipeline.store.fs import write_bytes
from tests.pipeline.test_lock_units import SECRET, KeyedFileSystem

FP = "fp-this-job"


@pytest.fixture
def keyed_store() -> Iterator[None]:
    fsspec.register_implementation("keyed", KeyedFileSystem, clobber=True)
    yield
    KeyedFileSystem.clear_instance_cache()


def small_plan(**changes: Any) -> MatmulPlan:
    """OUT 8×8 in 4×4 tiles (2×2 of them), A's objects 4 rows tall, B's 4 columns wide."""
    plan = plan_matmul(
        ArraySpec((8, 6), (4, 3), "float32"),
        ArraySpec((6, 8), (3, 4), "float32"),
        workers=1,
        threads_per_worker=1,
        memory_limit_bytes=2**30,
        tile_shape=(4, 4),
    )
    return dataclasses.replace(plan, **changes)


@pytest.fixture
def out(tmp_path: Path) -> tuple[str, np.ndarray]:
    """OUT's array, written: its URL and its values."""
    data = np.random.default_rng(7).uniform(-1, 1, (8, 8)).astype("float32")
    zarr.create_array(str(tmp_path / "c.zarr"), data=data, chunks=(4, 4))
    return str(tmp_path / "c.zarr"), data


def crc(data: np.ndarray, rows: tuple[int, int], cols: tuple[int, int], chain: int = 0) -> int:
    return zlib.crc32(np.ascontiguousarray(data[slice(*rows), slice(*cols)]).data, chain)


def record(url: str, name: str, **entry: Any) -> None:
    write_bytes(url, name, json.dumps(entry).encode(), {})


def record_band(url: str, index: tuple[int, int], rows: tuple[int, int], **entry: Any) -> None:
    """A band's entry as the worker writes it (Output.journal_band)."""
    name = journal.band_entry_name(index, rows[0])
    record(url, name, index=list(index), rows=list(rows), **entry)


@pytest.mark.parametrize(
    ("index", "start", "expected"),
    [
        ((0, 0), None, "journal/tile-0-0.json"),
        ((3, 12), None, "journal/tile-3-12.json"),  # row first, then column
        ((3, 12), 256, "journal/band-3-12-256.json"),  # and the band's first row of OUT
    ],
)
def test_entry_names(index: tuple[int, int], start: int | None, expected: str) -> None:
    name = journal.entry_name(index) if start is None else journal.band_entry_name(index, start)
    assert name == expected


def test_a_tile_counts_as_written_only_with_its_entry_and_its_bytes(
    out: tuple[str, np.ndarray], caplog: pytest.LogCaptureFixture
) -> None:
    url, data = out
    plan = small_plan()
    sums = {t.index: crc(data, t.rows, t.cols) for t in plan.tiles()}
    record(url, journal.entry_name((0, 0)), index=[0, 0], fingerprint=FP, checksum=sums[0, 0])
    # another job's entry (other inputs or tiling), its bytes matching all the same
    record(url, journal.entry_name((1, 0)), index=[1, 0], fingerprint="fp-other",
           checksum=sums[1, 0])  # fmt: skip
    # its bytes changed since it was journaled
    record(url, journal.entry_name((0, 1)), index=[0, 1], fingerprint=FP,
           checksum=sums[0, 1] ^ 1)  # fmt: skip
    # a band's entry is not the tile's, even with the whole tile's checksum
    record_band(url, (1, 1), (4, 8), fingerprint=FP, checksum=sums[1, 1], chain=sums[1, 1])
    # entries naming no tile of this plan
    record(url, "journal/tile-5-5.json", index=[5, 5], fingerprint=FP, checksum=0)
    record(url, "journal/odd.json", fingerprint=FP, checksum=0)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        done = journal.finished_tiles(url, {}, plan, FP, {"fingerprint": FP})
    assert done == {(0, 0)}
    assert caplog.messages == ["resume: 1 of 4 tile(s) already written"]


@pytest.mark.parametrize(("state", "found"), [({"fingerprint": "fp-old"}, "fp-old"), ({}, None)])
def test_resume_of_an_out_written_for_other_inputs_is_refused(
    out: tuple[str, np.ndarray], state: dict[str, Any], found: object
) -> None:
    url, _ = out
    with pytest.raises(UsageError) as refused:
        journal.finished_tiles(url, {}, small_plan(), FP, state)
    assert str(refused.value) == (
        f"cannot resume {url}: it was written for different inputs or tiling (fingerprint "
        f"{found} != {FP}); use --overwrite to start over"
    )


def test_journal_and_bytes_may_live_in_two_stores(
    tmp_path: Path, out: tuple[str, np.ndarray]
) -> None:
    """Accumulation: the entries sit in a side store, the bytes they vouch for in C."""
    url, data = out
    side = str(tmp_path / "side")
    plan = small_plan()
    for t in plan.tiles():
        record(side, journal.entry_name(t.index), index=list(t.index), fingerprint=FP,
               checksum=crc(data, t.rows, t.cols))  # fmt: skip
    assert journal.journaled(side, url, {}, plan, FP) == {t.index for t in plan.tiles()}
    assert journal.journaled(url, url, {}, plan, FP) == set(), "OUT's own journal is empty"


def test_a_gram_tile_counts_only_while_its_mirror_holds(tmp_path: Path) -> None:
    """A Gram product writes tiles on and above the diagonal with their mirrors; a diagonal
    tile's checksum is chained over its gemm blocks' upper rows (2 rows each here)."""
    x = np.random.default_rng(8).uniform(-1, 1, (8, 8)).astype("float32")
    data = x + x.T
    url = str(tmp_path / "g.zarr")
    zarr.create_array(url, data=data, chunks=(2, 2))
    plan = small_plan(symmetric=True, block_shape=(2, 2))
    assert [t.index for t in plan.tiles()] == [(0, 0), (0, 1), (1, 1)]
    diagonal = {
        (0, 0): crc(data, (2, 4), (2, 4), crc(data, (0, 2), (0, 4))),
        (1, 1): crc(data, (6, 8), (6, 8), crc(data, (4, 6), (4, 8))),
    }
    sums = {**diagonal, (0, 1): crc(data, (0, 4), (4, 8))}
    for index, checksum in sums.items():
        record(url, journal.entry_name(index), index=list(index), fingerprint=FP,
               checksum=checksum)  # fmt: skip
    assert journal.journaled(url, url, {}, plan, FP) == set(sums)
    array = zarr.open_array(url, mode="r+")
    array[5, 1] = 9.0  # the mirror of tile (0, 1)'s element [1, 5], now different
    assert journal.journaled(url, url, {}, plan, FP) == {(0, 0), (1, 1)}
    chunk = tmp_path / "g.zarr" / "c" / "3" / "3"  # in tile (1, 1), the diagonal: cut short
    chunk.write_bytes(chunk.read_bytes()[:3])
    assert journal.journaled(url, url, {}, plan, FP) == {(0, 0)}


def chained(data: np.ndarray, cols: tuple[int, int], *bands: tuple[int, int]) -> list[int]:
    """The chained crc32 after each band, as the tile task journals them."""
    chains, chain = [], 0
    for rows in bands:
        chain = crc(data, rows, cols, chain)
        chains.append(chain)
    return chains


@pytest.mark.parametrize(
    ("bands", "expected"),
    [
        # tile (1, 0): rows 4..8, columns 0..4; each band (rows, chain is right)
        ([((4, 6), True), ((6, 8), True)], (8, 1)),  # the whole tile, band by band
        ([((4, 6), True)], (6, 0)),  # its first band
        ([((4, 6), True), ((6, 8), False)], (6, 0)),  # the second band's bytes changed
        ([((4, 6), False), ((6, 8), True)], None),  # the first band's bytes changed
        ([((6, 8), True)], None),  # no band from the tile's first row
        ([((4, 6), True), ((6, 10), True)], (6, 0)),  # a band past the tile's last row
        ([((4, 4), True)], None),  # an empty band (it would loop on itself)
    ],
)
def test_a_tile_in_flight_keeps_its_unbroken_checked_run_of_bands(
    out: tuple[str, np.ndarray], bands: list[tuple[tuple[int, int], bool]], expected: Any
) -> None:
    url, data = out
    cols = (0, 4)
    chains = chained(data, cols, *(rows for rows, _ in bands))
    for (rows, right), chain in zip(bands, chains, strict=True):
        record_band(url, (1, 0), rows, fingerprint=FP, chain=chain if right else chain ^ 1)
    found = journal.written_rows(url, url, {}, small_plan(), FP, set())
    assert found == ({} if expected is None else {(1, 0): (expected[0], chains[expected[1]])})


def test_bands_of_another_job_or_of_a_finished_tile_are_not_kept(
    out: tuple[str, np.ndarray],
) -> None:
    url, data = out
    (first,) = chained(data, (0, 4), (0, 2))
    record_band(url, (0, 0), (0, 2), fingerprint=FP, chain=first)
    (other,) = chained(data, (4, 8), (0, 2))
    record_band(url, (0, 1), (0, 2), fingerprint="fp-other", chain=other)
    record(url, "journal/band-1-1-4.json", index=[1, 1], rows="4-6", fingerprint=FP, chain=0)
    record(url, "journal/notes.json", rows=[0, 2], fingerprint=FP)  # names no tile
    plan = small_plan()
    assert journal.written_rows(url, url, {}, plan, FP, set()) == {(0, 0): (2, first)}
    assert journal.written_rows(url, url, {}, plan, FP, {(0, 0)}) == {}


def test_no_bands_reads_no_bytes(tmp_path: Path) -> None:
    side = str(tmp_path / "side")
    record(side, journal.entry_name((0, 0)), index=[0, 0], fingerprint=FP, checksum=0)
    missing = str(tmp_path / "no-such.zarr")  # never opened: nothing to check
    assert journal.written_rows(side, missing, {}, small_plan(), FP, set()) == {}


@pytest.mark.parametrize(
    ("changes", "a_changed", "b_changed", "stale"),
    [
        # A's objects are 4 rows tall (stored keys (row, k)); B's 4 columns wide ((k, column))
        ({}, {(1, 0)}, set(), {(1, 0), (1, 1)}),  # rows 4..8: the second tile row only
        ({}, {(0, 1)}, set(), {(0, 0), (0, 1)}),  # another K object of rows 0..4
        ({}, set(), {(0, 0)}, {(0, 0), (1, 0)}),  # columns 0..4
        ({}, set(), {(1, 1)}, {(0, 1), (1, 1)}),
        ({}, {(1, 0)}, {(0, 0)}, {(1, 0), (1, 1), (0, 0)}),
        ({}, set(), set(), set()),
        # A read transposed: its stored keys are (k, row)
        ({"transposed": (True, False)}, {(0, 1)}, set(), {(1, 0), (1, 1)}),
        # B read transposed: (column, k)
        ({"transposed": (False, True)}, set(), {(1, 0)}, {(0, 1), (1, 1)}),
        # A's objects 2 rows tall: rows 2..4 are in the first tile row only
        ({"a": ArraySpec((8, 6), (2, 3), "float32")}, {(1, 0)}, set(), {(0, 0), (0, 1)}),
        ({"a": ArraySpec((8, 6), (2, 3), "float32")}, {(2, 0)}, set(), {(1, 0), (1, 1)}),
        # B's objects 2 columns wide: columns 6..8 are in the second tile column only
        ({"b": ArraySpec((6, 8), (3, 2), "float32")}, set(), {(0, 3)}, {(0, 1), (1, 1)}),
    ],
)
def test_a_changed_input_object_marks_the_tiles_that_read_it(
    changes: dict[str, Any],
    a_changed: set[tuple[int, int]],
    b_changed: set[tuple[int, int]],
    stale: set[tuple[int, int]],
) -> None:
    assert journal.stale_tiles(small_plan(**changes), a_changed, b_changed) == stale


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "journal").iterdir())


@pytest.mark.parametrize(
    "name",
    [
        "c.zarr",
        "C_MATRIX",  # a name ending in a letter a bad strip would eat
        "c.zarr ",  # one ending in a space (legal): a strip of whitespace would lose it
    ],
)
def test_forget_removes_the_named_tiles_entries_and_bands_only(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    for index in ((1, 0), (0, 1)):
        record(str(folder), journal.entry_name(index), fingerprint=FP)
    for index, rows in (((1, 0), (4, 6)), ((1, 0), (6, 8)), ((0, 1), (0, 2)), ((0, 0), (0, 2)),
                        ((11, 0), (0, 2))):  # fmt: skip
        record_band(str(folder), index, rows, fingerprint=FP)
    journal.forget(f"{folder}/", {}, {(1, 0), (1, 1)})  # (1, 1) has no entry: nothing to do
    assert entries(folder) == ["band-0-0-0.json", "band-0-1-0.json", "band-11-0-0.json",
                               "tile-0-1.json"]  # fmt: skip


@pytest.mark.parametrize("name", ["c.zarr", "C_MATRIX", "c.zarr "])
def test_forget_bands_keeps_the_tiles_entries(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    for entry in ("tile-0-0", "tile-1-0", "band-0-0-0", "band-1-0-4"):
        record(str(folder), f"journal/{entry}.json", fingerprint=FP)
    journal.forget_bands(f"{folder}/", {})
    assert entries(folder) == ["tile-0-0.json", "tile-1-0.json"]


def test_the_journal_of_a_store_that_needs_its_options(
    out: tuple[str, np.ndarray], keyed_store: None
) -> None:
    """Every read and removal passes the storage options on (credentials on S3): keyed://
    refuses any call without them."""
    path, data = out
    url = f"keyed://{path}"
    plan = small_plan()
    record(path, journal.entry_name((0, 0)), index=[0, 0], fingerprint=FP,
           checksum=crc(data, (0, 4), (0, 4)))  # fmt: skip
    (first,) = chained(data, (0, 4), (4, 6))
    record_band(path, (1, 0), (4, 6), fingerprint=FP, chain=first)
    assert journal.finished_tiles(url, SECRET, plan, FP, {"fingerprint": FP}) == {(0, 0)}
    assert journal.written_rows(url, url, SECRET, plan, FP, set()) == {(1, 0): (6, first)}
    journal.forget_bands(url, SECRET)
    assert entries(Path(path)) == ["tile-0-0.json"]
    journal.forget(url, SECRET, {(0, 0)})
    assert entries(Path(path)) == []


def test_a_written_tile_whose_chunk_no_longer_decodes_is_not_counted(
    out: tuple[str, np.ndarray], caplog: pytest.LogCaptureFixture
) -> None:
    """A journaled tile with a chunk cut short is computed again (with a warning), while the
    others still count; --resume does not stop on it."""
    url, data = out
    plan = small_plan()
    for t in plan.tiles():
        entry = {"index": list(t.index), "fingerprint": FP, "checksum": crc(data, t.rows, t.cols)}
        record(url, journal.entry_name(t.index), **entry)
    chunk = Path(url) / "c" / "1" / "0"  # tile (1, 0): rows 4:8, columns 0:4
    chunk.write_bytes(chunk.read_bytes()[:5])
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        done = journal.finished_tiles(url, {}, plan, FP, {"fingerprint": FP})
    assert done == {(0, 0), (0, 1), (1, 1)}
    assert any("rows 4:8, columns 0:4 cannot be read back" in m for m in caplog.messages)


@pytest.mark.parametrize("codec", ["gzip", "bz2"])
def test_a_chunk_of_any_codec_that_no_longer_decodes_is_not_counted(
    tmp_path: Path, codec: str
) -> None:
    """gzip's and bz2's decoding errors are OSErrors: still a chunk to compute again, not a
    storage error (an accumulation's C is the user's array, in any codec)."""
    import numcodecs

    data = np.random.default_rng(9).uniform(-1, 1, (8, 8)).astype("float32")
    url = str(tmp_path / "c.zarr")
    compressor = numcodecs.GZip() if codec == "gzip" else numcodecs.BZ2()
    zarr.create_array(url, data=data, chunks=(4, 4), zarr_format=2, compressors=compressor)
    plan = small_plan()
    for t in plan.tiles():
        entry = {"index": list(t.index), "fingerprint": FP, "checksum": crc(data, t.rows, t.cols)}
        record(url, journal.entry_name(t.index), **entry)
    (tmp_path / "c.zarr" / "0.1").write_bytes(b"not a stream")  # tile (0, 1)
    assert journal.journaled(url, url, {}, plan, FP) == {(0, 0), (1, 0), (1, 1)}


def test_a_storage_that_refuses_is_an_error_not_a_recompute(
    out: tuple[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, data = out
    plan = small_plan()
    t = next(iter(plan.tiles()))
    entry = {"index": list(t.index), "fingerprint": FP, "checksum": crc(data, t.rows, t.cols)}
    record(url, journal.entry_name(t.index), **entry)

    def refused(*args: Any, **kwargs: Any) -> bool:
        raise PermissionError("the store said no")

    monkeypatch.setattr(journal.chunk_read, "read_into", refused)
    with pytest.raises(PermissionError, match="the store said no"):
        journal.journaled(url, url, {}, plan, FP)


@pytest.mark.parametrize("band_bytes", [1, 4 * 4 * 4, 1 << 20])
def test_a_tile_read_back_in_bands_has_the_whole_tiles_checksum(
    out: tuple[str, np.ndarray], monkeypatch: pytest.MonkeyPatch, band_bytes: int
) -> None:
    """The client reads a written tile back in bands of whole stored rows (its memory bounded);
    the crc32 chained over them is the whole tile's, and a change in its last row is seen."""
    url, data = out
    monkeypatch.setattr(journal, "BAND_BYTES", band_bytes)
    plan = small_plan()
    for t in plan.tiles():
        entry = {"index": list(t.index), "fingerprint": FP, "checksum": crc(data, t.rows, t.cols)}
        record(url, journal.entry_name(t.index), **entry)
    assert journal.journaled(url, url, {}, plan, FP) == {t.index for t in plan.tiles()}
    zarr.open_array(url, mode="r+")[7, 7] = 5.0  # the last row of tile (1, 1)
    assert journal.journaled(url, url, {}, plan, FP) == {(0, 0), (0, 1), (1, 0)}

"""A tile task's band writer (pipeline/run/band_writer.py) on a real OUT and a real lock, without
a cluster: each band is fenced by the job's lock token, so once another job takes OUT nothing
more is written; bands go in row order, journaled before their bytes (benchmarks/mutate.py,
target band-writer)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from numpy.typing import NDArray

from pipeline.accumulate import crash
from pipeline.errors import UnsafeOutputError
from pipeline.plan.spec import StoreSpec, Tile
from pipeline.plan.standardize import Standardize
from pipeline.run import band_writer
from pipeline.run.band_writer import BandWriter
from pipeline.run.spec import TaskSpec
from pipeline.run.timing import PhaseTimes
from pipeline.store import lock
from pipeline.store.journal import band_entry_name
from pipeline.store.output import Output

SHAPE = (16, 12)


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    """OUT poisoned with NaN: a row never written stays NaN."""
    path = tmp_path / "out.zarr"
    zarr.create_array(str(path), shape=SHAPE, chunks=(4, 12), dtype="float64", fill_value=np.nan)
    yield path


def spec_for(out: Path, token: str, **changes: Any) -> TaskSpec:
    store = StoreSpec("a.zarr", "b.zarr", str(out), symmetric=changes.pop("symmetric", False))
    return TaskSpec(store=store, backend="cpu", compute_dtype="float64", out_dtype="float64",
                    fingerprint=f"fp-{out}", lock_token=token, **changes)  # fmt: skip


def stored(out: Path) -> NDArray[Any]:
    return np.asarray(zarr.open_array(str(out), mode="r")[:])


def band_entry(out: Path, index: tuple[int, int], start: int) -> dict[str, Any] | None:
    path = out / band_entry_name(index, start)
    return json.loads(path.read_text()) if path.exists() else None


def rows_of(value: float, height: int, width: int) -> NDArray[Any]:
    return np.full((height, width), value)


def test_the_lock_holder_writes_every_band_and_journals_all_but_the_last(out: Path) -> None:
    tile = Tile((1, 0), (4, 16), (2, 8))
    bands = [((0, 4), 1.0), ((4, 8), 2.0), ((8, 12), 3.0)]
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, tile, None, PhaseTimes()) as writer:
            for band, value in bands:
                writer.accept(band, rows_of(value, 4, 6))
            writer.finish()
    got = stored(out)
    for (r0, r1), value in bands:
        assert (got[4 + r0 : 4 + r1, 2:8] == value).all()
    got[4:16, 2:8] = np.nan
    assert np.isnan(got).all(), "written outside the tile"
    whole = np.concatenate([rows_of(v, 4, 6) for _, v in bands])
    assert writer.crc == zlib.crc32(whole.data)
    first = band_entry(out, (1, 0), 4)
    assert first is not None and first["rows"] == [4, 8] and first["index"] == [1, 0]
    assert first["chain"] == zlib.crc32(rows_of(1.0, 4, 6).data)
    assert first["fingerprint"] == spec.fingerprint
    second = band_entry(out, (1, 0), 8)
    assert second is not None and second["chain"] == zlib.crc32(whole[:8].data)
    assert band_entry(out, (1, 0), 12) is None  # the last band: the tile's own entry covers it


def test_a_band_after_another_job_took_out_is_refused_and_not_written(out: Path) -> None:
    """The job's lock is gone and a newer job holds OUT: the older job's task stops before
    its next band, which stays unwritten and unjournaled."""
    tile = Tile((0, 0), (0, 12), (0, 12))
    old = lock.acquire(str(out), {})
    spec = spec_for(out, old.token)
    with BandWriter(spec, tile, None, PhaseTimes()) as writer:
        writer.accept((0, 4), rows_of(1.0, 4, 12))
        writer.finish()
        old.release()
        with lock.hold_lock(str(out), {}):
            writer.accept((4, 8), rows_of(2.0, 4, 12))
            writer.accept((8, 12), rows_of(3.0, 4, 12))
            with pytest.raises(UnsafeOutputError, match="no longer holds OUT's lock"):
                writer.finish()
    got = stored(out)
    assert (got[0:4] == 1.0).all()
    assert np.isnan(got[4:]).all(), "a fenced-off task wrote rows"
    assert band_entry(out, (0, 0), 0) is not None
    assert band_entry(out, (0, 0), 4) is None, "a fenced-off task journaled a band"


def test_a_task_whose_job_released_the_lock_writes_nothing(out: Path) -> None:
    with lock.hold_lock(str(out), {}) as held:
        token = held.token
    spec = spec_for(out, token)
    with BandWriter(spec, Tile((0, 0), (0, 4), (0, 12)), None, PhaseTimes()) as writer:
        writer.accept((0, 4), rows_of(1.0, 4, 12))
        with pytest.raises(UnsafeOutputError, match="this task stops without writing"):
            writer.finish()
    assert np.isnan(stored(out)).all()


def test_a_symmetric_product_is_fenced_too(out: Path) -> None:
    """A Gram product's band and its mirror: neither is written once the lock is another's."""
    tile = Tile((0, 1), (0, 4), (4, 8))
    with lock.hold_lock(str(out), {}) as held:
        token = held.token
    with lock.hold_lock(str(out), {}):
        spec = spec_for(out, token, symmetric=True)
        with BandWriter(spec, tile, None, PhaseTimes()) as writer:
            writer.accept((0, 4), rows_of(5.0, 4, 4))
            with pytest.raises(UnsafeOutputError):
                writer.finish()
    assert np.isnan(stored(out)).all()


def test_a_symmetric_band_is_written_with_its_mirror_and_chained(out: Path) -> None:
    tile = Tile((0, 1), (0, 4), (4, 8))
    data = np.arange(16.0).reshape(4, 4)
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token, symmetric=True)
        with BandWriter(spec, tile, (2, 7), PhaseTimes()) as writer:
            writer.accept((0, 2), data[2:])
            writer.finish()
    got = stored(out)
    np.testing.assert_array_equal(got[0:2, 4:8], data[2:])
    np.testing.assert_array_equal(got[4:8, 0:2], data[2:].T)
    assert writer.crc == zlib.crc32(np.ascontiguousarray(data[2:]).data, 7)
    assert not (out / band_entry_name((0, 1), 0)).exists()


def test_a_resumed_tile_writes_from_its_first_unwritten_row_on(out: Path) -> None:
    """``resume`` (4, crc of rows 0..4): the bands are rows of the rest, the chain goes on."""
    tile = Tile((0, 0), (8, 16), (0, 12))
    done = zlib.crc32(rows_of(9.0, 4, 12).data)
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, tile, (12, done), PhaseTimes()) as writer:
            assert writer.todo == Tile((0, 0), (12, 16), (0, 12))
            writer.accept((0, 2), rows_of(1.0, 2, 12))
            writer.accept((2, 4), rows_of(2.0, 2, 12))
            writer.finish()
    got = stored(out)
    assert np.isnan(got[:12]).all()
    assert (got[12:14] == 1.0).all() and (got[14:16] == 2.0).all()
    entry = band_entry(out, (0, 0), 12)
    assert entry is not None and entry["rows"] == [12, 14]
    assert entry["chain"] == zlib.crc32(rows_of(1.0, 2, 12).data, done)
    assert band_entry(out, (0, 0), 14) is None
    tail = np.concatenate([rows_of(1.0, 2, 12), rows_of(2.0, 2, 12)])
    assert writer.crc == zlib.crc32(tail.data, done)


def test_an_empty_band_writes_nothing_and_keeps_the_chain(out: Path) -> None:
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, Tile((0, 0), (0, 4), (0, 12)), (0, 5), PhaseTimes()) as writer:
            writer.accept((0, 0), np.empty((0, 12)))
            writer.finish()
    assert writer.crc == 5
    assert np.isnan(stored(out)).all()


def test_a_correlation_band_gets_its_diagonal_where_the_tile_places_it(out: Path) -> None:
    """Standardize.finish sees the band's place in G: a tile right of the first column, a
    resumed band below the tile's first row."""
    std = Standardize("scale", 1, shift=np.zeros(16), scale=np.ones(16))
    tile = Tile((0, 0), (0, 8), (2, 8))
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token, standardize=std)
        with BandWriter(spec, tile, (2, 0), PhaseTimes()) as writer:
            writer.accept((2, 6), rows_of(3.0, 4, 6))  # rows 4..8 of G, columns 2..8
            writer.finish()
    got = stored(out)[4:8, 2:8]
    expected = rows_of(1.0, 4, 6)  # clipped to 1; the diagonal (4, 4) .. (7, 7) is 1 too
    np.testing.assert_array_equal(got, expected)
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token, standardize=std)
        with BandWriter(spec, tile, (2, 0), PhaseTimes()) as writer:
            writer.accept((2, 6), rows_of(0.25, 4, 6))
            writer.finish()
    got = stored(out)[4:8, 2:8]
    expected = rows_of(0.25, 4, 6)
    expected[[0, 1, 2, 3], [2, 3, 4, 5]] = 1.0
    np.testing.assert_array_equal(got, expected)


class Rows:
    """C's originals stand-in: row r holds 100·r."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def rows(self, lo: int, hi: int) -> NDArray[Any]:
        self.asked.append((lo, hi))
        return np.repeat(100.0 * np.arange(lo, hi)[:, None], 12, axis=1)


class Accumulating:
    """band_writer's view of pipeline.accumulate: the originals, and a sum that shows them."""

    def __init__(self, originals: Rows | None) -> None:
        self.originals = originals
        self.tiles: list[Tile] = []

    def original(self, spec: TaskSpec, tile: Tile) -> Rows | None:
        self.tiles.append(tile)
        return self.originals

    @staticmethod
    def combine(spec: TaskSpec, product: NDArray[Any], old: NDArray[Any] | None) -> NDArray[Any]:
        return product if old is None else product + old


def test_accumulating_combines_each_band_with_the_originals_under_it(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed tile's band (rows of ``todo``) is combined with C's original rows at the
    same place of the tile."""
    originals = Rows()
    accumulating = Accumulating(originals)
    monkeypatch.setattr(band_writer, "accumulate", accumulating)
    tile = Tile((1, 0), (4, 12), (0, 12))
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, tile, (7, 0), PhaseTimes()) as writer:
            writer.accept((0, 2), rows_of(0.5, 2, 12))
            writer.accept((2, 5), rows_of(0.5, 3, 12))
            writer.finish()
    assert accumulating.tiles == [tile]  # the whole tile's originals moved aside, once
    assert originals.asked == [(3, 5), (5, 8)]  # rows of the tile, 7 - 4 = 3 in
    got = stored(out)
    np.testing.assert_array_equal(got[7:12, 0], 0.5 + 100.0 * np.arange(3, 8))
    assert np.isnan(got[:7]).all() and np.isnan(got[12:]).all()


def test_without_accumulating_no_originals_are_read(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(band_writer, "accumulate", Accumulating(None))
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, Tile((0, 0), (0, 4), (0, 12)), None, PhaseTimes()) as writer:
            writer.accept((0, 4), rows_of(0.5, 4, 12))
            writer.finish()
    assert (stored(out)[:4] == 0.5).all()


def test_after_a_band_fails_no_later_band_is_written(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows stay in order: the band after a failed one is not written even though it could
    be, and finish raises the first failure."""
    calls = []

    def fence(self: Output, token: str) -> None:
        calls.append(token)
        if len(calls) == 2:
            raise UnsafeOutputError("the second band's fence")

    monkeypatch.setattr(Output, "check_fence", fence)
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, Tile((0, 0), (0, 12), (0, 12)), None, PhaseTimes()) as writer:
            for i in range(3):
                writer.accept((4 * i, 4 * i + 4), rows_of(float(i + 1), 4, 12))
            with pytest.raises(UnsafeOutputError, match="the second band's fence"):
                writer.finish()
    assert calls == [held.token, held.token]
    got = stored(out)
    assert (got[:4] == 1.0).all() and np.isnan(got[4:]).all()


def test_leaving_the_writer_waits_for_every_queued_band(
    out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No write of a task outlives it, even without finish()."""

    names = []

    def slow_fence(self: Output, token: str) -> None:
        names.append(threading.current_thread().name)
        time.sleep(0.2)

    monkeypatch.setattr(Output, "check_fence", slow_fence)
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, Tile((0, 0), (0, 4), (0, 12)), None, PhaseTimes()) as writer:
            writer.accept((0, 4), rows_of(1.0, 4, 12))
        assert (stored(out)[:4] == 1.0).all()
    assert names[0].startswith("band-write")  # named in a worker's thread dump and profiles


def test_at_most_two_bands_wait_to_be_written(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The product waits for the band two before the one it hands over (host memory)."""
    gate = threading.Event()

    def held_fence(self: Output, token: str) -> None:
        gate.wait(5)

    monkeypatch.setattr(Output, "check_fence", held_fence)
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        clock = PhaseTimes()
        with BandWriter(spec, Tile((0, 0), (0, 12), (0, 12)), None, clock) as writer:
            writer.accept((0, 4), rows_of(1.0, 4, 12))
            writer.accept((4, 8), rows_of(2.0, 4, 12))
            handed = threading.Thread(target=writer.accept, args=((8, 12), rows_of(3.0, 4, 12)))
            handed.start()
            handed.join(0.3)
            assert handed.is_alive(), "a third band was queued while two were waiting"
            gate.set()
            handed.join(5)
            writer.finish()
    assert clock.as_dict()["wait"] >= 0.25
    assert clock.as_dict()["write"] > 0
    got = stored(out)
    assert (got[:4] == 1.0).all() and (got[4:8] == 2.0).all() and (got[8:12] == 3.0).all()


def test_the_writer_holds_out_to_the_folder_the_job_locked(out: Path, tmp_path: Path) -> None:
    """A task given another folder's identity (OUT swapped after the job locked it) writes
    nothing through OUT's path."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = elsewhere.stat()
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token, out_folder=(other.st_dev, other.st_ino))
        tile = Tile((0, 0), (0, 4), (0, 12))
        refused = pytest.raises(UnsafeOutputError, match="not the folder the job locked")
        with refused, BandWriter(spec, tile, None, PhaseTimes()) as writer:
            writer.accept((0, 4), rows_of(1.0, 4, 12))
            writer.finish()
    assert np.isnan(stored(out)).all()


def test_each_band_written_is_a_step_of_the_crash_schedule(
    out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make fuzz-crash`` stops a job after any band written: each band counts one hit of
    the step ``write.band`` (the 99th, never reached here, would be the signal)."""
    count = tmp_path / "hits"
    monkeypatch.setenv(crash.AT, "write.band:99:TERM")
    monkeypatch.setenv(crash.COUNT, str(count))
    with lock.hold_lock(str(out), {}) as held:
        spec = spec_for(out, held.token)
        with BandWriter(spec, Tile((0, 0), (0, 12), (0, 12)), None, PhaseTimes()) as writer:
            for i in range(3):
                writer.accept((4 * i, 4 * i + 4), rows_of(1.0, 4, 12))
            writer.finish()
    assert count.read_bytes() == b"..."


def test_a_new_job_writes_through_its_own_handle_of_out(out: Path, tmp_path: Path) -> None:
    """A long-lived worker: OUT rewritten between two jobs (float64, then float32 at the same
    path) is written as the second job's OUT, not through the first job's cached handle."""
    tile = Tile((0, 0), (0, 4), (0, 12))
    with lock.hold_lock(str(out), {}) as held:
        first = spec_for(out, held.token)
        with BandWriter(first, tile, None, PhaseTimes()) as writer:
            writer.accept((0, 4), rows_of(1.0, 4, 12))
            writer.finish()
    zarr.create_array(str(out), shape=SHAPE, chunks=(4, 12), dtype="float32",
                      fill_value=np.nan, overwrite=True)  # fmt: skip
    with lock.hold_lock(str(out), {}) as held:
        second = dataclasses.replace(
            spec_for(out, held.token), fingerprint="fp-2", out_dtype="float32"
        )
        with BandWriter(second, tile, None, PhaseTimes()) as writer:
            writer.accept((0, 4), rows_of(2.0, 4, 12).astype(np.float32))
            writer.finish()
    got = stored(out)
    assert got.dtype == np.float32 and (got[:4] == 2.0).all() and np.isnan(got[4:]).all()

"""OUT's large chunks written with O_DIRECT: the same bytes as a buffered write, the
unaligned tail included, nothing left behind, and a buffered write where O_DIRECT is refused."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline.store import direct, owned
from pipeline.store.direct import ALIGN, DIRECT_MIN_BYTES, OutStore, write_direct
from pipeline.store.door import Door


@pytest.mark.parametrize(
    "nbytes",
    [
        DIRECT_MIN_BYTES,  # aligned: all of it direct
        2 * DIRECT_MIN_BYTES + 100,  # an unaligned tail written buffered after the body
        ALIGN - 1,  # no aligned body at all
    ],
)
def test_writes_the_same_bytes(tmp_path: Path, nbytes: int) -> None:
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    path = tmp_path / "c" / "0" / "1"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"old")  # replaced whole, as zarr's rename does
    if not write_direct(Door(str(tmp_path)), "c/0/1", data):
        pytest.skip("this file system refuses O_DIRECT (the store test covers the fallback)")
    assert path.read_bytes() == data.tobytes()
    assert os.listdir(path.parent) == ["1"]  # no .partial file left


def test_a_refused_o_direct_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> int:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(direct.os, "pwrite", refuse)
    assert not write_direct(Door(str(tmp_path)), "chunk", np.zeros(DIRECT_MIN_BYTES, np.uint8))
    assert os.listdir(tmp_path) == []


def test_store_round_trip_with_and_without_o_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(1)
    values = rng.standard_normal((1100, 700)).astype(np.float32)  # edge chunks: partial
    for refused in (False, True):
        if refused:  # tmpfs and the like: zarr's own buffered write
            monkeypatch.setattr(direct, "write_direct", lambda door, key, data: False)
        url = str(tmp_path / f"c{int(refused)}.zarr")
        zarr.create_array(url, shape=values.shape, chunks=(512, 512), dtype="float32",
                          compressors=None, fill_value=np.nan)  # fmt: skip
        out = zarr.open_array(store=OutStore(url), mode="r+")
        out[:, :] = values
        assert np.array_equal(zarr.open_array(url, mode="r")[:], values)
        assert not list(Path(url).rglob("*.partial"))


def test_workers_write_a_local_out_through_it(tmp_path: Path) -> None:
    from pipeline.store.handles import cached_array

    url = str(tmp_path / "c.zarr")
    zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="float32")
    assert isinstance(cached_array(url, {}, "job", writable=True).store, OutStore)
    assert not isinstance(cached_array(url, {}, "job").store, OutStore)  # inputs: read


def test_remove_partials_takes_only_temporary_files_of_our_names(tmp_path: Path) -> None:
    """What a writer killed mid-chunk leaves (ours or zarr's: name.<uuid4 hex>.partial, of a
    name OUT's record owns) goes; chunks, metadata and files merely named like it stay."""
    url = str(tmp_path / "c.zarr")
    zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="float32",
                      attributes={owned.ATTRS_KEY: {"tile_shape": [4, 4]}})  # fmt: skip
    root = Path(url)
    hexname = "0123456789abcdef0123456789abcdef"
    left = [root / "c" / "0" / f"1.{hexname}.partial", root / f"zarr.json.{hexname}.partial"]
    kept = [
        root / "c" / "0" / "1",
        root / "c" / "0" / "2.partial",  # no uuid
        root / "c" / "0" / f"3.{hexname[:-1]}.partial",  # 31 hex digits
        root / "c" / "0" / f"9.{hexname}.partial",  # outside the grid: not a name of ours
        root / f"notes.txt.{hexname}.partial",
    ]
    for path in left + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    assert owned.remove_partials(url) == 2
    assert not any(p.exists() for p in left) and all(p.exists() for p in kept)
    assert owned.remove_partials(None) == 0  # not a local OUT

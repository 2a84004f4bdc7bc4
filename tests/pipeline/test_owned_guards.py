"""What inside OUT is ours, name by name (no cluster): a chunk key one past the grid, a journal
entry outside the tiling, a lock in an array without our record are foreign, so --overwrite
refuses the OUT holding them and leaves them where they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr

from pipeline.errors import InputError, UnsafeOutputError
from pipeline.store import owned
from pipeline.store.output import Output
from pipeline.store.owned import Found, Record, classify, describe, record
from pipeline.store.record import ATTRS_KEY, OutRecord

OURS = OutRecord(fingerprint="f0", complete=True, tile_shape=(2, 3))
HEX = "0123456789abcdef" * 2


def _out(tmp_path: Path, **options: Any) -> Path:
    """Our 4x6 product in 2x3 chunks (a 2x2 grid), every chunk written."""
    path = tmp_path / "c.zarr"
    options = {"chunks": (2, 3), "attributes": OURS.attributes(), **options}
    array = zarr.create_array(str(path), shape=(4, 6), dtype="f4", **options)
    array[:] = np.arange(24, dtype="f4").reshape(4, 6)
    return path


@pytest.mark.parametrize(
    ("planted", "foreign"),
    [
        ("c/0/2", "1 file(s) this tool did not write (c/0/2)"),  # one past the columns
        ("c/2/0", "2 file(s) this tool did not write (c/2/0, c/2/)"),  # past the rows
        ("c/2/2", "2 file(s) this tool did not write (c/2/2, c/2/)"),
        ("c/00/1", "2 file(s) this tool did not write (c/00/1, c/00/)"),
        ("c/0/9/0", "2 file(s) this tool did not write (c/0/9/0, c/0/9/)"),
    ],
)
def test_overwrite_refuses_a_chunk_key_outside_the_grid_and_keeps_it(
    tmp_path: Path, planted: str, foreign: str
) -> None:
    out = _out(tmp_path)
    (out / planted).parent.mkdir(parents=True, exist_ok=True)
    (out / planted).write_bytes(b"someone else's")
    with pytest.raises(UnsafeOutputError) as refused:
        Output(str(out)).remove_ours()
    assert str(refused.value) == (
        f"OUT ({out}) holds {foreign}; --overwrite writes "
        "only into our own array: move them out or choose another OUT"
    )
    assert (out / planted).read_bytes() == b"someone else's"
    assert zarr.open_array(str(out))[3, 5] == 23


def test_overwrite_removes_ours_metadata_last_and_keeps_the_lock(tmp_path: Path) -> None:
    out = _out(tmp_path)
    (out / "lock.json").write_text("{}")
    (out / "journal").mkdir()
    (out / "journal" / "tile-1-1.json").write_text("{}")
    (out / "c" / "1" / f"1.{HEX}.partial").write_bytes(b"torn")
    assert owned.entries(str(out), {}) == (
        ["c/0/0", "c/0/1", "c/1/0", "c/1/1", f"c/1/1.{HEX}.partial", "journal/tile-1-1.json",
         "lock.json", "zarr.json"],
        [],
    )  # fmt: skip
    removed = owned.remove_ours(str(out), {}, keep=("lock.json",))
    assert removed == 7
    assert sorted(p.name for p in out.iterdir()) == ["lock.json"]  # empty folders gone too


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_the_metadata_documents_go_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zarr_format: int
) -> None:
    out = _out(tmp_path, zarr_format=zarr_format)
    order: list[str] = []
    remove = owned.Door.remove
    monkeypatch.setattr(owned.Door, "remove", lambda door, n: order.append(n) or remove(door, n))
    owned.remove_ours(str(out), {})
    chunks = (
        ["c/0/0", "c/0/1", "c/1/0", "c/1/1"] if zarr_format == 3 else ["0.0", "0.1", "1.0", "1.1"]
    )
    assert order == chunks + (["zarr.json"] if zarr_format == 3 else [".zarray", ".zattrs"])


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_object_store_is_reached_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zarr_format: int
) -> None:
    url = f"memory://owned-options-{zarr_format}-{tmp_path.name}/c.zarr"
    zarr.create_array(url, shape=(4, 6), chunks=(2, 3), dtype="f4", zarr_format=zarr_format,
                      attributes=OURS.attributes())  # fmt: skip
    zarr.open_array(url, mode="r+")[:] = 1
    options = {"token": "the user's"}
    seen: list[object] = []
    url_to_fs, read_json = owned.url_to_fs, owned.read_json
    monkeypatch.setattr(owned, "url_to_fs", lambda u, o: seen.append(o) or url_to_fs(u, {}))
    monkeypatch.setattr(owned, "read_json", lambda u, n, o: seen.append(o) or read_json(u, n, {}))
    assert owned.entries(url, options)[1] == []
    assert owned.remove_ours(url, options) == (5 if zarr_format == 3 else 6)
    calls = 2 if zarr_format == 3 else 3  # the listing, then zarr.json or .zarray and .zattrs
    assert len(seen) == 2 * calls + 1 and all(o is options for o in seen), seen


def test_remove_ours_refuses_anything_foreign_as_a_last_line(tmp_path: Path) -> None:
    out = _out(tmp_path)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        owned.remove_ours(str(out), {})
    assert (out / "notes.txt").read_text() == "mine" and (out / "c" / "0" / "0").exists()


def test_an_object_store_out_is_listed_and_cleared(tmp_path: Path) -> None:
    url = f"memory://owned-{tmp_path.name}/OUTX"  # ends in a character a strip could take
    zarr.create_array(url, shape=(4, 6), chunks=(2, 3), dtype="f4", attributes=OURS.attributes())
    zarr.open_array(url, mode="r+")[:] = 1
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"/owned-{tmp_path.name}/OUTX/lock.json", b"{}")
    fs.pipe_file(f"/owned-{tmp_path.name}/OUTX/c/0/0.{HEX}.partial", b"")
    found = owned.listing(url, {})
    assert found.files["lock.json"] == 2 and found.files[f"c/0/0.{HEX}.partial"] == 0
    assert found.folders == set() and found.other == []
    assert len(found.files) == 7 and "zarr.json" in found.files
    assert owned.remove_ours(url, {}, keep=("lock.json",)) == 6
    assert sorted(owned.listing(url, {}).files) == ["lock.json"]
    assert owned.remove_ours(url, {}, keep=("lock.json",)) == 0
    assert owned.remove_partials(url) == 0  # object stores: none


def test_remove_partials_removes_only_temporary_files_of_our_names(tmp_path: Path) -> None:
    out = _out(tmp_path)
    (out / f"c/0/0.{HEX}.partial").write_bytes(b"torn")
    (out / f"zarr.json.{HEX}.partial").write_bytes(b"torn")
    (out / f"c/0/0.{HEX[:-1]}.partial").write_bytes(b"not ours")
    assert owned.remove_partials(str(out)) == 2
    assert owned.remove_partials(None) == 0
    assert (out / f"c/0/0.{HEX[:-1]}.partial").exists() and (out / "c/0/0").exists()
    assert not (out / f"c/0/0.{HEX}.partial").exists()


def test_a_listing_reports_links_and_folders(tmp_path: Path) -> None:
    out = _out(tmp_path)
    (out / "c" / "link").symlink_to(tmp_path)
    found = owned.listing(str(out), {})
    assert found.folders == {"c", "c/0", "c/1"} and found.other == ["c/link"]
    assert found.files["zarr.json"] == (out / "zarr.json").stat().st_size
    assert classify(found, owned.read_record(str(out), {}, found))[1] == ["c/link"]


def _v3(separator: str = "/", prefix: str = "c/", out: OutRecord | None = OURS) -> Record:
    return Record(3, (5, 7), (2, 3), separator, prefix, out)  # a 3x3 grid; tiles 2x3 (3x3)


V3 = {"zarr_format": 3, "node_type": "array", "shape": [5, 7],
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}}}  # fmt: skip
V2 = {"zarr_format": 2, "shape": [5, 7], "chunks": [2, 3]}


@pytest.mark.parametrize(
    ("metadata", "attributes", "found"),
    [
        (V3, None, _v3(out=None)),
        ({**V3, "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}},
         None, _v3(".", "c.", None)),
        ({**V3, "chunk_key_encoding": {"name": "v2"}}, None, _v3(".", "", None)),
        ({**V3, "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "/"}}},
         None, _v3("/", "", None)),
        ({**V3, "attributes": OURS.attributes()}, None, _v3(out=OURS)),
        (V2, None, Record(2, (5, 7), (2, 3), ".", "", None)),
        ({**V2, "dimension_separator": "/"}, OURS.attributes(),
         Record(2, (5, 7), (2, 3), "/", "", OURS)),
        ({**V3, "shape": [5]}, None, None),  # 1-D
        ({**V2, "shape": [5, 7, 1]}, None, None),
        ({**V3, "node_type": "group"}, None, None),
        ({**V3, "zarr_format": 4}, None, None),
        ({"zarr_format": 3}, None, None),  # no shape
        ({**V3, "chunk_grid": {}}, None, None),
        ({**V2, "chunks": "x"}, None, None),
        ({**V3, "shape": ["x", 2]}, None, None),
    ],
)  # fmt: skip
def test_record_reads_the_layout(
    metadata: dict[str, Any], attributes: dict[str, Any] | None, found: Record | None
) -> None:
    assert record(metadata, attributes) == found


@pytest.mark.parametrize(
    ("rec", "path", "ours"),
    [
        (_v3(), "zarr.json", True),
        (_v3(), ".zarray", False),  # not in a v3 array
        (Record(2, (5, 7), (2, 3), ".", "", OURS), ".zattrs", True),
        (Record(2, (5, 7), (2, 3), ".", "", OURS), ".zarray", True),
        (Record(2, (5, 7), (2, 3), ".", "", OURS), "zarr.json", False),
        (_v3(), "c/0/0", True),
        (_v3(), "c/2/2", True),
        (_v3(), "c/3/0", False),  # one past the grid
        (_v3(), "c/0/3", False),
        (_v3(), "c/01/0", False),
        (_v3(), "c/-1/0", False),
        (_v3(), "c/0", False),
        (_v3(), "c/0/0/0", False),
        (_v3(), "0/0", False),  # without the prefix
        (_v3(), "d/0/0", False),
        (_v3(".", "c."), "c.2.2", True),
        (_v3(".", "c."), "c/2/2", False),
        (_v3(".", ""), "2.2", True),
        (_v3(".", ""), "3.2", False),
        (_v3(), f"c/1/1.{HEX}.partial", True),
        (_v3(), f"zarr.json.{HEX}.partial", True),
        (_v3(), f"c/3/1.{HEX}.partial", False),
        (_v3(), f"c/1/1.{HEX.upper()}.partial", False),
        (_v3(), "c/1/1.partial", False),
        (_v3(), "lock.json", True),
        (_v3(), "inputs.json", True),
        (_v3(out=None), "lock.json", False),  # only an array of ours holds a lock
        (_v3(out=None), "inputs.json", False),
        (_v3(out=None), "c/1/1", True),
        (_v3(), "journal/tile-2-2.json", True),
        (_v3(), "journal/tile-3-0.json", False),  # 5 rows in tiles of 2: rows 0..2
        (_v3(), "journal/tile-0-3.json", False),  # 7 columns in tiles of 3: 0..2
        (_v3(), "journal/tile-01-0.json", False),
        (_v3(), "journal/tile-0-0.jsonx", False),
        (_v3(), "journal/band-1-2-2.json", True),  # tile row 1 holds rows 2, 3
        (_v3(), "journal/band-1-2-4.json", True),  # a band may run past its tile row
        (_v3(), "journal/band-1-2-1.json", False),  # before its tile row
        (_v3(), "journal/band-2-2-5.json", False),  # past the last row
        (_v3(), "journal/band-3-0-4.json", False),
        (_v3(out=OutRecord(tile_shape=(1, 3))), "journal/tile-4-2.json", True),  # 5 tile rows
        (_v3(out=OutRecord(tile_shape=(3, 1))), "journal/tile-1-6.json", True),  # 7 tile columns
        (_v3(out=None), "journal/tile-0-0.json", False),
        (_v3(out=OutRecord()), "journal/tile-0-0.json", False),  # no tiling: no journal
        (_v3(), ".tilegemm-accumulate/state.json", True),
        (_v3(out=None), ".tilegemm-accumulate/journal/tile-0-0.json", True),
        (_v3(), ".tilegemm-accumulate/journal/band-0-0-1.json", True),
        (_v3(), ".tilegemm-accumulate/saved/tile-1-0.json", True),
        (_v3(), ".tilegemm-accumulate/original/c/0/0", True),
        (_v3(), ".tilegemm-accumulate/notes.txt", False),
        (_v3(), ".tilegemm-accumulate/journal/tile-00-0.json", False),
        (_v3(), ".tilegemm-accumulatex/state.json", False),
        (_v3(), "notes.txt", False),
    ],
)
def test_owns(rec: Record, path: str, ours: bool) -> None:
    assert rec.owns(path) is ours


@pytest.mark.parametrize(
    ("rec", "path", "ours"),
    [
        (_v3(), "journal", True),
        (_v3(".", ""), "journal", True),
        (_v3(), ".tilegemm-accumulate", True),
        (_v3(".", ""), ".tilegemm-accumulate/original/c", True),
        (_v3(), "c", True),
        (_v3(), "c/2", True),
        (_v3(), "c/3", False),  # one past the grid's rows
        (Record(3, (5, 10), (2, 3), "/", "c/", None), "c/3", False),  # a 3x4 grid: rows count
        (Record(3, (10, 5), (3, 2), "/", "c/", None), "c/3", True),  # a 4x3 grid
        (_v3(), "c/02", False),
        (_v3(), "c/0/0", False),
        (_v3(), "d", False),
        (_v3(), "0", False),
        (_v3(".", "c."), "c", False),  # no folders with "." keys
        (_v3("/", ""), "2", True),
        (_v3("/", ""), "3", False),
        (_v3("/", ""), "c", False),
        (_v3(), "journalx", False),
    ],
)
def test_folder(rec: Record, path: str, ours: bool) -> None:
    assert rec.folder(path) is ours


def test_grid_of_a_zero_chunk_is_one_per_element() -> None:
    rec = Record(3, (5, 7), (0, 0), "/", "c/", None)
    assert rec.grid() == (5, 7) and rec.owns("c/4/6") and not rec.owns("c/5/0")
    assert Record(3, (4, 6), (2, 3), "/", "c/", None).grid() == (2, 2)


def test_without_a_record_only_a_lock_and_a_torn_metadata_file_are_ours() -> None:
    found = Found(
        {"lock.json": 2, f"zarr.json.{HEX}.partial": 1, f".zarray.{HEX}.partial": 1,
         f"c/0/0.{HEX}.partial": 1, "inputs.json": 1},
        {"c"},
        ["link"],
    )  # fmt: skip
    assert classify(found, None) == (
        [f".zarray.{HEX}.partial", "lock.json", f"zarr.json.{HEX}.partial"],
        ["link", f"c/0/0.{HEX}.partial", "inputs.json", "c/"],
    )


def test_read_record_of_each_format(tmp_path: Path) -> None:
    v2 = tmp_path / "v2.zarr"
    zarr.create_array(str(v2), shape=(4, 6), chunks=(2, 3), dtype="f4", zarr_format=2,
                      attributes=OURS.attributes())  # fmt: skip
    found = owned.listing(str(v2), {})
    assert owned.read_record(str(v2), {}, found) == Record(2, (4, 6), (2, 3), ".", "", OURS)
    (v2 / ".zattrs").unlink()
    found = owned.listing(str(v2), {})
    assert owned.read_record(str(v2), {}, found) == Record(2, (4, 6), (2, 3), ".", "", None)
    (v2 / ".zarray").write_text("{torn")
    assert owned.read_record(str(v2), {}, owned.listing(str(v2), {})) is None
    out = _out(tmp_path)
    assert owned.read_record(str(out), {}, Found({}, set(), [])) is None
    (out / "zarr.json").write_text(json.dumps({"zarr_format": 3}))
    assert owned.read_record(str(out), {}, owned.listing(str(out), {})) is None


@pytest.mark.parametrize(
    ("names", "said"),
    [
        ([], ""),
        (["a"], "a"),
        (["a", "b", "c"], "a, b, c"),
        (["a", "b", "c", "d"], "a, b, c and 1 more"),
        (iter(["a", "b", "c", "d", "e"]), "a, b, c and 2 more"),
    ],
)
def test_describe(names: list[str], said: str) -> None:
    assert describe(names) == said


def test_an_unfinished_product_is_refused_as_an_input(tmp_path: Path) -> None:
    out = _out(tmp_path, attributes=OutRecord(complete=False).attributes())
    with pytest.raises(InputError) as refused:
        owned.check_finished(zarr.open_array(str(out)), "B", "b.zarr")
    assert str(refused.value) == (
        "B (b.zarr) is an unfinished product of this tool (some tiles are not written yet); "
        "finish it first with `multiply ... --resume` (or --overwrite), then use it"
    )
    for attributes in (OURS.attributes(), OutRecord().attributes(), {ATTRS_KEY: "no"}, {}):
        array = zarr.open_array(str(out), mode="r+")
        array.attrs.clear()
        array.attrs.update(attributes)
        owned.check_finished(zarr.open_array(str(out)), "B", "b.zarr")

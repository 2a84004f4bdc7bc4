"""What a local store reaches, links followed (no cluster): one file shared by OUT and an input
(a link or a second name at the file level, not only a linked folder) is refused before
anything is written; folders that hold no chunk keys are known by identity, never walked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import UnsafeOutputError
from pipeline.store import reach as reach_module
from pipeline.store.output import Output
from pipeline.store.reach import Reach, check_apart, chunk_folder, reach, shared


def _store(path: Path, chunks: dict[str, bytes]) -> Path:
    path.mkdir(parents=True)
    (path / "zarr.json").write_text("{}")
    for key, data in chunks.items():
        (path / key).parent.mkdir(parents=True, exist_ok=True)
        (path / key).write_bytes(data)
    return path


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_chunk_file_of_out_that_is_an_inputs_is_refused(tmp_path: Path, how: str) -> None:
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"precious"})
    b = _store(tmp_path / "b.zarr", {"c/0/0": b"other"})
    out = _store(tmp_path / "out.zarr", {})
    (out / "c" / "0").mkdir(parents=True)
    link = out / "c" / "0" / "0"
    if how == "symlink":
        link.symlink_to(a / "c" / "0" / "0")
    else:
        os.link(a / "c" / "0" / "0", link)
    with pytest.raises(UnsafeOutputError) as refused:
        Output(str(out)).check_path([str(b), str(a)])
    assert str(refused.value) == (
        f"OUT ({out}) and input B ({a}) reach the same folder or file (OUT's c/0/0 is B's "
        "c/0/0, through a link); inputs are never written: choose a OUT apart from every "
        "input, or remove the link"
    )
    assert (a / "c" / "0" / "0").read_bytes() == b"precious"


def test_an_input_whose_chunk_file_is_outs_is_refused(tmp_path: Path) -> None:
    out = _store(tmp_path / "out.zarr", {"0.0": b"ours"})
    a = _store(tmp_path / "a.zarr", {})
    (a / "0.1").symlink_to(out / "0.0")
    with pytest.raises(UnsafeOutputError, match=r"C's 0\.0 is A's 0\.1, through a link"):
        check_apart("C", str(out), [("A", str(a))])
    check_apart("C", f"s3://bucket/{out}", [("A", str(a))])  # object stores: no links
    check_apart("C", str(out), [("A", f"s3://bucket/{a}")])


def test_a_store_that_is_an_input_itself_is_named_as_its_top(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"x"})
    (tmp_path / "alias").symlink_to(a)
    with pytest.raises(UnsafeOutputError, match=r"OUT's \. is A's \., through a link"):
        check_apart("OUT", str(tmp_path / "alias"), [("A", str(a))])


def test_stores_apart_are_not_refused(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"x"})
    out = _store(tmp_path / "out.zarr", {"c/0/0": b"x"})
    check_apart("OUT", str(out), [("A", str(a)), ("B", str(tmp_path / "missing"))])
    assert shared(reach(str(out)), reach(str(a))) is None


def test_the_first_shared_path_is_named(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"x", "c/0/1": b"y"})
    out = _store(tmp_path / "out.zarr", {})
    (out / "c").mkdir()
    (out / "c" / "1").symlink_to(a / "c" / "0")  # shares c/0 and both its files
    assert shared(reach(str(out)), reach(str(a))) == ("c/1", "c/0")
    assert shared(reach(str(a)), reach(str(out))) == ("c/0", "c/1")


def test_a_missing_store_reaches_nothing(tmp_path: Path) -> None:
    assert reach(str(tmp_path / "missing")) == Reach()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert reach(str(tmp_path / "loop")) == Reach()


def test_a_store_that_is_one_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    st = os.stat(tmp_path / "f")
    found = reach(str(tmp_path / "f"))
    assert found.files == {"": f"3|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"}
    assert found.ids == {(st.st_dev, st.st_ino): ""}


def test_what_a_store_reaches(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"xy", "c/1/0": b"z", "0.0": b"w"})
    elsewhere = _store(tmp_path / "elsewhere", {"9": b"far"})
    (a / "c" / "2").symlink_to(elsewhere)  # a chunk folder on another disk: walked
    (a / "notes").symlink_to(elsewhere)  # no chunk keys there: known, not walked
    (a / "gone").symlink_to(tmp_path / "nowhere")  # dangling: reaches nothing
    os.mkfifo(a / "fifo")
    found = reach(str(a))
    assert set(found.files) == {"zarr.json", "c/0/0", "c/1/0", "0.0", "c/2/zarr.json", "c/2/9"}
    st = os.stat(a / "c" / "0" / "0")
    assert found.files["c/0/0"] == f"2|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
    assert sorted(found.links) == ["c/2", "gone", "notes"]
    assert found.special == ["fifo"]
    top, c, far = (os.stat(p) for p in (a, a / "c", elsewhere))
    assert found.ids[(top.st_dev, top.st_ino)] == ""
    assert found.ids[(c.st_dev, c.st_ino)] == "c"
    assert found.ids[(far.st_dev, far.st_ino)] in ("c/2", "notes")
    nine = os.stat(elsewhere / "9")
    assert found.ids[(nine.st_dev, nine.st_ino)] == "c/2/9"
    fifo = os.stat(a / "fifo")
    assert found.ids[(fifo.st_dev, fifo.st_ino)] == "fifo"


def test_a_chunk_folder_also_reached_by_another_name_is_walked(tmp_path: Path) -> None:
    # "notes" is met first (the top before c/) and is not walked; c/2 still must be
    elsewhere = _store(tmp_path / "elsewhere", {"0": b"precious"})
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"x"})
    (a / "notes").symlink_to(elsewhere)
    (a / "c" / "2").symlink_to(elsewhere)
    assert {"c/2/0", "c/2/zarr.json"} <= set(reach(str(a)).files)
    out = _store(tmp_path / "out.zarr", {})
    (out / "c" / "0").mkdir(parents=True)
    (out / "c" / "0" / "0").symlink_to(elsewhere / "0")
    with pytest.raises(UnsafeOutputError, match=r"OUT's c/0/0 is A's c/2/0, through a link"):
        Output(str(out)).check_path([str(a)])
    assert (elsewhere / "0").read_bytes() == b"precious"


def test_a_folder_reached_twice_is_walked_once(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"x"})
    (a / "c" / "1").symlink_to(a / "c" / "0")
    (a / "c" / "0" / "1").symlink_to(a / "c")  # a loop back up
    found = reach(str(a))
    folders = [p for p in found.files if p.endswith("/0") and p != "zarr.json"]
    assert len(folders) == 1 and folders[0] in ("c/0/0", "c/1/0")
    assert len(found.ids) == 5  # the top, zarr.json, c, c/0 (one folder, two names), c/0/0


@pytest.mark.parametrize(
    ("path", "walked"),
    [
        ("c", True),
        ("c/1", True),
        ("c/1/20", True),
        ("1", True),
        ("0/3", True),
        ("x", False),
        ("c/x", False),
        ("cc", False),
        ("1/c", False),
        ("c/", False),
        ("journal", False),
    ],
)
def test_chunk_folder(path: str, walked: bool) -> None:
    assert chunk_folder(path) is walked


def test_the_shortest_shared_path_is_named_not_the_first_made(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.zarr", {"0": b"x"})  # the file is made before its folder
    (a / "c" / "9").mkdir(parents=True)
    (a / "0").rename(a / "c" / "9" / "0")
    out = _store(tmp_path / "out.zarr", {})
    (out / "c").mkdir()
    (out / "c" / "1").symlink_to(a / "c" / "9")
    assert shared(reach(str(out)), reach(str(a))) == ("c/1", "c/9")


def _sorted_listings(monkeypatch: pytest.MonkeyPatch, refused: str) -> None:
    """Folders list in name order (the walk's order fixed) and ``refused`` cannot be listed."""
    scandir = os.scandir

    def listing(path: str) -> list[os.DirEntry[str]]:
        if path.endswith(refused):
            raise PermissionError(path)
        with scandir(path) as entries:
            return sorted(entries, key=lambda e: e.name)

    monkeypatch.setattr(reach_module.os, "scandir", listing)


def test_a_folder_that_cannot_be_listed_does_not_end_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _store(tmp_path / "a.zarr", {"1/0": b"x", "c/0/0": b"y"})
    _sorted_listings(monkeypatch, "/c")  # c is walked first (the last one found)
    assert set(reach(str(a)).files) == {"zarr.json", "1/0"}


def test_a_dangling_link_does_not_end_its_folders_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _store(tmp_path / "a.zarr", {"c/0/0": b"y"})
    (a / "a-gone").symlink_to(tmp_path / "nowhere")  # listed before c and zarr.json
    _sorted_listings(monkeypatch, "/never")
    found = reach(str(a))
    assert set(found.files) == {"zarr.json", "c/0/0"} and found.links == ["a-gone"]

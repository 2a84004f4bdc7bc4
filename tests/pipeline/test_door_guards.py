"""The door, operation by operation (no cluster): no read, write, rename or delete follows a
link or lands outside the folder, whatever stands at the name (a link to a file elsewhere, a
FIFO, a folder, a second name of a file); a folder swapped in at a pinned path is refused; each
refusal says what was found and where."""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.errors import UnsafeOutputError
from pipeline.store import door as door_module
from pipeline.store.door import (
    MAX_DEPTH,
    Door,
    Entry,
    create_folder,
    partial_name,
    pin,
    remove_empty_folders,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the folder, which nothing may read or change."""
    path = tmp_path / "victim"
    path.write_bytes(b"precious")
    return path


@pytest.fixture
def pinned() -> Iterator[list[str]]:
    """Folders this test pins, let go afterwards."""
    held: list[str] = []
    yield held
    for path in held:
        pin(path, None)


def _refusal(root: Path, where: str, problem: str, what: str = "OUT") -> str:
    return (
        f"{what} ({root}): {where} {problem}; this tool writes only into folders of its own, "
        f"never through links: remove it or choose another {what}"
    )


# -- reads -------------------------------------------------------------------------------------


def test_a_read_never_follows_a_link_to_a_file(root: Path, victim: Path) -> None:
    (root / "lock.json").symlink_to(victim)
    door = Door(str(root))
    for read in (
        lambda: door.read("lock.json"),
        lambda: door.read_head("lock.json", 4),
        lambda: door.read_range("lock.json", 0, None),
    ):
        with pytest.raises(UnsafeOutputError) as refused:
            read()
        assert str(refused.value) == _refusal(
            root, f"{root}/lock.json", "is a link, a folder or a special file"
        )
    assert victim.read_bytes() == b"precious"


def test_a_read_of_a_folder_or_a_fifo_is_refused_not_waited_on(root: Path) -> None:
    (root / "journal").mkdir()
    os.mkfifo(root / "fifo")
    door = Door(str(root), "C")
    with pytest.raises(UnsafeOutputError, match="journal is a folder, not a file; "):
        door.read("journal")
    with pytest.raises(UnsafeOutputError) as refused:
        door.read("fifo")
    assert str(refused.value) == _refusal(
        root, f"{root}/fifo", "is a special file, not a file", "C"
    )


def test_reads_are_bounded_to_the_limit(root: Path) -> None:
    (root / "j").write_bytes(b"x" * 100)
    door = Door(str(root))
    assert door.read("j", limit=100) == b"x" * 100
    with pytest.raises(UnsafeOutputError, match=r"j holds 100 bytes, more than 99;"):
        door.read("j", limit=99)
    (root / "big").write_bytes(b"y" * 2000)
    with pytest.raises(UnsafeOutputError, match=r"holds 2,000 bytes, more than 1,999"):
        door.read("big", limit=1999)
    assert door.read_range("big", 0, 3, limit=None) == b"yyy"


def test_the_default_limit_is_sixteen_mebibytes(root: Path) -> None:
    with open(root / "sparse", "wb") as f:
        f.truncate((16 << 20) + 1)
    with pytest.raises(UnsafeOutputError, match="more than 16,777,216"):
        Door(str(root)).read("sparse")


@pytest.mark.parametrize(
    ("start", "stop", "part"),
    [
        (0, None, b"0123456789"),
        (2, 5, b"234"),
        (-3, None, b"789"),
        (-20, None, b"0123456789"),  # more than it holds: from its start
        (-3, 8, b"7"),
        (8, 20, b"89"),  # past its end: to its end
        (12, None, b""),
        (5, 2, b""),
    ],
)
def test_read_range(root: Path, start: int, stop: int | None, part: bytes) -> None:
    (root / "f").write_bytes(b"0123456789")
    assert Door(str(root)).read_range("f", start, stop) == part


def test_read_head_and_what_is_not_there(root: Path) -> None:
    (root / "c").mkdir()
    (root / "c" / "f").write_bytes(b"abcdef")
    door = Door(str(root))
    assert door.read_head("c/f", 2) == b"ab"
    assert door.read_head("c/f", 100) == b"abcdef"
    assert door.read("c/missing") is None
    assert door.read("missing/f") is None


def test_a_short_read_is_continued_for_what_is_left(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "f").write_bytes(b"0123456789")
    pread = os.pread
    calls: list[tuple[int, int]] = []

    def short_once(fd: int, n: int, offset: int) -> bytes:
        calls.append((n, offset))
        return pread(fd, min(n, 3) if len(calls) == 1 else n, offset)

    monkeypatch.setattr(door_module.os, "pread", short_once)
    assert Door(str(root)).read_range("f", 0, 6) == b"012345"
    assert calls == [(6, 0), (3, 3)]


def test_a_file_shortened_while_read_gives_what_is_there(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "f").write_bytes(b"0123456789")
    pread = os.pread
    calls: list[int] = []

    def short(fd: int, n: int, offset: int) -> bytes:
        calls.append(offset)
        return pread(fd, min(n, 3), offset) if offset < 6 else b""

    monkeypatch.setattr(door_module.os, "pread", short)
    assert Door(str(root)).read("f") == b"012345"
    assert calls == [0, 3, 6]


# -- walking, and the root ---------------------------------------------------------------------


def test_a_link_or_a_file_on_the_way_is_refused_with_its_path(root: Path, victim: Path) -> None:
    (root / "c").symlink_to(victim.parent)
    (root / "f").write_bytes(b"x")
    door = Door(str(root))
    with pytest.raises(UnsafeOutputError) as refused:
        door.write("c/victim", b"x")
    assert str(refused.value) == _refusal(
        root, f"{root}/c", "passes through a symbolic link or a file"
    )
    with pytest.raises(UnsafeOutputError, match="f passes through a symbolic link or a file"):
        door.write("f/x", b"x")
    with pytest.raises(UnsafeOutputError, match="c/victim passes through a symbolic link"):
        door.lstat("c/victim/x")
    with pytest.raises(UnsafeOutputError, match="passes through a symbolic link"):
        door.make_folder("c/new")
    assert victim.read_bytes() == b"precious" and not (victim.parent / "new").exists()


def test_the_root_must_be_a_folder_not_a_link(root: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(root)
    (tmp_path / "file").write_bytes(b"x")
    for path in (tmp_path / "alias", tmp_path / "file"):
        with pytest.raises(UnsafeOutputError) as refused:
            Door(str(path)).read("x")
        assert str(refused.value) == _refusal(path, str(path), "is a symbolic link or not a folder")
    assert Door(str(tmp_path / "missing")).read("x") is None
    with pytest.raises(FileNotFoundError):
        Door(str(tmp_path / "missing")).write("x", b"x")
    assert Door(str(root) + "/").root == str(root) and Door("/").root == "/"


def test_folders_are_made_only_when_asked(root: Path) -> None:
    door = Door(str(root))
    with pytest.raises(FileNotFoundError), door.folder("a/b"):
        pass
    door.make_folder("a/b")
    door.make_folder("a/b")  # there already: fine
    assert (root / "a" / "b").is_dir()
    with door.folder("a//b/") as fd:
        assert os.path.samestat(os.fstat(fd), os.stat(root / "a" / "b"))
    assert door.identity() == (os.stat(root).st_dev, os.stat(root).st_ino)


@pytest.mark.parametrize("name", ["..", "a/../..", "./a", "a/./b", "../out/x"])
def test_a_path_that_leaves_the_folder_is_refused(root: Path, name: str) -> None:
    with pytest.raises(UnsafeOutputError, match=f"the path {re.escape(repr(name))} leaves"):
        Door(str(root)).make_folder(name)


@pytest.mark.parametrize("name", ["", "/", ".", "a/.", "a/.."])
def test_a_name_that_is_no_file_name_is_refused(root: Path, name: str) -> None:
    door = Door(str(root))
    with pytest.raises(UnsafeOutputError, match="not a file name"):
        door.write(name, b"x")
    assert os.listdir(root) == []


def test_a_trailing_slash_names_the_file(root: Path) -> None:
    Door(str(root)).write("a/b/", b"x")
    assert (root / "a" / "b").read_bytes() == b"x"


def test_a_folder_swapped_in_at_a_pinned_path_is_refused(
    root: Path, tmp_path: Path, pinned: list[str]
) -> None:
    (root / "c").mkdir()
    st = os.stat(root)
    pin(str(root) + "/", (st.st_dev, st.st_ino))
    pinned.append(str(root))
    Door(str(root / "c")).write("0", b"ours")  # walked from the pinned folder
    root.rename(tmp_path / "moved")
    root.mkdir()
    (root / "c").mkdir()
    for door in (Door(str(root)), Door(str(root / "c"))):
        with pytest.raises(UnsafeOutputError) as refused:
            door.write("x", b"x")
        words = f"is not the folder the job locked ({root} was replaced)"
        assert str(refused.value) == _refusal(Path(door.root), door.root, words)
    assert os.listdir(root / "c") == []
    pin(str(root), None)
    Door(str(root)).write("x", b"x")  # let go: the folder at the path now


def test_a_link_below_a_pinned_folder_is_refused(
    root: Path, victim: Path, pinned: list[str]
) -> None:
    (root / "c").symlink_to(victim.parent)
    st = os.stat(root)
    pin(str(root), (st.st_dev, st.st_ino))
    pinned.append(str(root))
    with pytest.raises(UnsafeOutputError) as refused:
        Door(str(root / "c")).write("victim", b"x")
    assert str(refused.value) == _refusal(
        root / "c", str(root / "c"), "passes through a symbolic link or a file"
    )
    assert victim.read_bytes() == b"precious"
    assert Door(str(root / "missing")).read("x") is None
    assert not (root / "missing").exists()  # walked to, never made


def test_the_nearest_pinned_folder_is_walked_from(root: Path, pinned: list[str]) -> None:
    inner = root / "c"
    inner.mkdir()
    top, near = os.stat(root), os.stat(inner)
    pin(str(root), (top.st_dev, top.st_ino))
    pin(str(inner), (near.st_dev, near.st_ino))
    pin(str(root) + "c", (0, 0))  # a sibling spelled with the same start: not above
    pinned.extend([str(root), str(inner), str(root) + "c"])
    inner.rename(root / "old")
    inner.mkdir()  # the same path, another folder: the nearer pin refuses it
    with pytest.raises(UnsafeOutputError, match=f"{re.escape(str(inner))} was replaced"):
        Door(str(inner)).write("x", b"x")
    Door(str(root)).write("x", b"x")


def test_walk_reports_every_kind_without_following(root: Path, victim: Path) -> None:
    (root / "c" / "0").mkdir(parents=True)
    (root / "c" / "0" / "1").write_bytes(b"abc")
    (root / "link").symlink_to(victim.parent)
    os.mkfifo(root / "fifo")
    found = {e.path: e for e in Door(str(root)).walk()}
    assert {p: e.kind for p, e in found.items()} == {
        "c": "dir", "c/0": "dir", "c/0/1": "file", "link": "link", "fifo": "other",
    }  # fmt: skip
    st = os.lstat(root / "c" / "0" / "1")
    assert found["c/0/1"] == Entry("c/0/1", "file", 3, st.st_dev, st.st_ino)
    assert [e.path for e in Door(str(root)).walk("c")] == ["c/0", "c/0/1"]


def test_a_tree_deeper_than_ours_is_reported_not_walked(root: Path) -> None:
    deep = root
    for _ in range(MAX_DEPTH + 2):
        deep = deep / "d"
        deep.mkdir()
    kinds = [e.kind for e in Door(str(root)).walk()]
    assert kinds == ["dir"] * MAX_DEPTH + ["other"]


def test_a_folder_swapped_during_a_walk_is_not_walked(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "c").mkdir()
    (root / "c" / "0").write_bytes(b"x")
    fstat = os.fstat
    other = os.stat(root)
    monkeypatch.setattr(
        door_module.os, "fstat", lambda fd: other if stat.S_ISDIR(fstat(fd).st_mode) else fstat(fd)
    )
    assert [e.path for e in door_module._walk(os.open(root, os.O_RDONLY), "")] == ["c"]


# -- writes ------------------------------------------------------------------------------------


def test_write_replaces_whole_and_leaves_no_temporary_file(root: Path) -> None:
    door = Door(str(root))
    door.write("c/0/1", b"one")
    door.write("c/0/1", memoryview(b"two!").cast("B")[:3])
    assert (root / "c" / "0" / "1").read_bytes() == b"two"
    door.write("c/0/1", b"")
    assert (root / "c" / "0" / "1").read_bytes() == b""
    assert os.listdir(root / "c" / "0") == ["1"]


def test_an_exclusive_write_refuses_anything_there(root: Path, victim: Path) -> None:
    door = Door(str(root))
    door.write("a", b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        door.write("a", b"second", exclusive=True)
    (root / "link").symlink_to(victim)
    with pytest.raises(FileExistsError):
        door.write("link", b"x", exclusive=True)
    assert (root / "a").read_bytes() == b"first" and victim.read_bytes() == b"precious"
    assert sorted(os.listdir(root)) == ["a", "link"]


@pytest.mark.parametrize(("kind", "words"), [("folder", "a folder"), ("fifo", "a special file")])
def test_a_write_never_replaces_a_folder_or_a_special_file(
    root: Path, kind: str, words: str
) -> None:
    target = root / "zarr.json"
    target.mkdir() if kind == "folder" else os.mkfifo(target)
    with pytest.raises(UnsafeOutputError) as refused:
        Door(str(root)).write("zarr.json", b"{}")
    assert str(refused.value) == _refusal(root, f"{target}", f"is {words}, not a file of ours")
    assert sorted(os.listdir(root)) == ["zarr.json"]  # the temporary file removed


def test_a_write_through_a_planted_link_leaves_the_target(root: Path, victim: Path) -> None:
    (root / "lock.json").symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match="lock.json is a symbolic link, not a file of ours"):
        Door(str(root)).write("lock.json", b"{}")
    assert victim.read_bytes() == b"precious" and (root / "lock.json").is_symlink()


def test_a_failed_fill_leaves_nothing(root: Path) -> None:
    def fail(fd: int) -> None:
        os.write(fd, b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        Door(str(root)).write_with("c/x", fail)
    assert os.listdir(root / "c") == []


def test_write_with_says_false_when_the_flags_are_refused(root: Path) -> None:
    def einval(fd: int) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    door = Door(str(root))
    assert door.write_with("x", einval) is False
    with pytest.raises(OSError, match="I/O error"):
        door.write_with("x", eio)
    assert os.listdir(root) == []
    assert door.write_with("x", lambda fd: os.write(fd, b"ok") and None) is True
    assert (root / "x").read_bytes() == b"ok"
    assert door.write_with("y", lambda fd: None, flags=os.O_APPEND) is True


def test_short_writes_are_continued(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write = os.write
    monkeypatch.setattr(door_module.os, "write", lambda fd, data: write(fd, bytes(data[:2])))
    Door(str(root)).write("f", b"abcdefg")
    monkeypatch.undo()
    assert (root / "f").read_bytes() == b"abcdefg"


def test_create_is_exclusive_and_returns_the_open_file(root: Path, victim: Path) -> None:
    door = Door(str(root))
    fd = door.create("c/lock.json", b"{}")
    try:
        assert os.pread(fd, 10, 0) == b"{}"
        os.write(fd, b"[]")  # read-write, at its start
        assert os.pread(fd, 10, 0) == b"[]"
    finally:
        os.close(fd)
    os.close(door.create("empty", b""))
    assert (root / "empty").read_bytes() == b""
    assert stat.S_IMODE(os.stat(root / "empty").st_mode) & 0o133 == 0  # no one else writes
    with pytest.raises(FileExistsError):
        door.create("c/lock.json", b"{}")
    (root / "link").symlink_to(victim)
    with pytest.raises(FileExistsError):
        door.create("link", b"x")
    assert victim.read_bytes() == b"precious"


def test_open_existing_takes_only_a_file_with_one_name(root: Path, victim: Path) -> None:
    door = Door(str(root))
    (root / "lock.json").write_bytes(b"{}")
    fd = door.open_existing("lock.json")
    try:
        os.pwrite(fd, b"[]", 0)
    finally:
        os.close(fd)
    assert (root / "lock.json").read_bytes() == b"[]"
    os.link(root / "lock.json", root / "second")
    with pytest.raises(UnsafeOutputError, match="is not a regular file with one name"):
        door.open_existing("lock.json")
    (root / "link").symlink_to(victim)
    (root / "folder").mkdir()
    os.mkfifo(root / "fifo")
    for name, words in (
        ("link", "is a link, a folder or a special file"),
        ("folder", "is a link, a folder or a special file"),
        ("fifo", "is not a regular file with one name (a hard link?)"),
    ):
        with pytest.raises(UnsafeOutputError) as refused:
            door.open_existing(name)
        assert str(refused.value) == _refusal(root, f"{root}/{name}", words)
    with pytest.raises(FileNotFoundError):
        door.open_existing("missing")
    assert victim.read_bytes() == b"precious"


# -- removals and renames ----------------------------------------------------------------------


def test_remove_takes_a_link_never_its_target(root: Path, victim: Path) -> None:
    door = Door(str(root))
    (root / "link").symlink_to(victim)
    (root / "f").write_bytes(b"x")
    (root / "d").mkdir()
    assert door.remove("link") is True and door.remove("f") is True
    assert door.remove("f") is False and door.remove("missing/f") is False
    with pytest.raises(UnsafeOutputError, match="d is a folder where a file of ours was expected"):
        door.remove("d")
    assert victim.read_bytes() == b"precious" and sorted(os.listdir(root)) == ["d"]


def test_remove_if_same_removes_only_that_file(root: Path) -> None:
    door = Door(str(root))
    (root / "lock.json").write_bytes(b"mine")
    (root / "other").write_bytes(b"theirs")
    fd = os.open(root / "lock.json", os.O_RDONLY)
    try:
        (root / "lock.json").rename(root / "kept")
        (root / "other").rename(root / "lock.json")  # another's file at the name now
        assert door.remove_if_same("lock.json", fd) is False
        assert (root / "lock.json").read_bytes() == b"theirs"
        (root / "lock.json").rename(root / "other")
        (root / "kept").rename(root / "lock.json")
        assert door.remove_if_same("lock.json", fd) is True
        assert door.remove_if_same("lock.json", fd) is False
    finally:
        os.close(fd)
    assert sorted(os.listdir(root)) == ["other"]


def test_rmdir(root: Path) -> None:
    door = Door(str(root))
    (root / "empty").mkdir()
    (root / "full").mkdir()
    (root / "full" / "f").write_bytes(b"x")
    (root / "file").write_bytes(b"x")
    assert door.rmdir("empty") is True and door.rmdir("empty") is False
    assert door.rmdir("full") is False and (root / "full" / "f").exists()
    with pytest.raises(UnsafeOutputError, match="file is not a folder"):
        door.rmdir("file")


def test_rename_moves_a_file_of_ours_only(root: Path, victim: Path) -> None:
    door = Door(str(root))
    (root / "a").write_bytes(b"x")
    assert door.rename("a", "journal/b") is True
    assert (root / "journal" / "b").read_bytes() == b"x" and not (root / "a").exists()
    assert door.rename("a", "c") is False
    (root / "t").write_bytes(b"there")
    with pytest.raises(FileExistsError):
        door.rename("journal/b", "t")
    (root / "link").symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match="link is a symbolic link, not a file"):
        door.rename("link", "moved")
    assert victim.read_bytes() == b"precious" and not (root / "moved").exists()


def test_remove_tree_removes_links_as_links(root: Path, victim: Path) -> None:
    (root / "s" / "journal").mkdir(parents=True)
    (root / "s" / "journal" / "a").write_bytes(b"x")
    (root / "s" / "b").write_bytes(b"x")
    (root / "s" / "empty").mkdir()
    (root / "s" / "link").symlink_to(victim)
    (root / "keep").write_bytes(b"x")
    (root / "empty-elsewhere").mkdir()
    assert Door(str(root)).remove_tree("s") == 3
    assert sorted(os.listdir(root)) == ["empty-elsewhere", "keep"]  # only s's folders go
    assert victim.read_bytes() == b"precious"


def test_remove_empty_below_keeps_what_holds_anything(root: Path) -> None:
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"x")
    Door(str(root)).remove_empty_below()
    assert sorted(os.listdir(root)) == ["d"] and os.listdir(root / "d") == ["f"]
    (root / "g" / "h").mkdir(parents=True)
    Door(str(root)).remove_empty_below("g")
    assert (root / "g").is_dir() and os.listdir(root / "g") == []


def test_lstat_exists_and_same_file(root: Path, victim: Path) -> None:
    door = Door(str(root))
    (root / "link").symlink_to(victim)
    (root / "a").write_bytes(b"x")
    os.link(root / "a", root / "b")
    (root / "c").write_bytes(b"x")
    (root / "d").mkdir()
    found = door.lstat("link")
    assert found is not None and stat.S_ISLNK(found.st_mode)
    assert door.lstat("missing") is None and door.exists("link") and not door.exists("x")
    assert door.same_file("a", "b") is True and door.same_file("a", "c") is False
    assert door.same_file("d", "d") is False  # a folder is no file
    with pytest.raises(FileNotFoundError, match="missing"):
        door.same_file("a", "missing")
    with pytest.raises(FileNotFoundError, match="gone"):
        door.same_file("gone", "a")


def test_partial_name_is_zarrs_spelling() -> None:
    assert re.fullmatch(r"c/0/1\.[0-9a-f]{32}\.partial", partial_name("c/0/1"))
    assert partial_name("x") != partial_name("x")


# -- the folder OUT is made in -----------------------------------------------------------------


def test_create_folder_makes_the_missing_ones_outermost_first(tmp_path: Path) -> None:
    made = create_folder(str(tmp_path / "a" / "b" / "c"))
    assert [m.path for m in made] == [str(tmp_path / p) for p in ("a", "a/b", "a/b/c")]
    assert create_folder(str(tmp_path / "a" / "b" / "c")) == []
    (tmp_path / "a" / "b" / "c" / "f").write_bytes(b"x")
    remove_empty_folders(made)  # c holds a file: it stays, and so do its parents
    assert (tmp_path / "a" / "b" / "c" / "f").exists()
    (tmp_path / "a" / "b" / "c" / "f").unlink()
    (tmp_path / "a" / "keep").write_bytes(b"x")
    remove_empty_folders(made)
    assert os.listdir(tmp_path / "a") == ["keep"]


def test_create_folder_refuses_a_link_planted_for_a_missing_one(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mkdir = os.mkdir

    def planted_first(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if name == "a":  # as if the link appeared after the folder was found missing
            os.symlink(victim.parent, tmp_path / "a")
        mkdir(name, mode, dir_fd=dir_fd)

    monkeypatch.setattr(door_module.os, "mkdir", planted_first)
    with pytest.raises(UnsafeOutputError) as refused:
        create_folder(str(tmp_path / "a" / "b"))
    assert str(refused.value) == f"{tmp_path / 'a'} is a symbolic link or a file, not a folder"
    assert not (victim.parent / "b").exists()


def test_create_folder_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        create_folder(str(tmp_path / "f" / "out"))


def test_a_durable_write_syncs_the_file_then_its_folder(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    fsync = os.fsync
    names = {os.stat(root).st_ino: "root"}

    def record(fd: int) -> None:
        st = os.fstat(fd)
        synced.append(names.get(st.st_ino, "folder") if stat.S_ISDIR(st.st_mode) else "file")
        fsync(fd)

    monkeypatch.setattr(door_module.os, "fsync", record)
    door = Door(str(root))
    door.write("journal/state.json", b"{}", durable=True)
    assert synced == ["file", "folder"]
    door.write("journal/state.json", b"[]")
    assert synced == ["file", "folder"]  # not asked: not synced
    assert (root / "journal" / "state.json").read_bytes() == b"[]"
    door.sync_folder()
    assert synced[-1] == "root"
    door.write("top", b"x", durable=True)
    assert synced[-2:] == ["file", "root"]


def test_rename_with_replace_replaces_only_a_file(root: Path, victim: Path) -> None:
    door = Door(str(root))
    (root / "new").write_bytes(b"new")
    (root / "old").write_bytes(b"old")
    assert door.rename("new", "old", replace=True) is True
    assert (root / "old").read_bytes() == b"new" and not (root / "new").exists()
    assert door.rename("new", "old", replace=True) is False
    (root / "new").write_bytes(b"new")
    assert door.rename("new", "journal/fresh", replace=True) is True  # nothing there: moved
    assert (root / "journal" / "fresh").read_bytes() == b"new"
    (root / "link").symlink_to(victim)
    (root / "folder").mkdir()
    for target, words in (("link", "a symbolic link"), ("folder", "a folder")):
        with pytest.raises(UnsafeOutputError, match=f"{target} is {words}, not a file of ours"):
            door.rename("old", target, replace=True)
    assert victim.read_bytes() == b"precious" and (root / "old").read_bytes() == b"new"


def test_a_pin_on_the_file_system_root(pinned: list[str]) -> None:
    pin("//", (0, 0))  # no folder has this identity
    pinned.append("/")
    with pytest.raises(UnsafeOutputError, match=r"\(/ was replaced\)"):
        Door("/").identity()
    pin("/", None)
    assert Door("/").identity() == (os.stat("/").st_dev, os.stat("/").st_ino)


def test_what_the_door_makes_has_the_usual_modes(root: Path) -> None:
    umask = os.umask(0o022)
    try:
        door = Door(str(root))
        door.make_folder("a/b")
        door.write("a/f", b"x")
        made = create_folder(str(root / "c" / "d"))
    finally:
        os.umask(umask)
    assert [m.path for m in made] == [str(root / "c"), str(root / "c" / "d")]
    for folder in ("a", "a/b", "c", "c/d"):
        assert stat.S_IMODE(os.stat(root / folder).st_mode) == 0o755, folder
    assert stat.S_IMODE(os.stat(root / "a" / "f").st_mode) == 0o644


def test_a_socket_is_refused_as_a_special_file(root: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "sock"))
        door = Door(str(root))
        for act in (lambda: door.read("sock"), lambda: door.open_existing("sock")):
            with pytest.raises(UnsafeOutputError, match="sock is a link, a folder or a special"):
                act()


def test_a_link_to_a_folder_is_removed_as_a_link(root: Path, victim: Path) -> None:
    (root / "link").symlink_to(victim.parent)
    assert Door(str(root)).remove("link") is True
    assert not (root / "link").exists() and victim.read_bytes() == b"precious"


def test_remove_if_same_never_takes_a_link_to_that_file(root: Path) -> None:
    (root / "lock.json").write_bytes(b"mine")
    (root / "alias").symlink_to(root / "lock.json")
    fd = os.open(root / "lock.json", os.O_RDONLY)
    try:
        assert Door(str(root)).remove_if_same("alias", fd) is False
    finally:
        os.close(fd)
    assert (root / "alias").is_symlink() and (root / "lock.json").exists()


def test_remove_if_same_in_a_folder(root: Path) -> None:
    (root / "c").mkdir()
    (root / "c" / "lock.json").write_bytes(b"mine")
    (root / "lock.json").write_bytes(b"another at the top")
    fd = os.open(root / "c" / "lock.json", os.O_RDONLY)
    try:
        assert Door(str(root)).remove_if_same("c/lock.json", fd) is True
    finally:
        os.close(fd)
    assert os.listdir(root / "c") == [] and (root / "lock.json").exists()


def test_open_existing_in_a_folder(root: Path) -> None:
    door = Door(str(root))
    (root / "lock.json").write_bytes(b"another at the top")
    os.close(door.create("c/lock.json", b"{}"))
    opened = door.open_existing("c/lock.json")
    try:
        assert os.path.samestat(os.fstat(opened), os.stat(root / "c" / "lock.json"))
    finally:
        os.close(opened)


def test_a_pin_of_a_folder_whose_name_ends_in_any_character(
    tmp_path: Path, pinned: list[str]
) -> None:
    folder = tmp_path / "outX"  # a strip of more than "/" would take the X
    folder.mkdir()
    pin(str(folder), (0, 0))
    pinned.append(str(folder))
    with pytest.raises(UnsafeOutputError, match="was replaced"):
        Door(str(folder)).write("x", b"x")


def test_a_failed_first_write_of_a_created_file_says_why(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(door_module.os, "pwrite", full)
    with pytest.raises(OSError, match="No space left"):
        Door(str(root)).create("lock.json", b"{}")


def test_a_source_swapped_for_a_link_before_a_rename_moves_the_link(
    root: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "a").write_bytes(b"ours")
    stat_ = os.stat

    def swap_after(path: str, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> object:
        found = stat_(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if path == "a" and (root / "a").is_file() and not (root / "a").is_symlink():
            (root / "a").unlink()
            (root / "a").symlink_to(victim)  # swapped in after the check
        return found

    monkeypatch.setattr(door_module.os, "stat", swap_after)
    Door(str(root)).rename("a", "b")
    assert (root / "b").is_symlink() and os.stat(victim).st_nlink == 1  # no second name of it


def test_a_temporary_file_swapped_for_a_link_is_placed_as_the_link(
    root: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_all = door_module._write_all

    def swap_after(fd: int, view: memoryview) -> None:
        write_all(fd, view)
        [tmp] = [p for p in root.iterdir() if p.name.endswith(".partial")]
        tmp.unlink()
        tmp.symlink_to(victim)  # swapped in before it is linked into place

    monkeypatch.setattr(door_module, "_write_all", swap_after)
    Door(str(root)).write("lock.json", b"{}", exclusive=True)
    assert (root / "lock.json").is_symlink() and os.stat(victim).st_nlink == 1
    assert victim.read_bytes() == b"precious"


def test_a_folder_that_cannot_be_opened_does_not_end_the_walk(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "a").mkdir()
    (root / "b").write_bytes(b"x")
    scandir, open_ = os.scandir, os.open

    class Listing(list[os.DirEntry[str]]):
        def __enter__(self) -> Listing:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def in_order(fd: int) -> Listing:
        with scandir(fd) as entries:
            return Listing(sorted(entries, key=lambda e: e.name))

    def refuse_a(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if path == "a":
            raise PermissionError(path)
        return open_(path, flags, *args, **kwargs)

    monkeypatch.setattr(door_module.os, "scandir", in_order)
    monkeypatch.setattr(door_module.os, "open", refuse_a)
    assert [e.path for e in door_module._walk(open_(root, os.O_RDONLY), "")] == ["a", "b"]


def test_a_folder_made_by_another_meanwhile_is_taken(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mkdir = os.mkdir

    def beaten(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        mkdir(path, mode, dir_fd=dir_fd)  # another job made it first
        mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(door_module.os, "mkdir", beaten)
    Door(str(root)).write("c/0", b"x")
    assert (root / "c" / "0").read_bytes() == b"x"


def test_the_temporary_file_is_named_after_the_file_with_the_flags_asked(root: Path) -> None:
    import fcntl

    seen: list[tuple[list[str], int]] = []

    def fill(fd: int) -> None:
        seen.append((os.listdir(root / "c"), fcntl.fcntl(fd, fcntl.F_GETFL)))

    assert Door(str(root)).write_with("c/0", fill, flags=os.O_APPEND)
    [(names, flags)] = seen
    assert len(names) == 1 and re.fullmatch(r"0\.[0-9a-f]{32}\.partial", names[0]), names
    assert flags & os.O_APPEND  # a killed write leaves a name an array of ours owns


def test_a_link_planted_at_the_temporary_name_is_never_written_through(
    root: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(door_module, "partial_name", lambda name: f"{name}.guessed.partial")
    (root / "lock.json.guessed.partial").symlink_to(victim)
    with pytest.raises(FileExistsError):
        Door(str(root)).write("lock.json", b"{}")
    assert victim.read_bytes() == b"precious"


def test_a_failed_fill_says_why_even_when_its_file_is_gone(root: Path) -> None:
    def fail(fd: int) -> None:
        for name in os.listdir(root):
            os.unlink(root / name)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        Door(str(root)).write_with("x", fail)


def test_a_name_ending_in_any_character_is_written_as_given(root: Path) -> None:
    Door(str(root)).write("c/0X", b"x")  # a strip of more than "/" would take the X
    assert os.listdir(root / "c") == ["0X"]

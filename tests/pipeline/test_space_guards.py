"""OUT's room, unit by unit (no cluster): the free space a user may write as ``df`` reports it
(reserved blocks are not ours), what OUT already holds counted only when it is ours to replace
and links never followed, and the refusal's and the dry run's words."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import UsageError
from pipeline.store import space
from pipeline.store.space import Room, check_room, describe_room, room_for

KiB = 1024


def _statvfs(monkeypatch: pytest.MonkeyPatch, bfree: int, bavail: int, frsize: int = 4096) -> None:
    """The file system has ``bfree`` free blocks, of which ``bavail`` an unprivileged user
    may take (the rest reserved for root), each ``frsize`` bytes."""
    result = os.statvfs_result((frsize, frsize, 10 * bfree, bfree, bavail, 100, 50, 50, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: result)


def test_free_space_is_what_a_user_may_write_not_the_reserved_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _statvfs(monkeypatch, bfree=100, bavail=10)  # 400 KiB free, 40 KiB of it for users
    room = room_for(str(tmp_path / "c.zarr"), 100 * KiB, False)
    assert room.free == 40 * KiB
    assert room.short == 60 * KiB
    with pytest.raises(UsageError, match=r"has 40\.0 KiB free"):
        check_room(room, "OUT", "c.zarr", (10, 10), "float32")


def test_a_folder_that_is_not_there_is_asked_at_its_nearest_parent(tmp_path: Path) -> None:
    room = room_for(str(tmp_path / "a" / "b" / "c.zarr"), 1, False)
    assert room.where == str(tmp_path) and room.free is not None and room.free > 0
    (tmp_path / "file").write_text("x")  # a file is no folder: its parent is asked
    assert room_for(str(tmp_path / "file" / "c.zarr"), 1, False).where == str(tmp_path)
    assert room_for(f"file://{tmp_path}/c.zarr", 1, False).where == str(tmp_path)
    assert space._nearest_folder("/tilegemm-nowhere-at-all/x") == "/"


def test_a_relative_out_is_asked_where_it_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert room_for("deep/c.zarr", 1, False).where == str(tmp_path)


def test_a_file_system_that_cannot_be_asked_is_not_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: str) -> None:
        raise PermissionError(path)

    monkeypatch.setattr(space.shutil, "disk_usage", refuse)
    room = room_for(str(tmp_path / "c.zarr"), 10**15, False)
    assert room == Room(10**15, False, None, str(tmp_path))
    assert room.short == 0
    check_room(room, "OUT", "c.zarr", (1, 1), "float32")  # not refused


def test_a_url_is_not_asked() -> None:
    room = room_for("s3://bucket/c.zarr", 10**15, False, existing=True)
    assert room == Room(10**15, False, None, "s3://bucket/c.zarr")


def _out(tmp_path: Path) -> tuple[Path, int]:
    """An OUT holding two files (one in a subfolder), and their bytes on disk."""
    out = tmp_path / "c.zarr"
    (out / "c" / "0").mkdir(parents=True)
    (out / "zarr.json").write_bytes(b"x" * 5000)
    (out / "c" / "0" / "0").write_bytes(b"y" * 9000)
    on_disk = sum(os.lstat(p).st_blocks * 512 for p in (out / "zarr.json", out / "c/0/0"))
    return out, on_disk


def test_what_out_holds_counts_only_when_it_is_replaced_and_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, on_disk = _out(tmp_path)
    assert on_disk >= 14000
    _statvfs(monkeypatch, bfree=1, bavail=1)  # 4 KiB
    room = room_for(str(out), on_disk, False, existing=True)
    assert room.held == on_disk and room.free == 4 * KiB
    assert room.short == 0  # the files it holds are freed first
    assert room_for(str(out), on_disk, False).held == 0  # a new OUT: nothing of ours there
    assert room_for(str(out), 4 * KiB, False, existing=True).held == 0  # fits: not walked
    assert room_for(str(out), 4 * KiB + 1, False, existing=True).held == on_disk


def test_links_inside_out_are_never_counted(tmp_path: Path) -> None:
    out, on_disk = _out(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "big").write_bytes(b"z" * 100_000)
    (out / "linked-folder").symlink_to(elsewhere)
    (out / "linked-file").symlink_to(elsewhere / "big")
    os.mkfifo(out / "fifo")
    assert space._folder_bytes(str(out)) == on_disk
    assert space._folder_bytes(str(tmp_path / "missing")) == 0


def test_an_unreadable_folder_inside_out_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, on_disk = _out(tmp_path)
    (out / "d").mkdir()
    (out / "d" / "f").write_bytes(b"z" * 3000)
    scandir = os.scandir

    class Listing(list[os.DirEntry[str]]):
        def __enter__(self) -> Listing:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def refuse_c(path: str) -> Listing:
        if path.endswith("/c"):
            raise PermissionError(path)
        with scandir(path) as entries:  # c after d: walked (and refused) first
            return Listing(sorted(entries, key=lambda e: e.name, reverse=True))

    monkeypatch.setattr(space.os, "scandir", refuse_c)
    counted = space._folder_bytes(str(out))
    assert counted == sum(os.lstat(out / p).st_blocks * 512 for p in ("zarr.json", "d/f"))


@pytest.mark.parametrize(
    ("room", "short"),
    [
        (Room(100, False, 30, "/x"), 70),  # plain shortfall
        (Room(100, False, 30, "/x", held=20), 50),  # what OUT holds is freed first
        (Room(100, False, 130, "/x"), 0),  # fits
        (Room(100, False, 100, "/x"), 0),  # fits exactly
        (Room(100, False, 99, "/x"), 1),  # one byte short
        (Room(100, True, 30, "/x"), 0),  # compressed: can't be told
        (Room(100, False, None, "/x"), 0),  # free space not known
    ],
)
def test_short(room: Room, short: int) -> None:
    assert room.short == short


def test_the_refusal_names_both_sizes_and_the_fix() -> None:
    room = Room(36 * KiB, False, 10 * KiB, "/data")
    with pytest.raises(UsageError) as refused:
        check_room(room, "C", "c.zarr", (192, 48), "float32")
    assert str(refused.value) == (
        "C (c.zarr) needs 36.0 KiB (192x48 float32, uncompressed) but its file system has "
        "10.0 KiB free (/data); free 26.0 KiB there, or write C to a file system with room"
    )
    held = Room(36 * KiB, False, 10 * KiB, "/data", held=6 * KiB)
    with pytest.raises(UsageError, match=r"free \(/data\), after the 6\.0 KiB it holds now; "):
        check_room(held, "OUT", "c.zarr", (96, 96), "float32")
    with pytest.raises(UsageError, match=r"has 0 B free \(/data\); free 36\.0 KiB there"):
        check_room(Room(36 * KiB, False, 0, "/data"), "OUT", "c.zarr", (96, 96), "float32")
    check_room(Room(36 * KiB, False, 36 * KiB, "/data"), "OUT", "c.zarr", (96, 96), "float32")


@pytest.mark.parametrize(
    ("room", "line"),
    [
        (
            Room(2 * KiB, False, None, "s3://b/c"),
            "2.0 KiB (uncompressed); free space not known at s3://b/c",
        ),
        (
            Room(2 * KiB, True, None, "s3://b/c"),
            "at most 2.0 KiB (compressed chunks); free space not known at s3://b/c",
        ),
        (Room(2 * KiB, False, 3 * KiB, "/d"), "2.0 KiB (uncompressed); 3.0 KiB free at /d"),
        (
            Room(4 * KiB, False, 3 * KiB, "/d"),
            "4.0 KiB (uncompressed); 3.0 KiB free at /d: does not fit, 1.0 KiB short "
            "(a real run is refused)",
        ),
        (
            Room(4 * KiB, False, 3 * KiB, "/d", held=1 * KiB),
            "4.0 KiB (uncompressed); 3.0 KiB free at /d (OUT holds 1.0 KiB already)",
        ),
        (
            Room(4 * KiB, True, 3 * KiB, "/d"),
            "at most 4.0 KiB (compressed chunks); 3.0 KiB free at /d: "
            "fits only if its chunks compress",
        ),
        (
            Room(4 * KiB, True, 3 * KiB, "/d", held=1 * KiB),
            "at most 4.0 KiB (compressed chunks); 3.0 KiB free at /d (OUT holds 1.0 KiB already)",
        ),
        (
            Room(4 * KiB, True, 4 * KiB, "/d"),
            "at most 4.0 KiB (compressed chunks); 4.0 KiB free at /d",
        ),
    ],
)
def test_the_dry_run_line(room: Room, line: str) -> None:
    assert describe_room(room) == line

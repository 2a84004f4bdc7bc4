"""The one door for writes: every write inside a local OUT or C goes through
pipeline/store/door.py, which walks paths from an open folder and never follows a link; no
other module calls a file system primitive that writes."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from pipeline.errors import UnsafeOutputError
from pipeline.store.door import Door
from tests.helpers import REPO

WRITERS = {
    "os": {"open", "replace", "rename", "renames", "unlink", "remove", "rmdir", "removedirs",
           "mkdir", "makedirs", "link", "symlink", "truncate", "ftruncate", "chmod", "utime"},
    "shutil": {"rmtree", "move", "copy", "copy2", "copyfile", "copytree"},
}  # fmt: skip
"""Module functions that create, change or delete files."""
METHODS = {"pipe_file", "rm_file", "rm", "mv", "write_bytes", "write_text", "unlink", "mkdir",
           "touch", "rmdir", "makedirs"}  # fmt: skip
"""Methods (fsspec's, pathlib's) that do the same."""
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"}
ALLOWED = {
    # The door itself, and the folder OUT is created in (by name, exclusively) and removed
    # from again when a job leaves it empty.
    "pipeline/store/door.py": None,
    # Object stores (no links there): fsspec's puts and deletes, by the owners of OUT's files.
    "pipeline/store/fs.py": {"pipe_file"},
    "pipeline/store/owned.py": {"rm"},
    "pipeline/store/decomposition.py": {"rm"},  # a decomposition's own arrays in a bucket
    "pipeline/store/journal.py": {"rm_file"},
    "pipeline/accumulate/originals.py": {"rm_file", "makedirs", "mv"},
    "pipeline/store/lock.py": {"pipe_file", "rm_file", "ftruncate"},  # fd: from the door
    # Outside any array: the user's cache folder, kernels' PTX folder, the report's temp copy.
    "pipeline/facts/host.py": None,
    "kernels/device/figures.py": None,
    "kernels/inspect/machine_code.py": None,
    "pipeline/store/report_file.py": {"write"},
    # The private temporary copies of arrays in memory (a 0700 folder of this user's in a
    # folder no one else can rename in): a killed process's removed by shutil's link-safe rmtree.
    "pipeline/store/in_memory.py": {"rmtree"},
    # The crash schedule's hit counter (a file the test harness names), and /dev/null for a
    # stdout whose reader went away.
    "pipeline/accumulate/crash.py": {"open"},
    "pipeline/cli/stdout.py": {"open"},
}
"""Modules allowed a writing call, and which (None: any); each comment says why."""


def writing_calls(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every call in ``path`` to a writing primitive."""
    found = []
    tree = ast.parse(path.read_text())
    constants = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        if _is_door(owner):
            continue
        module = owner.id if isinstance(owner, ast.Name) else None
        if module == "os" and name == "open" and _read_only(node, constants):
            continue
        if (module in WRITERS and name in WRITERS[module]) or (
            module not in WRITERS and name in METHODS
        ):
            found.append((node.lineno, name))
    return found


def _read_only(call: ast.Call, constants: dict[str, ast.expr]) -> bool:
    """An ``os.open`` whose flags (or the module constant they name) name O_RDONLY and none
    that writes."""
    if len(call.args) < 2:
        return False
    flags = call.args[1]
    if isinstance(flags, ast.Name) and flags.id in constants:
        flags = constants[flags.id]
    names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
             for n in ast.walk(flags)}  # fmt: skip
    return "O_RDONLY" in names and not names & WRITE_FLAGS


def _is_door(owner: ast.expr) -> bool:
    """A call on a door: ``door.x(...)``, ``self.door.x(...)``, ``Door(...).x(...)``."""
    if isinstance(owner, ast.Call):
        owner = owner.func
    name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    return name in ("door", "Door", "_door")


def test_only_the_door_writes() -> None:
    offenders = []
    for package in ("pipeline", "cluster", "kernels"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            allowed = ALLOWED.get(rel, set())
            for line, name in writing_calls(path):
                if allowed is not None and name not in allowed:
                    offenders.append(f"{rel}:{line} {name}")
    assert not offenders, "write through pipeline.store.door instead: " + ", ".join(offenders)


def test_the_rule_sees_a_write(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nos.replace('a', 'b')\nfs.rm_file('x')\nos.path.join('a')\n"
        "os.open(p, os.O_RDONLY | os.O_NONBLOCK)\nos.open(p, os.O_RDONLY | os.O_CREAT)\n"
    )
    assert writing_calls(sample) == [(2, "replace"), (3, "rm_file"), (6, "open")]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    root.mkdir()
    return root


def test_write_creates_folders_and_replaces_whole(folder: Path) -> None:
    door = Door(str(folder))
    door.write("c/0/1", b"one")
    door.write("c/0/1", b"two")
    assert (folder / "c" / "0" / "1").read_bytes() == b"two"
    assert sorted(os.listdir(folder / "c" / "0")) == ["1"]  # no temporary file left
    with pytest.raises(FileExistsError):
        door.write("c/0/1", b"three", exclusive=True)


@pytest.mark.parametrize("where", ["c", "c/0", "journal"])
def test_a_linked_folder_is_never_written_through(folder: Path, tmp_path: Path, where: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "1").write_bytes(b"precious")
    link = folder / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    door = Door(str(folder))
    for act in (
        lambda: door.write(f"{where}/1", b"x"),
        lambda: door.remove(f"{where}/1"),
        lambda: door.rename(f"{where}/1", "moved"),
        lambda: door.remove_tree(where),
        lambda: door.read(f"{where}/1"),
    ):
        with pytest.raises(UnsafeOutputError, match="symbolic link"):
            act()
    assert (victim / "1").read_bytes() == b"precious" and link.is_symlink()


def test_a_linked_file_is_replaced_as_a_link_never_followed(folder: Path, tmp_path: Path) -> None:
    victim = tmp_path / "notes.txt"
    victim.write_text("mine")
    (folder / "lock.json").symlink_to(victim)
    door = Door(str(folder))
    with pytest.raises(FileExistsError):
        os.close(door.create("lock.json", b"{}"))
    with pytest.raises(UnsafeOutputError):
        door.open_existing("lock.json")
    with pytest.raises(UnsafeOutputError):
        door.write("lock.json", b"{}")  # a planted link is refused, not replaced
    assert door.remove("lock.json")  # the link goes, its target stays
    assert victim.read_text() == "mine"


def test_special_files_are_refused(folder: Path) -> None:
    os.mkfifo(folder / "fifo")
    door = Door(str(folder))
    with pytest.raises(UnsafeOutputError):
        door.read("fifo")
    with pytest.raises(UnsafeOutputError):
        door.open_existing("fifo")
    with pytest.raises(UnsafeOutputError):
        door.write("fifo", b"x")


@pytest.mark.parametrize("name", ["../x", "c/../../x", "./x", ""])
def test_paths_that_leave_the_folder_are_refused(folder: Path, name: str) -> None:
    with pytest.raises(UnsafeOutputError):
        Door(str(folder)).write(name, b"x")
    assert os.listdir(folder) == [] and not (folder.parent / "x").exists()


def test_reads_are_bounded(folder: Path) -> None:
    (folder / "big").write_bytes(b"x" * 100)
    with pytest.raises(UnsafeOutputError, match="100 bytes"):
        Door(str(folder)).read("big", limit=99)
    assert Door(str(folder)).read("missing") is None


def test_walk_reports_links_without_following(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("x")
    (folder / "c").symlink_to(tmp_path / "elsewhere")
    (folder / "zarr.json").write_text("{}")
    kinds = {e.path: e.kind for e in Door(str(folder)).walk()}
    assert kinds == {"c": "link", "zarr.json": "file"}


def test_the_root_itself_must_not_be_a_link(tmp_path: Path, folder: Path) -> None:
    (tmp_path / "alias").symlink_to(folder)
    with pytest.raises(UnsafeOutputError):
        Door(str(tmp_path / "alias")).write("x", b"x")

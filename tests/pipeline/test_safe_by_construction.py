"""The data-loss cases of a link-planting attacker and a careless user: a link where a lock
was, a folder of someone else's sidecars, an input reaching OUT through a linked folder, a C
whose folders lead elsewhere. Nothing outside OUT (and C's own chunks) ever changes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply
from pipeline.errors import PipelineError, UnsafeOutputError
from pipeline.store import record
from tests.helpers import assert_product, random_matrix, run_cli, write_array


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    a, b = random_matrix(rng, (40, 30), "float32"), random_matrix(rng, (30, 20), "float32")
    return (
        write_array(tmp_path / "a.zarr", a, (20, 10)),
        write_array(tmp_path / "b.zarr", b, (10, 10)),
        a,
        b,
    )


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every file and link under ``root`` (not under ``skip``) -> its content's digest or
    its target: what must not change."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        if skip is not None and (here == skip or skip in here.parents):
            dirs[:] = []
            continue
        for name in dirs + files:
            path = here / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                seen[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def test_a_link_at_the_lock_is_never_followed(tmp_path: Path, inputs: tuple) -> None:
    a_url, b_url, _, _ = inputs
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    out = tmp_path / "out.zarr"
    out.mkdir()
    (out / "lock.json").symlink_to(notes)
    done = run_cli("multiply", a_url, b_url, str(out), "--no-progress")
    assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
    assert done.stderr.count("\n") == 1 and "lock.json" in done.stderr
    assert notes.read_text() == "my notes" and (out / "lock.json").is_symlink()


def test_a_dangling_lock_link_is_refused_at_once(tmp_path: Path, inputs: tuple) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    out.mkdir()
    (out / "lock.json").symlink_to(tmp_path / "nowhere")
    started = time.monotonic()
    done = run_cli("multiply", a_url, b_url, str(out), "--no-progress", timeout=60)
    assert done.returncode == 2 and "lock.json" in done.stderr, done.stderr
    assert time.monotonic() - started < 60 and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    "files",
    [
        {"inputs.json": '{"A": {}, "B": {}}'},
        {"lock.json": '{"mine": true}'},
        {"inputs.json": "{}", "lock.json": "{}"},
        {"zarr.json.bak": "{}"},
        {"lock.json": ""},  # an empty file of the lock's name alone is a killed job's: taken
    ],
)
def test_a_folder_of_someone_elses_sidecars_is_not_a_new_out(
    tmp_path: Path, client: Client, inputs: tuple, files: dict[str, str]
) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "out.zarr"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    before = snapshot(out)
    if files == {"lock.json": ""}:
        assert_product(multiply(a_url, b_url, str(out), client=client) and
                       zarr.open_array(str(out))[:], a, b)  # fmt: skip
        return
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(UnsafeOutputError):
            multiply(a_url, b_url, str(out), client=client, **flags)
    assert snapshot(out) == before


def test_accumulate_keeps_a_lock_file_that_c_s_owner_keeps(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, a, b = inputs
    c = tmp_path / "c.zarr"
    write_array(c, np.zeros((40, 20), "float32"), (20, 10))
    (c / "lock.json").write_text('{"owner": "lab"}')
    with pytest.raises(UnsafeOutputError, match="lock.json"):
        multiply(a_url, b_url, str(c), client=client, accumulate=True)
    assert (c / "lock.json").read_text() == '{"owner": "lab"}'


def test_resume_sees_a_change_behind_a_linked_chunk_folder(tmp_path: Path, client: Client) -> None:
    """An input's ``c/`` on another disk (a link): a change there is a change to the input."""
    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, (512, 30), "float32"), random_matrix(rng, (30, 20), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (256, 10))
    b_url = write_array(tmp_path / "b.zarr", b, (10, 10))
    disk = tmp_path / "other-disk"
    shutil.move(Path(a_url) / "c", disk)
    (Path(a_url) / "c").symlink_to(disk)
    out = str(tmp_path / "out.zarr")
    multiply(a_url, b_url, out, client=client)
    zarr.open_array(a_url, mode="r+")[:] = a * 2  # a legitimate change, written through it
    result = multiply(a_url, b_url, out, client=client, resume=True)
    assert result.tiles_computed == result.plan.n_tiles
    assert_product(zarr.open_array(out)[:], a * 2, b)


def test_overwrite_refuses_an_out_whose_chunks_an_input_reaches(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "out.zarr"
    multiply(a_url, b_url, str(out), client=client)
    # Input B's chunks now live in OUT's c/ (B's c/ is a link to it): B is OUT's data.
    b2 = tmp_path / "b2.zarr"
    b2.mkdir()
    shutil.copy(Path(b_url) / "zarr.json", b2 / "zarr.json")
    (b2 / "c").symlink_to(out / "c")
    before = snapshot(tmp_path, skip=out)
    before_out = snapshot(out)
    for flags in ({"overwrite": True}, {"resume": True}):
        with pytest.raises(UnsafeOutputError, match="reach the same"):
            multiply(a_url, str(b2), str(out), client=client, **flags)
    assert snapshot(tmp_path, skip=out) == before and snapshot(out) == before_out


@pytest.mark.parametrize("where", ["c", ".tilegemm-accumulate"])
def test_accumulate_never_writes_through_a_link_inside_c(
    tmp_path: Path, client: Client, inputs: tuple, where: str
) -> None:
    a_url, b_url, a, b = inputs
    other = tmp_path / "other.zarr"
    write_array(other, np.ones((40, 20), "float32"), (20, 10))
    c = tmp_path / "c.zarr"
    write_array(c, np.full((40, 20), 3, "float32"), (20, 10))
    if where == "c":
        shutil.rmtree(c / "c")
        (c / "c").symlink_to(other / "c")  # C's chunks are another array's
    else:
        (tmp_path / "elsewhere").mkdir()
        (c / where).symlink_to(tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        multiply(a_url, b_url, str(c), client=client, accumulate=True, beta=2.0)
    assert snapshot(tmp_path) == before


def test_accumulate_refuses_a_c_that_is_an_input_through_a_link(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, a, b = inputs
    square = write_array(tmp_path / "s.zarr", np.ones((40, 40), "float32"), (20, 20))
    c = tmp_path / "c.zarr"
    c.symlink_to(square)  # C spelled another way: the input itself
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeOutputError):
        multiply(square, square, str(c), client=client, accumulate=True, beta=2.0)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "3"])
def test_a_journal_entry_of_the_wrong_type_is_a_clean_refusal(
    tmp_path: Path, inputs: tuple, content: str
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    assert run_cli("multiply", a_url, b_url, str(out), "--no-progress").returncode == 0
    (out / "journal" / "tile-0-0.json").write_text(content)
    done = run_cli("multiply", a_url, b_url, str(out), "--resume", "--no-progress")
    assert done.returncode == 2, done.stderr
    assert "tile-0-0.json" in done.stderr and "--overwrite" in done.stderr


@pytest.mark.parametrize(
    "stray",
    ["2024.06", "3.14", "c/9/9", ".zattrs", "c/0/0.orig", "zarr.json.bak",
     "c/0/0.0123456789abcdef0123456789abcdef.partial.txt", "journal/tile-99-0.json"],
)  # fmt: skip
def test_names_that_only_look_like_ours_are_foreign(
    tmp_path: Path, client: Client, inputs: tuple, stray: str
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    multiply(a_url, b_url, str(out), client=client)
    (out / stray).parent.mkdir(parents=True, exist_ok=True)
    (out / stray).write_text("someone's")
    for flags in ({"overwrite": True}, {"resume": True}):
        with pytest.raises(UnsafeOutputError, match="did not write"):
            multiply(a_url, b_url, str(out), client=client, **flags)
    assert (out / stray).read_text() == "someone's"


def test_a_fifo_or_folder_in_out_is_refused_not_waited_on(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    multiply(a_url, b_url, str(out), client=client)
    os.mkfifo(out / "inputs.json.fifo")
    with pytest.raises(PipelineError):
        multiply(a_url, b_url, str(out), client=client, overwrite=True)
    assert (out / "inputs.json.fifo").exists()


def test_report_never_follows_a_planted_link(tmp_path: Path, inputs: tuple) -> None:
    a_url, b_url, _, _ = inputs
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    (tmp_path / "report.html").symlink_to(notes)
    done = run_cli("multiply", a_url, b_url, str(tmp_path / "out.zarr"), "--no-progress",
                   "--report", str(tmp_path / "report.html"))  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: --report"), done.stderr
    assert notes.read_text() == "mine"


def test_an_unfinished_journal_entry_names_its_file(tmp_path: Path) -> None:
    """A band entry whose rows are not two integers is not trusted (no crash)."""
    from pipeline.store.journal import _index

    assert _index({"index": [1, 2]}) == (1, 2)
    for bad in ({"index": "ab"}, {"index": [1]}, {"index": [1.0, 2]}, {}, {"index": 3}):
        assert _index(bad) is None


def test_a_stale_writer_is_fenced_off_by_the_lock_token(tmp_path: Path, inputs: tuple) -> None:
    """A task of a stopped job (its lock gone, a newer job holding OUT) writes nothing."""
    from pipeline.store import lock
    from pipeline.store.output import Output

    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    out.mkdir()
    output = Output(str(out))
    with lock.hold_lock(str(out), {}) as old:
        output.check_fence(old.token)  # the holder's own tasks write
    with lock.hold_lock(str(out), {}) as new, pytest.raises(UnsafeOutputError, match="stops"):
        assert new.token != old.token
        output.check_fence(old.token)
    with pytest.raises(UnsafeOutputError, match="no longer holds"):
        output.check_fence(old.token)  # no lock at all: the job is gone


def test_an_unfinished_product_is_refused_as_an_input(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    from pipeline.errors import InputError

    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    multiply(a_url, b_url, str(out), client=client)
    square = tmp_path / "sq.zarr"
    multiply(str(out), str(out), str(square), client=client, transpose_b=True)  # finished: fine
    array = zarr.open_array(str(out), mode="r+")
    unfinished = dataclasses.replace(record.of_array(array), complete=False)
    array.attrs.update(unfinished.attributes())
    with pytest.raises(InputError, match=r"unfinished product of this tool.*resume=True"):
        multiply(str(out), str(out), str(tmp_path / "sq2.zarr"), client=client, transpose_b=True)


def test_input_metadata_is_read_again_under_the_lock(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    from pipeline import prepare
    from pipeline.errors import UsageError

    a_url, b_url, _, _ = inputs
    job = prepare(a_url, b_url, str(tmp_path / "out.zarr"))
    zarr.open_array(a_url, mode="r+").attrs["units"] = "K"  # changed after planning
    with pytest.raises(UsageError, match="changed after this job was planned"):
        job.execute(client)
    assert not (tmp_path / "out.zarr").exists()  # the folder it created is removed again


@pytest.mark.parametrize("target", ["nowhere/deeper", "/tmp/tilegemm-nowhere-{pid}"])
@pytest.mark.parametrize("command", ["multiply", "random"])
def test_an_out_that_is_a_dangling_link_is_refused(
    tmp_path: Path, inputs: tuple, target: str, command: str
) -> None:
    """Resolved, a dangling link would be created wherever it points: outside OUT."""
    a_url, b_url, _, _ = inputs
    target = target.format(pid=os.getpid())
    (tmp_path / "out.zarr").symlink_to(target)
    where = Path(target) if os.path.isabs(target) else tmp_path / target
    args = (
        ("multiply", a_url, b_url, "out.zarr")
        if command == "multiply"
        else ("random", "out.zarr", "--shape", "4x4", "--chunks", "2x2")
    )
    flags = ("--no-progress",) if command == "multiply" else ()
    done = run_cli(*args, *flags, cwd=tmp_path)
    assert done.returncode == 2 and "leads nowhere" in done.stderr, done.stderr
    assert not where.exists() and not where.parent.joinpath("nowhere").exists()


def test_a_refused_job_removes_the_parents_it_made(tmp_path: Path, inputs: tuple) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "new" / "deeper" / "out.zarr"
    (tmp_path / "c").mkdir()
    done = run_cli("multiply", a_url, str(tmp_path / "c"), str(out), "--no-progress")
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", [".zattrs", ".zarray", "zarr.json.bak"])
def test_a_sparse_metadata_file_in_out_is_never_read_whole(
    tmp_path: Path, inputs: tuple, name: str
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    assert run_cli("multiply", a_url, b_url, str(out), "--no-progress").returncode == 0
    with open(out / name, "wb") as f:
        f.truncate(3 << 30)  # sparse: no disk, 3 GiB to a reader
    started = time.monotonic()
    done = run_cli("multiply", a_url, b_url, str(out), "--overwrite", "--no-progress",
                   prefix=("prlimit", f"--as={4 << 30}"))  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
    assert time.monotonic() - started < 60 and (out / name).stat().st_size == 3 << 30


def test_a_hard_linked_lock_is_never_written(tmp_path: Path) -> None:
    from pipeline.store import lock

    victim = tmp_path / "victim"
    victim.write_text("")  # empty, like a lock a killed job left: only its second name differs
    out = tmp_path / "out"
    out.mkdir()
    os.link(victim, out / "lock.json")
    with pytest.raises(UnsafeOutputError, match="hard link"):
        lock.acquire(str(out), {})
    assert victim.read_text() == ""


def test_an_original_is_never_removed_unless_saved(tmp_path: Path) -> None:
    from pipeline.accumulate.originals import save_tile
    from pipeline.store.output import Output

    c = tmp_path / "c.zarr"
    (c / "c" / "0").mkdir(parents=True)
    (c / "c" / "0" / "0").write_bytes(b"C's values")
    (c / ".tilegemm-accumulate").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (c / ".tilegemm-accumulate" / "original").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeOutputError):
        save_tile(Output(str(c)), (0, 0), ["c/0/0"])
    assert (c / "c" / "0" / "0").read_bytes() == b"C's values"
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_folder_swapped_in_at_out_s_path_is_never_written(tmp_path: Path) -> None:
    """Someone who can rename in OUT's parent swaps another folder in mid-job."""
    from pipeline.store import lock
    from pipeline.store.door import Door

    out = tmp_path / "out"
    out.mkdir()
    with lock.hold_lock(str(out), {}) as held:
        held.pin_folder()
        out.rename(tmp_path / "moved")
        out.mkdir()
        (out / "zarr.json").write_text("theirs")
        for act in (lambda: Door(str(out)).remove("zarr.json"),
                    lambda: Door(str(out)).write("zarr.json", b"ours"),
                    lambda: Door(str(out / ".tilegemm-accumulate")).write("s", b"x")):  # fmt: skip
            with pytest.raises(UnsafeOutputError, match="replaced"):
                act()
    assert (out / "zarr.json").read_text() == "theirs"
    Door(str(out)).write("x", b"unpinned again")  # released: the path is the path again


@pytest.mark.parametrize("flag", ["overwrite", "resume"])
def test_an_out_given_as_a_link_is_not_replaced(
    tmp_path: Path, client: Client, inputs: tuple, flag: str
) -> None:
    a_url, b_url, _, _ = inputs
    mine = tmp_path / "earlier.zarr"
    multiply(a_url, b_url, str(mine), client=client)
    before = snapshot(mine)
    (tmp_path / "shared-out").symlink_to(mine)  # planted by someone who can write the folder
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        multiply(a_url, b_url, str(tmp_path / "shared-out"), client=client, **{flag: True})
    assert snapshot(mine) == before


def test_local_urls_go_through_the_same_checks(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "out.zarr"
    multiply(a_url, b_url, str(out), client=client)
    b2 = tmp_path / "b2.zarr"
    b2.mkdir()
    shutil.copy(Path(b_url) / "zarr.json", b2 / "zarr.json")
    (b2 / "c").symlink_to(out / "c")
    before = snapshot(out)
    with pytest.raises(UnsafeOutputError, match="reach the same"):
        multiply(a_url, str(b2), f"local://{out}", client=client, overwrite=True)
    assert snapshot(out) == before
    with pytest.raises(PipelineError, match="chained|unknown protocol"):
        multiply(a_url, b_url, f"simplecache::file://{tmp_path}/x.zarr", client=client)


def test_a_fifo_in_a_folder_above_out_is_not_waited_on(tmp_path: Path) -> None:
    from pipeline.store.groups import output_format

    (tmp_path / "g").mkdir()
    os.mkfifo(tmp_path / "g" / "zarr.json")
    started = time.monotonic()
    assert output_format(str(tmp_path / "g" / "out"), {}) == 3
    assert time.monotonic() - started < 5


def test_a_deep_tree_in_out_is_a_refusal_not_a_crash(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "out.zarr"
    multiply(a_url, b_url, str(out), client=client)
    deep = out / "c"
    for _ in range(40):  # past the walk's depth limit (a deeper tree: the same)
        deep = deep / "d"
        deep.mkdir()
    with pytest.raises(UnsafeOutputError, match="did not write"):
        multiply(a_url, b_url, str(out), client=client, overwrite=True)


def test_a_link_to_the_root_in_an_input_is_not_walked(tmp_path: Path) -> None:
    from pipeline.store.reach import reach

    array = tmp_path / "a.zarr"
    (array / "c" / "0").mkdir(parents=True)
    (array / "c" / "0" / "0").write_bytes(b"x")
    (array / "x").symlink_to("/")
    started = time.monotonic()
    found = reach(str(array))
    assert time.monotonic() - started < 2 and set(found.files) == {"c/0/0"}

"""A second user's links in shared folders never steer the tool: the owner rule on OUT, C and
the report's paths (pipeline.store.links), and no confused deputy on reads or writes
(pipeline.store.deputy). The rules' own tests first (any user); then the attacks as a second,
unprivileged user plants them and root runs the job (root only: dropping to another uid needs
it)."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import zarr

from pipeline.errors import StoredObjectError, UnsafeOutputError
from pipeline.store import deputy, door, links
from pipeline.store.chunks.input_store import open_checked
from pipeline.store.fs import local_path
from tests.helpers import refused, run_cli, write_array

PLANTER = 65534
"""The second user: ``nobody`` on Debian, in no group of root's."""
SECRET = 7.77e77
"""What only root can read: found in OUT, it leaked."""
QUIET = ("--workers", "1", "--no-progress", "--dashboard-address", "127.0.0.1:0")


def cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, each path relative to ``site`` made absolute: run from the checkout, where a
    mutation run's children find their configuration."""
    return run_cli(*(_absolute(site, arg) for arg in args))


def _absolute(site: Path, arg: str) -> str:
    if "::" in arg:
        head, tail = arg.split("::")
        return f"{head}::{site}/{tail}"
    return f"{site}/{arg}" if arg.endswith((".zarr", ".json", ".zip", "mine")) else arg


def fake_stat(mode: int, uid: int, gid: int = 0, nlink: int = 1) -> os.stat_result:
    return os.stat_result((mode, 1, 1, nlink, uid, gid, 0, 0, 0, 0))


# -- the rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("link_uid", "folder_mode", "folder_uid", "follows"),
    [
        (500, stat.S_IFDIR | 0o1777, 0, True),  # the caller's own link, anywhere
        (600, stat.S_IFDIR | 0o1777, 0, False),  # another's link in a shared folder
        (600, stat.S_IFDIR | 0o2775, 500, False),  # ... in a group-writable one
        (600, stat.S_IFDIR | 0o0777, 0, False),  # ... in a world-writable one, not sticky
        (600, stat.S_IFDIR | 0o0755, 0, True),  # a folder only its owner writes
        (600, stat.S_IFDIR | 0o2775, 600, True),  # the folder's owner made it
    ],
)
def test_the_owner_rule(link_uid: int, folder_mode: int, folder_uid: int, follows: bool) -> None:
    link = fake_stat(stat.S_IFLNK | 0o777, link_uid)
    assert links.may_follow(link, fake_stat(folder_mode, folder_uid), uid=500) is follows


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "want", "allowed"),
    [
        (0o600, 0, 0, deputy.R, False),  # root's private file
        (0o644, 0, 0, deputy.R, True),
        (0o640, 0, 12345, deputy.R, False),  # a group the user is not in
        (0o600, 600, 0, deputy.R, True),  # the user's own
        (0o066, 600, 0, deputy.R, True),  # their own: they can chmod it at will
        (0o755, 0, 0, deputy.W | deputy.X, False),
        (0o777, 0, 0, deputy.W | deputy.X, True),
    ],
)
def test_what_a_user_may_do_by_mode(
    mode: int, uid: int, gid: int, want: int, allowed: bool
) -> None:
    st = fake_stat(stat.S_IFREG | mode, uid, gid)
    assert deputy.can(600, st, want) is allowed
    assert deputy.can(0, st, want)  # root may do anything


def test_the_callers_own_links_are_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "shared").mkdir(mode=0o1777)
    os.chmod(tmp_path / "shared", 0o1777)
    (tmp_path / "shared" / "mine").symlink_to(tmp_path / "real")
    found = links.walk(str(tmp_path / "shared" / "mine" / "new.zarr"), "OUT")
    os.close(found.fd)
    assert (found.path, found.missing) == (str(tmp_path / "real"), ["new.zarr"])


def test_a_loop_of_links_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x").symlink_to(tmp_path / "y")
    (tmp_path / "y").symlink_to(tmp_path / "x")
    with pytest.raises(UnsafeOutputError, match="more than 40 symbolic links"):
        links.resolve(str(tmp_path / "x" / "out.zarr"), "OUT")


def test_a_folder_swapped_in_where_one_was_made_stays(tmp_path: Path) -> None:
    made = door.create_folder(str(tmp_path / "shared" / "out.zarr"))
    os.rmdir(tmp_path / "shared" / "out.zarr")
    (tmp_path / "shared" / "out.zarr").mkdir()  # another user's, at the same path
    door.remove_empty_folders(made)
    assert (tmp_path / "shared" / "out.zarr").is_dir()


def test_a_path_that_leads_elsewhere_after_the_open_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1")
    (tmp_path / "b").write_bytes(b"2")
    link = tmp_path / "chunk"
    link.symlink_to(tmp_path / "a")
    opened = os.stat(link)
    assert deputy.refusal(str(link), opened) is None
    link.unlink()
    link.symlink_to(tmp_path / "b")  # swapped between the open and the look at its links
    assert "changed as it was opened" in (deputy.refusal(str(link), opened) or "")


def test_file_localhost_is_the_local_path() -> None:
    assert local_path("file://localhost/tmp/x.zarr") == "/tmp/x.zarr"
    assert local_path("file:///tmp/x.zarr") == "/tmp/x.zarr"
    assert local_path("file://a.zarr") == "a.zarr"  # fsspec's relative spelling stays


def test_a_file_localhost_out_lands_at_its_path(tmp_path: Path) -> None:
    a = write_array(tmp_path / "a.zarr", np.eye(4), (4, 4))
    done = run_cli("multiply", a, a, f"file://localhost{tmp_path}/o.zarr", *QUIET)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "localhost").exists()
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "o.zarr"))[:], np.eye(4))


# -- a second user (root runs the jobs) ----------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="planting as a second user needs root to drop to another uid"
)


def as_planter(*argv: str) -> None:
    subprocess.run(argv, check=True, user=PLANTER, group=PLANTER, extra_groups=[])


@pytest.fixture
def site() -> Iterator[Path]:
    """``shared`` (1777: anyone plants there), ``private`` (root's, 0700) holding an empty
    ``target`` folder and a ``secret`` file (0600) laid out as a 4x4 float64 chunk; in a
    folder of its own the planter can reach (pytest's are root's alone)."""
    with tempfile.TemporaryDirectory(prefix="planted-") as folder:
        os.chmod(folder, 0o755)
        yield _site(Path(folder))


def _site(tmp_path: Path) -> Path:
    (tmp_path / "shared").mkdir()
    os.chmod(tmp_path / "shared", 0o1777)
    (tmp_path / "private" / "target").mkdir(parents=True)
    os.chmod(tmp_path / "private", 0o700)
    secret = tmp_path / "private" / "secret"
    secret.write_bytes(np.full((4, 4), SECRET).tobytes())
    os.chmod(secret, 0o600)
    write_array(tmp_path / "a.zarr", np.eye(8), (4, 4))
    return tmp_path


def planters_input(site: Path, zarr_format: Literal[2, 3] = 3) -> Path:
    """An uncompressed 8x8 input of the planter's in the shared folder."""
    path = site / "shared" / "in.zarr"
    zarr.create_array(
        str(path), data=np.ones((8, 8)), chunks=(4, 4), compressors=None, zarr_format=zarr_format
    )
    subprocess.run(["chown", "-R", f"{PLANTER}:{PLANTER}", str(path)], check=True)
    return path


def first_chunk(array: Path, zarr_format: int) -> Path:
    return array / ("c/0/0" if zarr_format == 3 else "0.0")


def untouched(site: Path) -> None:
    assert os.listdir(site / "private" / "target") == []
    assert sorted(os.listdir(site / "private")) == ["secret", "target"]


@needs_root
@pytest.mark.parametrize("command", ["multiply", "gram"])
def test_a_planted_link_at_out_is_refused(site: Path, command: str) -> None:
    out = site / "shared" / "out.zarr"
    as_planter("ln", "-s", str(site / "private" / "target"), str(out))
    inputs = ("a.zarr", "a.zarr") if command == "multiply" else ("a.zarr",)
    line = refused(cli(site, command, *inputs, "shared/out.zarr", *QUIET))
    assert f"{out} is a symbolic link owned by nobody (uid {PLANTER})" in line
    assert "mode 1777" in line
    untouched(site)


@needs_root
def test_a_planted_link_above_out_is_refused(site: Path) -> None:
    as_planter("ln", "-s", str(site / "private"), str(site / "shared" / "proj"))
    line = refused(cli(site, "multiply", "a.zarr", "a.zarr", "shared/proj/out.zarr", *QUIET))
    assert f"{site}/shared/proj is a symbolic link owned by nobody" in line
    untouched(site)


@needs_root
def test_a_planted_link_at_the_report_is_refused(site: Path) -> None:
    as_planter("ln", "-s", str(site / "private" / "target"), str(site / "shared" / "logs"))
    done = cli(
        site, "multiply", "a.zarr", "a.zarr", "out.zarr", "--report", "shared/logs/r.json", *QUIET
    )
    assert "symbolic link owned by nobody" in refused(done)
    untouched(site)
    assert not (site / "out.zarr").exists()


@needs_root
def test_a_group_writable_folder_is_shared_too(site: Path) -> None:
    group = site / "group"
    group.mkdir()
    os.chown(group, 0, PLANTER)
    os.chmod(group, 0o2775)
    subprocess.run(  # the planter in the folder's group, as a lab's members are
        ["ln", "-s", str(site / "private" / "target"), str(group / "out.zarr")],
        check=True,
        user=PLANTER,
        group=PLANTER,
        extra_groups=[PLANTER],
    )
    line = refused(cli(site, "multiply", "a.zarr", "a.zarr", "group/out.zarr", *QUIET))
    assert "mode 2775" in line
    untouched(site)


@needs_root
def test_a_link_in_the_planters_own_folder_leads_only_where_they_could_write(
    site: Path,
) -> None:
    own = site / "shared" / "theirs"
    as_planter("mkdir", "-m", "755", str(own))
    as_planter("ln", "-s", str(site / "private"), str(own / "p"))
    line = refused(cli(site, "multiply", "a.zarr", "a.zarr", "shared/theirs/p/o.zarr", *QUIET))
    assert f"theirs/p, a symbolic link made by nobody (uid {PLANTER}), leading to" in line
    assert f"{site}/private, which nobody (uid {PLANTER}) cannot write" in line
    untouched(site)
    open_to_all = site / "scratch"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    as_planter("ln", "-s", str(open_to_all), str(own / "s"))
    done = cli(site, "multiply", "a.zarr", "a.zarr", "shared/theirs/s/o.zarr", *QUIET)
    assert done.returncode == 0, done.stderr  # the planter could have written there anyway
    np.testing.assert_array_equal(zarr.open_array(str(open_to_all / "o.zarr"))[:], np.eye(8))


@needs_root
def test_roots_own_link_is_followed_where_only_root_could_have_put_it(site: Path) -> None:
    (site / "mine").symlink_to(site / "private" / "target")  # in root's 0755 folder
    done = cli(site, "multiply", "a.zarr", "a.zarr", "mine", *QUIET)
    assert done.returncode == 0, done.stderr
    assert zarr.open_array(str(site / "private" / "target"))[0, 0] == 1.0


@needs_root
def test_roots_own_link_in_a_sticky_folder_is_anyones(site: Path) -> None:
    (site / "shared" / "mine").symlink_to(site / "private" / "target")  # or moved in by them
    line = refused(cli(site, "multiply", "a.zarr", "a.zarr", "shared/mine", *QUIET))
    assert f"{site}/shared/mine, which anyone could have put there" in line
    untouched(site)


@needs_root
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("command", ["multiply", "gram"])
def test_an_input_chunk_linked_to_a_file_its_owner_cannot_read_is_refused(
    site: Path, zarr_format: Literal[2, 3], command: str
) -> None:
    chunk = first_chunk(planters_input(site, zarr_format), zarr_format)
    chunk.unlink()
    as_planter("ln", "-s", str(site / "private" / "secret"), str(chunk))
    inputs = ("shared/in.zarr", "a.zarr") if command == "multiply" else ("shared/in.zarr",)
    done = cli(site, command, *inputs, "out.zarr", *QUIET)
    line = refused(done)
    assert f"{chunk}, a symbolic link made by nobody (uid {PLANTER})" in line
    assert f"nobody (uid {PLANTER}) cannot read the file it leads to" in line
    assert f"the folder {site}/private is shut to them" in line
    assert not (site / "out.zarr").exists()
    assert repr(SECRET) not in done.stdout + done.stderr


@needs_root
def test_an_input_folder_linked_past_a_folder_its_owner_cannot_search_is_refused(
    site: Path,
) -> None:
    source = planters_input(site)
    hidden = site / "private" / "c0"
    hidden.mkdir()
    for name in ("0", "1"):
        (hidden / name).write_bytes(np.full((4, 4), SECRET).tobytes())  # 0644, in a 0700 folder
    subprocess.run(["rm", "-r", str(source / "c" / "0")], check=True)
    as_planter("ln", "-s", str(hidden), str(source / "c" / "0"))
    line = refused(cli(site, "multiply", "shared/in.zarr", "a.zarr", "out.zarr", *QUIET))
    assert "c/0/0 is reached through" in line
    assert f"c/0, a symbolic link made by nobody (uid {PLANTER})" in line
    assert f"nobody (uid {PLANTER}) cannot read the file it leads to" in line


@needs_root
def test_an_input_link_to_what_its_owner_may_read_is_followed(site: Path) -> None:
    chunk = first_chunk(planters_input(site), 3)
    chunk.unlink()
    readable = site / "public"
    readable.write_bytes(np.full((4, 4), 2.0).tobytes())
    as_planter("ln", "-s", str(readable), str(chunk))
    done = cli(site, "multiply", "shared/in.zarr", "a.zarr", "out.zarr", *QUIET)
    assert done.returncode == 0, done.stderr
    assert zarr.open_array(str(site / "out.zarr"))[0, 0] == 2.0


@needs_root
def test_a_chunk_linked_after_planning_is_refused_as_it_is_opened(site: Path) -> None:
    chunk = first_chunk(planters_input(site), 3)
    chunk.unlink()
    as_planter("ln", "-s", str(site / "private" / "secret"), str(chunk))
    with pytest.raises(StoredObjectError, match="nobody .uid 65534. cannot read the file it"):
        open_checked(str(chunk), 1 << 20, "c/0/0")


@needs_root
def test_a_storage_options_file_linked_to_roots_file_is_refused(site: Path) -> None:
    (site / "private" / "opts.json").write_text('{"key": "root-only"}')
    os.chmod(site / "private" / "opts.json", 0o600)
    as_planter("ln", "-s", str(site / "private" / "opts.json"), str(site / "shared" / "o.json"))
    done = cli(
        site,
        "multiply",
        "a.zarr",
        "a.zarr",
        "out.zarr",
        "--storage-options-file",
        "shared/o.json",
        *QUIET,
    )
    line = refused(done)
    assert "o.json, a symbolic link made by nobody (uid 65534)" in line
    assert "nobody (uid 65534) cannot read the file it leads to" in line
    assert "root-only" not in done.stderr + done.stdout


@needs_root
def test_a_hard_link_in_the_planters_folder_to_roots_file_is_refused(site: Path) -> None:
    chunk = first_chunk(planters_input(site), 3)
    chunk.unlink()
    os.link(site / "private" / "secret", chunk)  # as protected_hardlinks=0 would let them
    done = cli(site, "multiply", "shared/in.zarr", "a.zarr", "out.zarr", *QUIET)
    line = refused(done)
    assert f"which nobody (uid {PLANTER}) could have put there" in line
    assert f"nobody (uid {PLANTER}) cannot read the file it leads to" in line
    assert not (site / "out.zarr").exists()


@needs_root
def test_an_archive_linked_to_roots_zip_is_refused(site: Path) -> None:
    import zipfile

    secret_zip = site / "private" / "a.zip"
    with zipfile.ZipFile(secret_zip, "w") as archive:
        for name in os.listdir(site / "a.zarr"):
            if os.path.isfile(site / "a.zarr" / name):
                archive.write(site / "a.zarr" / name, f"A/{name}")
    os.chmod(secret_zip, 0o600)
    as_planter("ln", "-s", str(secret_zip), str(site / "shared" / "a.zip"))
    done = cli(site, "multiply", "zip://A::shared/a.zip", "a.zarr", "out.zarr", *QUIET)
    line = refused(done)
    assert f"a.zip, a symbolic link made by nobody (uid {PLANTER})" in line
    assert f"nobody (uid {PLANTER}) cannot read the file it leads to" in line
    assert not (site / "out.zarr").exists()


@needs_root
def test_dot_dot_after_a_planted_link_is_walked_as_the_kernel_walks_it(site: Path) -> None:
    (site / "private" / "target" / "sub").mkdir()
    as_planter("ln", "-s", str(site / "private" / "target" / "sub"), str(site / "shared" / "pl"))
    for args in (
        ("multiply", "a.zarr", "a.zarr", "shared/pl/../out.zarr"),
        ("gram", "a.zarr", "shared/pl/../g.zarr"),
        ("multiply", "a.zarr", "a.zarr", "out.zarr", "--report", "shared/pl/../r.json"),
    ):
        line = refused(cli(site, *args, *QUIET))
        assert f"{site}/shared/pl is a symbolic link owned by nobody (uid {PLANTER})" in line
    assert os.listdir(site / "private" / "target") == ["sub"]
    assert os.listdir(site / "private" / "target" / "sub") == []


@needs_root
def test_roots_links_renamed_in_a_group_folder_steer_nothing(site: Path) -> None:
    group = site / "group"
    group.mkdir()
    os.chown(group, 0, PLANTER)
    os.chmod(group, 0o2775)  # not sticky: any member may rename root's links in it
    (group / "proj1").symlink_to(site / "private" / "target")
    line = refused(cli(site, "multiply", "a.zarr", "a.zarr", "group/proj1/out.zarr", *QUIET))
    assert f"{group}/proj1, which the members of group" in line
    assert f"{site}/private/target, which the members of group" in line
    untouched(site)


@needs_root
def test_roots_link_moved_into_the_planters_folder_steers_nothing(site: Path) -> None:
    own = site / "shared" / "theirs"
    as_planter("mkdir", "-m", "755", str(own))
    (own / "moved").symlink_to(site / "private" / "target")  # as if moved there by them
    line = refused(cli(site, "multiply", "a.zarr", "a.zarr", "shared/theirs/moved/o.zarr", *QUIET))
    assert f"{own}/moved, which nobody (uid {PLANTER}) could have put there" in line
    untouched(site)


@needs_root
def test_roots_file_moved_into_the_planters_input_is_not_read(site: Path) -> None:
    chunk = first_chunk(planters_input(site), 3)
    chunk.unlink()
    os.rename(site / "private" / "secret", chunk)  # one name, root's, 0600: moved there
    done = cli(site, "multiply", "shared/in.zarr", "a.zarr", "out.zarr", *QUIET)
    line = refused(done)
    assert f"nobody (uid {PLANTER}) cannot read the file it leads to" in line
    assert not (site / "out.zarr").exists()
    done = cli(site, "verify", "a.zarr", "a.zarr", "shared/in.zarr", *QUIET)
    assert f"C ({site}/shared/in.zarr): c/0/0 is reached through" in refused(done)


@needs_root
def test_dot_dot_after_the_callers_own_link_reads_as_the_kernel_does(site: Path) -> None:
    (site / "mine").mkdir()
    (site / "mine" / "rl").symlink_to(site / "a.zarr" / "c")
    done = cli(site, "multiply", f"{site}/mine/rl/..", "a.zarr", "out.zarr", *QUIET)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(zarr.open_array(str(site / "out.zarr"))[:], np.eye(8))


@needs_root
@pytest.mark.parametrize("command", ["multiply", "gram"])
def test_another_users_empty_folder_in_a_shared_folder_is_not_a_new_out(
    site: Path, command: str
) -> None:
    out = site / "shared" / "out.zarr"
    as_planter("mkdir", "-m", "777", str(out))
    inputs = ("a.zarr", "a.zarr") if command == "multiply" else ("a.zarr",)
    line = refused(cli(site, command, *inputs, "shared/out.zarr", *QUIET))
    assert f"is an empty folder nobody (uid {PLANTER}) made" in line
    assert out.is_dir() and os.listdir(out) == []  # theirs: neither written nor removed


@needs_root
def test_roots_link_moved_into_a_sticky_folder_steers_nothing(site: Path) -> None:
    group = site / "group"
    group.mkdir()
    os.chown(group, 0, PLANTER)
    os.chmod(group, 0o2775)
    write_array(site / "private" / "arr.zarr", np.full((8, 8), SECRET), (4, 4))
    (group / "to-arr").symlink_to(site / "private" / "arr.zarr")
    (group / "to-target").symlink_to(site / "private" / "target")
    subprocess.run(  # a member of the group moves root's links into the sticky folder
        ["sh", "-c", f"mv {group}/to-arr {site}/shared/in.zarr && mv {group}/to-target "
         f"{site}/shared/out"],
        check=True, user=PLANTER, group=PLANTER, extra_groups=[PLANTER],
    )  # fmt: skip
    done = cli(site, "multiply", "shared/in.zarr", "a.zarr", "o.zarr", *QUIET)
    assert f"{site}/shared/in.zarr, which anyone could have put there" in refused(done)
    assert not (site / "o.zarr").exists()
    line = refused(cli(site, "multiply", "a.zarr", "a.zarr", "shared/out/o.zarr", *QUIET))
    assert f"{site}/shared/out, which anyone could have put there" in line
    assert os.listdir(site / "private" / "target") == []


@needs_root
def test_a_placer_who_shut_their_folder_is_still_one(site: Path) -> None:
    own = site / "homes" / "theirs"
    own.mkdir(parents=True)
    os.chown(own, PLANTER, PLANTER)
    (own / "in").symlink_to(site / "private" / "secret")  # as if moved there by them
    as_planter("chmod", "0", str(own))  # they can open it again at will
    source = site / "x.zarr"
    zarr.create_array(str(source), data=np.ones((8, 8)), chunks=(4, 4), compressors=None)
    (source / "c" / "0" / "0").unlink()
    (source / "c" / "0" / "0").symlink_to(own / "in")
    line = refused(cli(site, "multiply", "x.zarr", "a.zarr", "o.zarr", *QUIET))
    assert f"{own}/in, which nobody (uid {PLANTER}) could have put there" in line


# -- the same rules called in this process (what a mutation run can see) ------------------------


@pytest.mark.parametrize(
    ("folder_mode", "entry_mode", "entry_uid", "want"),
    [
        (stat.S_IFDIR | 0o0755, stat.S_IFREG | 0o644, 600, set()),  # only root writes there
        (stat.S_IFDIR | 0o0777, stat.S_IFREG | 0o644, 0, {deputy.ANYONE, ("group", 12345)}),
        (stat.S_IFDIR | 0o1757, stat.S_IFLNK | 0o777, 0, {deputy.ANYONE}),  # moved in
        (stat.S_IFDIR | 0o1777, stat.S_IFDIR | 0o755, 0, set()),  # root's folder: not moved
        (stat.S_IFDIR | 0o1777, stat.S_IFDIR | 0o755, 600, {("user", 600)}),
        (stat.S_IFDIR | 0o1777, stat.S_IFDIR | 0o757, 0, {deputy.ANYONE}),  # moved in by anyone
        (stat.S_IFDIR | 0o2775, stat.S_IFREG | 0o644, 0, {("group", 12345)}),
    ],
)
def test_who_could_have_put_a_name_there(
    folder_mode: int, entry_mode: int, entry_uid: int, want: set[deputy.Placer]
) -> None:
    folder = fake_stat(folder_mode, 0, 12345)
    entry = fake_stat(entry_mode, entry_uid, 12345)
    assert deputy.placers(folder, entry) == want


def test_a_folder_of_another_users_is_theirs_to_have_filled() -> None:
    folder = fake_stat(stat.S_IFDIR | 0o755, PLANTER)
    assert deputy.placers(folder, fake_stat(stat.S_IFREG | 0o644, 0)) == {("user", PLANTER)}


@pytest.mark.skipif(deputy.groups_of(PLANTER) != {PLANTER}, reason="nobody has no group here")
@pytest.mark.parametrize(
    ("mode", "allowed"), [(0o040, True), (0o004, False), (0o400, False), (0o044, True)]
)
def test_a_users_groups_give_them_the_group_bits(mode: int, allowed: bool) -> None:
    st = fake_stat(stat.S_IFREG | mode, 0, PLANTER)  # root's file of nobody's group
    assert deputy.can(PLANTER, st, deputy.R) is allowed


def test_what_a_group_or_anyone_may_do() -> None:
    shared = fake_stat(stat.S_IFDIR | 0o2770, 0, 4242)
    assert deputy.may(("group", 4242), shared, deputy.W | deputy.X)
    assert not deputy.may(("group", 4243), shared, deputy.X)
    assert not deputy.may(deputy.ANYONE, shared, deputy.X)
    assert not deputy.may(("group", 4242), fake_stat(stat.S_IFDIR | 0o2710, 0, 4242), deputy.W)
    assert deputy.may(("user", 7), fake_stat(stat.S_IFDIR | 0o0700, 7), deputy.W | deputy.X)
    assert deputy.may(deputy.ANYONE, fake_stat(stat.S_IFDIR | 0o0703, 0), deputy.W | deputy.X)


def test_a_relative_path_is_walked_from_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "mine").symlink_to("real")
    monkeypatch.chdir(tmp_path)
    assert links.resolve("mine/new.zarr", "OUT") == str(tmp_path / "real" / "new.zarr")
    assert links.resolve("mine/../x/../y.zarr", "OUT") == str(tmp_path / "y.zarr")


@needs_root
def test_the_walk_itself_refuses_a_planted_link(site: Path) -> None:
    as_planter("ln", "-s", str(site / "private" / "target"), str(site / "shared" / "out.zarr"))
    given = str(site / "shared" / "out.zarr")
    with pytest.raises(UnsafeOutputError) as refused_:
        links.resolve(given, "OUT")
    assert str(refused_.value).startswith(f"OUT ({given}): {given} is a symbolic link owned by")
    with pytest.raises(UnsafeOutputError):
        links.open_folder(given + "/x", "OUT")
    untouched(site)


@needs_root
def test_the_walk_itself_writes_through_a_placers_link_only_where_they_could(
    site: Path,
) -> None:
    own = site / "shared" / "theirs"
    as_planter("mkdir", "-m", "755", str(own))
    as_planter("ln", "-s", str(site / "private"), str(own / "p"))
    scratch = site / "scratch"
    scratch.mkdir()
    os.chmod(scratch, 0o777)
    as_planter("ln", "-s", str(scratch), str(own / "s"))
    given = f"{own}/p/o.zarr"
    with pytest.raises(UnsafeOutputError) as refused_:
        links.resolve(given, "OUT")
    assert str(refused_.value).startswith(
        f"OUT ({given}): the way there passes {own}/p, a symbolic link made by nobody"
    )
    assert f"leading to {site}/private, which nobody (uid {PLANTER}) cannot write" in str(
        refused_.value
    )
    assert links.resolve(f"{own}/s/o.zarr", "OUT") == f"{scratch}/o.zarr"
    os.chmod(site / "private", 0o777)  # they could write it now, but not reach it:
    os.chmod(site, 0o751)
    with pytest.raises(UnsafeOutputError, match="cannot write"):
        links.resolve(f"{own}/p/target/o.zarr", "OUT")


@needs_root
def test_the_read_check_itself_names_the_placer_and_what_shuts_them_out(site: Path) -> None:
    chunk = first_chunk(planters_input(site), 3)
    chunk.unlink()
    os.rename(site / "private" / "secret", chunk)
    os.chmod(chunk, 0o644)
    assert deputy.refusal(str(chunk), os.stat(chunk)) is None  # they may read it: fine
    os.chmod(chunk, 0o600)
    said = deputy.refusal(str(chunk), os.stat(chunk)) or ""
    assert said.startswith(f"reached through {site}/shared/in.zarr, which nobody (uid {PLANTER})")
    assert "mode 0600, owner root (uid 0)" in said
    os.chmod(chunk, 0o644)
    os.chmod(chunk.parent, 0o700)
    os.chown(chunk.parent, 0, 0)  # root's folder now, in theirs: shut to them
    said = deputy.refusal(str(chunk), os.stat(chunk)) or ""
    assert f"the folder {chunk.parent} is shut to them" in said

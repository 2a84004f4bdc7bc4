"""A second user in the shared folder: every attack kind of tests/pipeline/fuzz_planter.py once,
then random seeds of two steps each. Root runs multiply, gram, --report and --accumulate while
uid 65534 plants links, folders, files and archives before and during the job; nothing only
root could change changes, no secret value reaches anything the planter can read, and exit 0
never follows a planter's link. ``make fuzz`` draws new seeds for longer. The checker's own
tests come first: a fuzzer that sees nothing passes everything."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from tests.pipeline.fuzz_planter import KINDS, build_case, hardlinks_protected, run_case
from tests.pipeline.fuzz_tree import MiB, Run
from tests.pipeline.planter import PLANTER_GID, PLANTER_UID, plant
from tests.pipeline.planter_checks import (
    MARKER,
    SECRET,
    link_verdicts,
    root_only_changes,
    secret_leaks,
    snapshot,
    written_into_planters,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the planter is a child that drops from root to uid 65534: run as root",
)
SEEDS = range(12)
COMMAND_TIMEOUT_S = 20.0
"""A clean command takes about a second; one still running after this hangs."""


def _secret_out(path: Path, values: np.ndarray[Any, Any], compressed: bool) -> None:
    zarr.create_array(
        str(path), data=values, chunks=(8, 8), compressors="auto" if compressed else None
    )


def _done() -> Run:
    return Run(rc=0, seconds=1.0, max_rss_bytes=80 * MiB, stderr="")


def test_the_planter_is_another_user(tmp_path: Path) -> None:
    case = build_case(tmp_path / "case", 0)
    done = plant(
        case.shared,
        [
            ("symlink", "../private/data", "mine"),
            ("read", "../private/data/notes.txt"),
            ("mkdir", "../private/data/x", 0o755),
            ("hardlink", "../private/data/notes.txt", "hard"),
        ],
    )
    assert [d.error is None for d in done] == [True, False, False, False], done
    st = os.lstat(case.shared / "mine")
    assert (st.st_uid, st.st_gid) == (PLANTER_UID, PLANTER_GID)


@pytest.mark.parametrize("compressed", [False, True])
def test_checker_sees_a_secret_in_out(tmp_path: Path, compressed: bool) -> None:
    before = snapshot(tmp_path)
    _secret_out(tmp_path / "shared" / "out.zarr", SECRET.reshape(16, 8), compressed)
    found = secret_leaks(tmp_path, before, snapshot(tmp_path), {})
    assert "shared/out.zarr decodes to 128 values derived from the secret" in " ".join(found)
    if not compressed:  # its chunks' raw bytes show it too
        assert any(f.startswith("shared/out.zarr/c/0/0 holds the secret float64") for f in found)


def test_checker_sees_a_gram_of_the_secret_and_the_secret_in_text(tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    square = SECRET[:64].reshape(8, 8) ** 2  # no secret value, but none of ours is as large
    _secret_out(tmp_path / "g.zarr", square, compressed=True)
    (tmp_path / "report.html").write_bytes(b"<html>" + MARKER + b"</html>")
    texts = {"stderr": "error: value 7.77e+77 is too large", "stdout": "done"}
    found = secret_leaks(tmp_path, before, snapshot(tmp_path), texts)
    assert [f.split(" ")[0] for f in found] == ["stderr", "report.html", "g.zarr"], found


def test_checker_sees_no_secret_behind_a_planter_link_it_did_not_follow(tmp_path: Path) -> None:
    case = build_case(tmp_path / "case", 0)
    secret = case.root / "private" / "secret.zarr"
    _secret_out(secret, SECRET.reshape(16, 8), compressed=False)
    _secret_out(case.shared / "out.zarr", np.ones((16, 8)), compressed=False)
    before = snapshot(case.root)
    os.remove(case.shared / "out.zarr/c/0/0")
    plant(case.shared, [("symlink", "../../../../private/secret.zarr/c/0/0", "out.zarr/c/0/0")])
    assert secret_leaks(case.root, before, snapshot(case.root), {}) == []


def test_checker_sees_root_only_changes_and_nothing_else(tmp_path: Path) -> None:
    case = build_case(tmp_path / "case", 1)
    plant(case.shared, [("write", "theirs.txt", b"x", 0o644)])
    (case.shared / "root.txt").write_text("root's, in the shared folder\n")
    before = snapshot(case.root)
    (case.root / "private" / "data" / "notes.txt").write_text("overwritten\n")
    (case.root / "private" / "data" / "new.txt").write_text("new\n")
    (case.root / "vault").chmod(0o755)
    (case.shared / "out.zarr").mkdir()  # a new name in a folder the planter can write
    (case.shared / "theirs.txt").write_text("root wrote the planter's file: not root-only\n")
    (case.shared / "root.txt").write_text("root's own target, named through no link\n")
    found = root_only_changes(before, snapshot(case.root), exempt=["shared/root.txt"])
    assert [f.split(":")[0].split(" (")[0] for f in found] == [
        "changed private/data",
        "created private/data/new.txt",
        "changed private/data/notes.txt",
        "changed vault",
    ], found


def test_checker_sees_exit_0_past_a_planter_link_and_a_refusal_without_its_name() -> None:
    way = [("shared/out.zarr", "shared/out.zarr")]
    unreadable = [("shared/a.zarr", "shared/a.zarr/c/0/0", "private/secret.zarr/c/0/0")]
    found = link_verdicts(_done(), way, unreadable)
    assert [f.split(" though ")[0] for f in found] == ["exit 0", "exit 0"], found
    vague = Run(2, 1.0, 80 * MiB, "error: OUT exists\n")
    assert link_verdicts(vague, way, [])[0].startswith("refused, but not naming")
    named = Run(2, 1.0, 80 * MiB, "error: out.zarr is a link owned by nobody (uid 65534)\n")
    assert link_verdicts(named, way, []) == []


def test_checker_sees_root_writing_into_the_planters_folder(tmp_path: Path) -> None:
    case = build_case(tmp_path / "case", 0)
    plant(case.shared, [("mkdir", "out.zarr", 0o755)])
    before = snapshot(case.root)
    (case.shared / "out.zarr" / "zarr.json").write_text("{}")
    found = written_into_planters(case.root, before, snapshot(case.root), ["shared/out.zarr"])
    assert found == ["root wrote into shared/out.zarr, the planter's own dir"]


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A sandbox the planter can reach by path, as a shared project folder is (pytest's
    folders are root's alone: there nobody but root could have planted anything)."""
    with tempfile.TemporaryDirectory(prefix="planter-") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


@pytest.mark.parametrize("kind", KINDS)
def test_attack_is_refused_or_harmless(reachable: Path, kind: str) -> None:
    if kind == "read:hardlink" and hardlinks_protected():
        pytest.skip("fs.protected_hardlinks=1: the kernel refuses the planter this hard link")
    result = run_case(KINDS.index(kind), reachable, 1, COMMAND_TIMEOUT_S, kinds=(kind,))
    if result.violations:
        pytest.fail(result.report(), pytrace=False)


@pytest.mark.parametrize("seed", SEEDS)
def test_planter_case_keeps_the_contract(reachable: Path, seed: int) -> None:
    result = run_case(1000 + seed, reachable, commands=2, timeout_s=COMMAND_TIMEOUT_S)
    if result.violations:
        pytest.fail(result.report(), pytrace=False)

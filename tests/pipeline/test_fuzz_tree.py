"""Hostile trees: fixed seeds of the fuzzer in tests/pipeline/fuzz_tree.py, each a sandbox with
links, FIFOs, devices, sparse 3 GiB files, look-alike names and planted sidecars, and three
random commands on it; nothing outside what a command may write changes, refusals are one
``error:`` line, exit 0 leaves the right numbers, every run ends in time and bounded memory.
``make fuzz`` draws new seeds for longer (FUZZ_MINUTES); a failure there names its seed, to add
here once fixed. The checker's own tests come first: a fuzzer that sees nothing passes
everything."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.pipeline.fuzz_tree import (
    Before,
    Command,
    GiB,
    MiB,
    Run,
    Sandbox,
    check_step,
    describe_tree,
    may_change,
    read_array,
    run_case,
)

SEEDS = range(30)
"""Each runs the CLI three times, sometimes a fourth for an OUT of ours."""
COMMAND_TIMEOUT_S = 30.0
"""Far longer than a clean command takes; one still running after this hangs."""


@pytest.mark.parametrize("seed", SEEDS)
def test_hostile_tree_keeps_the_contract(tmp_path: Path, seed: int) -> None:
    result = run_case(seed, tmp_path, commands=3, timeout_s=COMMAND_TIMEOUT_S)
    if result.violations:
        pytest.fail(result.report(), pytrace=False)


def _sandbox(tmp_path: Path) -> Sandbox:
    (tmp_path / "notes.txt").write_text("years of work\n")
    (tmp_path / "out.zarr").mkdir()
    (tmp_path / "out.zarr" / "2024.06").write_text("mine\n")
    sandbox = Sandbox(tmp_path, random.Random(0), ours={"out.zarr"})
    sandbox.precious.add("out.zarr/2024.06")
    return sandbox


def _refused(stderr: str = "error: no\n") -> Run:
    return Run(rc=2, seconds=0.5, max_rss_bytes=80 * MiB, stderr=stderr)


def test_checker_sees_a_change_outside_out_and_to_foreign_things_inside(tmp_path: Path) -> None:
    sandbox = _sandbox(tmp_path)
    command = Command("overwrite", ("multiply", "a", "b", "out.zarr"), "out.zarr", ("a", "b"))
    before = Before(describe_tree(tmp_path), may_change(sandbox, command), (None, ""))
    (tmp_path / "notes.txt").write_text("overwritten\n")
    (tmp_path / "out.zarr" / "2024.06").unlink()
    (tmp_path / "out.zarr" / "zarr.json").write_text("{}")  # OUT's own: allowed
    found = check_step(sandbox, command, _refused(), before)
    assert [f.split(":")[0] for f in found] == ["changed notes.txt", "changed out.zarr/2024.06"]


def test_checker_allows_nothing_to_verify_and_nothing_in_a_foreign_out(tmp_path: Path) -> None:
    sandbox = _sandbox(tmp_path)
    (tmp_path / "docs").mkdir()
    verify = Command("verify", ("verify", "a", "b", "out.zarr"), None, ("a", "b", "out.zarr"))
    foreign = Command("overwrite", ("multiply", "a", "b", "docs"), "docs", ("a", "b"))
    assert not may_change(sandbox, verify)("out.zarr/zarr.json")
    assert not may_change(sandbox, foreign)("docs/zarr.json")
    new = Command("multiply", ("multiply", "a", "b", "new.zarr"), "new.zarr", ("a", "b"))
    assert may_change(sandbox, new)("new.zarr/c/0/0")


@pytest.mark.parametrize(
    ("run", "violation"),
    [
        # killed at the time bound
        (Run(None, 30.0, 80 * MiB, ""), "hang"),
        # a refusal must be one error line
        (_refused("Traceback (most recent call last):\nerror: no\n"), "a traceback"),
        (_refused("warning: something\n"), "exit 2 whose last stderr line"),
        # a crash by signal
        (Run(-9, 1.0, 80 * MiB, ""), "exit code -9"),
        # memory
        (Run(1, 1.0, 3 * GiB, "error: MemoryError\n"), "MemoryError"),
    ],
)
def test_checker_sees_a_broken_exit(tmp_path: Path, run: Run, violation: str) -> None:
    sandbox = _sandbox(tmp_path)
    command = Command("verify", ("verify", "a", "b", "c"), None, ("a", "b", "c"))
    before = Before(describe_tree(tmp_path), may_change(sandbox, command), (None, ""))
    found = check_step(sandbox, command, run, before)
    assert any(f.startswith(violation) for f in found), found


def test_tree_description_never_opens_fifos_or_reads_big_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block
    with (tmp_path / "sparse").open("wb") as f:
        f.truncate(3 << 30)
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "zero").symlink_to("/dev/zero")
    tree = describe_tree(tmp_path)
    assert tree["loop"] == ("link", "loop") and tree["zero"] == ("link", "/dev/zero")
    assert tree["sparse"][1] == 3 << 30 and tree["fifo"][0] != "file"
    assert read_array(tmp_path) is None

"""Every refusal of the CLI, as a user meets it: `python -m pipeline ...` in a subprocess.

Each refusal exits 2 with exactly one `error:` line on stderr naming the problem and its
numbers or paths, no traceback, and leaves every byte under the test's directory as it was
(inputs untouched, nothing deleted, OUT not created).
"""

from __future__ import annotations

import hashlib
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline.store.output import Output
from tests.helpers import random_matrix, run_cli, write_array

FAST_CLUSTER = (
    *("--workers", "1", "--threads-per-worker", "1"),
    *("--dashboard-address", "127.0.0.1:0", "--no-progress"),
)
"""Options of the commands that do start a local cluster: small, and on a free port."""


def tree_digest(root: Path) -> dict[str, str]:
    """Every file and directory under root, with a hash of each file's bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
        for p in sorted(root.rglob("*"))
    }


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one `error:` line; fails on a traceback or on any second error line."""
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


@dataclass(frozen=True)
class World:
    """Inputs and the odd things users point the CLI at, all under one directory."""

    root: Path

    def __getattr__(self, name: str) -> str:
        return str(self.root / WORLD_PATHS[name])


WORLD_PATHS = {
    "a": "in/a.zarr",  # 6x4 float32
    "b": "in/b.zarr",  # 4x5 float32
    "b_5x2": "in/b_5x2.zarr",  # does not contract with A
    "vector": "in/vector.zarr",  # 1-D, 4 elements
    "cube": "in/cube.zarr",  # 3-D 4x5x2
    "text": "in/text.zarr",  # 4x5 unicode strings
    "dates": "in/dates.zarr",  # 4x5 datetime64
    "group": "in/group.zarr",  # a Zarr group, not an array
    "plain": "in/notes.txt",  # a plain file
    "empty": "in/empty",  # an empty directory
    "missing": "in/missing.zarr",  # nothing there
    "a_in_a": "in/a.zarr/c.zarr",  # OUT inside input A
    "parent": "in",  # OUT that contains both inputs
    "ours": "out/ours.zarr",  # an OUT this tool wrote earlier
    "foreign_dir": "out/results",  # a plain directory with a user's file in it
    "foreign_zarr": "out/foreign.zarr",  # a Zarr array someone else wrote
    "link_to_a": "out/link.zarr",  # a symlink to input A
    "out": "out/c.zarr",  # a fresh OUT
}


@pytest.fixture
def world(tmp_path: Path) -> World:
    rng = np.random.default_rng(0)
    w = World(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    write_array(Path(w.a), random_matrix(rng, (6, 4), "float32"), (3, 2))
    write_array(Path(w.b), random_matrix(rng, (4, 5), "float32"), (2, 5))
    write_array(Path(w.b_5x2), random_matrix(rng, (5, 2), "float32"), (5, 2))
    zarr.create_array(w.vector, data=np.arange(4.0), chunks=(2,))
    zarr.create_array(w.cube, data=np.zeros((4, 5, 2)), chunks=(2, 5, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: string dtypes are not yet in the v3 spec
        zarr.create_array(w.text, data=np.full((4, 5), "x", dtype="U2"), chunks=(2, 5))
    zarr.create_array(w.dates, data=np.zeros((4, 5), dtype="M8[s]"), chunks=(2, 5))
    zarr.create_group(w.group).create_array("x", shape=(4, 5), dtype="float32")
    Path(w.plain).write_text("not an array\n")
    Path(w.empty).mkdir()
    Output(w.ours).create((6, 5), (3, 5), "float32", {"complete": True})
    Path(w.link_to_a).symlink_to(w.a, target_is_directory=True)
    Path(w.foreign_dir).mkdir()
    (Path(w.foreign_dir) / "thesis.tex").write_text("irreplaceable\n")
    write_array(Path(w.foreign_zarr), np.ones((6, 5), dtype="float32"), (3, 5))
    return w


MULTIPLY_REFUSALS = [
    # (id, argv with WORLD_PATHS names for paths, words the error line must contain)
    # OUT is input A itself, or input B given with a trailing slash
    ("out-is-a", ["a", "b", "a"], ["OUT", "input A", "in/a.zarr"]),
    ("out-is-b", ["a", "b", "b/"], ["input B", "in/b.zarr"]),
    # OUT is input A spelled as a file:// URL, or reached through a symlink
    ("out-is-a-url", ["a", "b", "file://a"], ["input A", "in/a.zarr"]),
    ("out-links-to-a", ["a", "b", "link_to_a", "--overwrite"], ["input A", "out/link.zarr"]),
    # OUT inside input A's directory
    ("out-inside-a", ["a", "b", "a_in_a"], ["input A", "in/a.zarr/c.zarr"]),
    # the inputs inside OUT: --overwrite would delete them
    ("inputs-inside-out", ["a", "b", "parent", "--overwrite"], ["overlaps input A", "in/a.zarr"]),
    # OUT exists (written by this tool) and neither --overwrite nor --resume
    ("out-exists", ["a", "b", "ours"], ["out/ours.zarr", "already exists", "--overwrite"]),
    # OUT is a user's plain directory: not replaced even with --overwrite
    ("out-foreign-dir", ["a", "b", "foreign_dir", "--overwrite"], ["out/results", "not a Zarr"]),
    # OUT is a Zarr array this tool did not write: not replaced even with --overwrite
    ("out-foreign-zarr", ["a", "b", "foreign_zarr", "--overwrite"], ["foreign.zarr", "this tool"]),
    # shapes that do not contract: A 6x4, B 5x2
    ("no-contraction", ["a", "b_5x2", "out"], ["6x4", "5x2", "(4)", "(5)"]),
    # non-2-D inputs: 1-D A, 3-D B
    ("a-1d", ["vector", "b", "out"], ["A", "1 dimension", "(4,)"]),
    ("b-3d", ["a", "cube", "out"], ["B", "3 dimension", "(4, 5, 2)"]),
    # non-numeric dtypes: strings, dates
    ("a-strings", ["text", "b", "out"], ["A", "<U2", "not numeric"]),
    ("b-dates", ["a", "dates", "out"], ["B", "datetime64[s]", "not numeric"]),
    # inputs that are not arrays: missing, a group, a plain file, an empty directory
    ("a-missing", ["missing", "b", "out"], ["A", "in/missing.zarr", "does not exist"]),
    ("b-group", ["a", "group", "out"], ["B", "in/group.zarr", "group"]),
    ("a-plain-file", ["plain", "b", "out"], ["A", "in/notes.txt", "holds no Zarr array"]),
    ("b-empty-dir", ["a", "empty", "out"], ["B", "in/empty", "holds no Zarr array"]),
    # a memory limit no plan fits: 1 MB = 976.6 KiB per worker
    ("memory-too-small", ["a", "b", "out", "--memory-limit", "1MB"], ["976.6 KiB", "MiB"]),
    # decoding on the GPU with a CPU backend
    (
        "gpu-decode-on-cpu",
        ["a", "b", "out", "--backend", "cpu", "--gpu-decode"],
        ["--gpu-decode", "--backend cuda or emulated", "not cpu"],
    ),
    # sizes and counts that do not parse
    ("memory-unreadable", ["a", "b", "out", "--memory-limit", "lots"], ["'lots'"]),
    ("memory-negative", ["a", "b", "out", "--memory-limit=-4GiB"], ["'-4GiB'"]),
    ("zero-workers", ["a", "b", "out", "--workers", "0"], ["--workers", "'0'"]),
    # --overwrite and --resume exclude each other
    ("overwrite-and-resume", ["a", "b", "ours", "--overwrite", "--resume"], ["--resume"]),
    # an unknown backend
    ("unknown-backend", ["a", "b", "out", "--backend", "gpu"], ["--backend", "'gpu'"]),
    # a storage option that is not KEY=VALUE
    ("bad-storage-option", ["a", "b", "out", "--storage-option", "anon"], ["'anon'", "KEY=VALUE"]),
]


def resolve(world: World, argv: list[str]) -> list[str]:
    """WORLD_PATHS names to paths, keeping a "file://" prefix and a trailing "/"."""
    out = []
    for token in argv:
        prefix = "file://" if token.startswith("file://") else ""
        name = token.removeprefix(prefix).rstrip("/")
        suffix = token[len(prefix + name) :]
        out.append(prefix + getattr(world, name) + suffix if name in WORLD_PATHS else token)
    return out


@pytest.mark.parametrize(
    ("argv", "expected"), [pytest.param(*case[1:], id=case[0]) for case in MULTIPLY_REFUSALS]
)
def test_multiply_refusals(world: World, argv: list[str], expected: list[str]) -> None:
    before = tree_digest(world.root)
    done = run_cli("multiply", *resolve(world, argv), "--no-progress")
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    message = error_line(done)
    for word in expected:
        assert word in message, f"{word!r} not in {message!r}"
    assert tree_digest(world.root) == before, "a refusal changed, created or deleted files"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # --shape not MxN
        (["--shape", "4by4", "--chunks", "2x2"], ["'4by4'", "MxN"]),
        (["--shape", "4x", "--chunks", "2x2"], ["'4x'"]),
        (["--shape", "4x4x4", "--chunks", "2x2"], ["'4x4x4'"]),
        # a negative size
        (["--shape=-3x4", "--chunks", "2x2"], ["'-3x4'", "negative"]),
        # --chunks not RxC, or empty chunks
        (["--shape", "4x4", "--chunks", "two"], ["'two'"]),
        (["--shape", "4x4", "--chunks", "0x2"], ["--chunks", "0x2", "1x1"]),
        # a non-numeric dtype
        (["--shape", "4x4", "--chunks", "2x2", "--dtype", "str"], ["str", "numeric"]),
        # shape and chunks are required
        (["--chunks", "2x2"], ["--shape"]),
    ],
)
def test_random_refusals(tmp_path: Path, options: list[str], expected: list[str]) -> None:
    out = tmp_path / "r.zarr"
    done = run_cli("random", str(out), *options)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    message = error_line(done)
    for word in expected:
        assert word in message, f"{word!r} not in {message!r}"
    assert not out.exists()


def test_random_refuses_to_replace_without_overwrite(world: World) -> None:
    before = tree_digest(world.root)
    done = run_cli("random", world.ours, "--shape", "2x2", "--chunks", "1x1")
    assert done.returncode == 2, done.stderr
    assert "out/ours.zarr" in error_line(done)
    assert tree_digest(world.root) == before


def test_dry_run_prints_the_plan_and_writes_nothing(world: World) -> None:
    before = tree_digest(world.root)
    done = run_cli("multiply", world.a, world.b, world.out, "--dry-run", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "6x4 @ 4x5 -> 6x5 float32" in done.stdout
    assert "tiles" in done.stdout
    assert not Path(world.out).exists()
    assert tree_digest(world.root) == before


def test_dry_run_still_refuses(world: World) -> None:
    done = run_cli("multiply", world.a, world.b_5x2, world.out, "--dry-run")
    assert done.returncode == 2
    assert "6x4" in error_line(done)
    assert done.stdout == ""


def _write_product(world: World, path: str, error: float = 0.0) -> None:
    a = np.asarray(zarr.open_array(world.a, mode="r")[:])
    b = np.asarray(zarr.open_array(world.b, mode="r")[:])
    c = (a.astype("float64") @ b.astype("float64")).astype("float32")
    c[3, 4] += np.float32(error)
    write_array(Path(path), c, (3, 5))


@pytest.mark.parametrize(
    ("error", "code"),
    [
        # a correct product (float64, rounded to float32)
        (0.0, 0),
        # one element off by 1.0
        (1.0, 1),
    ],
)
def test_verify_exit_codes(world: World, error: float, code: int) -> None:
    _write_product(world, world.out, error)
    before = tree_digest(world.root)
    done = run_cli("verify", world.a, world.b, world.out, *FAST_CLUSTER)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if code:
        assert "3:6" in error_line(done)  # the row block (A's chunk) holding row 3
    else:
        assert "verify ok" in done.stdout
    assert tree_digest(world.root) == before, "verify wrote something"


def test_verify_refuses_a_c_of_the_wrong_shape(world: World) -> None:
    write_array(Path(world.out), np.zeros((6, 4), dtype="float32"), (3, 4))
    done = run_cli("verify", world.a, world.b, world.out, *FAST_CLUSTER)
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = error_line(done)
    for word in ("A 6x4", "B 4x5", "C 6x4", "6x5"):
        assert word in message, message

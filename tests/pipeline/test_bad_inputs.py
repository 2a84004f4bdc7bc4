"""Hidden bad inputs, as a user meets them (`python -m pipeline multiply` in a subprocess).

Each exits with the contract's code (2: bad input or usage) and exactly one `error:` line on
stderr naming the input, the numbers and the fix, without a traceback (nor the workers' task
logs), and leaves every byte under the inputs' directory as it was. The refusals a user meets
first (missing paths, groups, ranks, dtypes, shapes, memory) are in test_cli_refusals.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from cluster.lifecycle import CONNECT_TIMEOUT_S
from pipeline.store.record import of_array
from tests.helpers import assert_product, file_modes_bind, random_matrix, run_cli, write_array

CLUSTER = ("--dashboard-address", "127.0.0.1:0", "--no-progress")


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under root: a file's hash, a symlink's target, or "/" for a directory."""
    digest = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            digest[str(p.relative_to(root))] = "-> " + os.readlink(p)
        elif p.is_file():
            digest[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            digest[str(p.relative_to(root))] = "/"
    return digest


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one `error:` line; fails on a traceback, a worker's task log or a second error."""
    assert "Traceback" not in done.stderr, done.stderr
    assert "Compute Failed" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def assert_refused(done: subprocess.CompletedProcess[str], code: int, words: list[str]) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    message = error_line(done)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """in/a.zarr 6x4 (3x2 chunks), in/b.zarr 4x5 (2x5 chunks), in/a2.zarr: A as Zarr v2."""
    rng = np.random.default_rng(0)
    root = tmp_path / "in"
    root.mkdir()
    a = random_matrix(rng, (6, 4), "float32")
    write_array(root / "a.zarr", a, (3, 2))
    write_array(root / "b.zarr", random_matrix(rng, (4, 5), "float32"), (2, 5))
    write_array(root / "a2.zarr", a, (3, 2), zarr_format=2)
    return root


# What goes wrong with one stored chunk file.
DAMAGE: dict[str, Callable[[Path], None]] = {
    "garbage": lambda f: f.write_bytes(bytes(range(7, 247, 3))),
    "truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
    "empty": lambda f: f.write_bytes(b""),
    # Unreadable as root too (a mode of 000 is not): a symlink to itself, ELOOP on open.
    "unreadable": lambda f: (f.unlink(), f.symlink_to(f.name)),
}


@pytest.mark.parametrize(
    ("array", "chunk", "damage", "cluster", "words"),
    [
        # random bytes in A's chunk (1, 0): rows 3:6, columns 0:2
        pytest.param(
            "a.zarr",
            "c/1/0",
            "garbage",
            [],
            ["A (", "a.zarr/c/1/0", "rows 3:6, columns 0:2"],
            id="a-garbage",
        ),
        # the same, in a worker process: the error crosses the process boundary intact
        pytest.param(
            "a.zarr",
            "c/1/0",
            "garbage",
            ["--workers", "2"],
            ["A (", "a.zarr/c/1/0"],
            id="a-garbage-worker-processes",
        ),
        # A's chunk cut in half (a copy that failed midway), or emptied
        pytest.param(
            "a.zarr",
            "c/0/1",
            "truncated",
            [],
            ["A (", "a.zarr/c/0/1", "rows 0:3, columns 2:4"],
            id="a-truncated",
        ),
        pytest.param("a.zarr", "c/1/1", "empty", [], ["A (", "a.zarr/c/1/1"], id="a-empty"),
        # A's chunk cannot be opened at all
        pytest.param(
            "a.zarr",
            "c/1/0",
            "unreadable",
            [],
            ["A (", "a.zarr/c/1/0", "symbolic links"],
            id="a-unreadable",
        ),
        # a Zarr v2 input: the chunk is named by its v2 key
        pytest.param(
            "a2.zarr", "1.0", "garbage", [], ["A (", "a2.zarr/1.0", "rows 3:6"], id="a-v2-garbage"
        ),
        # B's chunk (1, 0): rows 2:4, columns 0:5
        pytest.param(
            "b.zarr",
            "c/1/0",
            "garbage",
            [],
            ["B (", "b.zarr/c/1/0", "rows 2:4, columns 0:5"],
            id="b-garbage",
        ),
    ],
)
def test_bad_chunk_is_named(
    inputs: Path, array: str, chunk: str, damage: str, cluster: list[str], words: list[str]
) -> None:
    DAMAGE[damage](inputs / array / chunk)
    before = tree_digest(inputs)
    a, b = str(inputs / ("a.zarr" if array == "b.zarr" else array)), str(inputs / "b.zarr")
    out = inputs.parent / "c.zarr"
    done = run_cli("multiply", a, b, str(out), *CLUSTER, *cluster)
    assert_refused(done, 2, [*words, "cannot be read", "restore that chunk", "--resume"])
    assert tree_digest(inputs) == before, "an input changed"
    assert of_array(zarr.open_array(str(out), mode="r")).complete is False


def test_restored_chunk_then_resume_finishes(inputs: Path) -> None:
    # The error says: restore that chunk, then rerun with --resume. Do that.
    chunk = inputs / "a.zarr" / "c" / "1" / "0"
    good = chunk.read_bytes()
    DAMAGE["garbage"](chunk)
    out = inputs.parent / "c.zarr"
    argv = ("multiply", str(inputs / "a.zarr"), str(inputs / "b.zarr"), str(out), *CLUSTER)
    assert run_cli(*argv).returncode == 2
    chunk.write_bytes(good)
    done = run_cli(*argv, "--resume")
    assert done.returncode == 0, done.stderr
    a, b = (zarr.open_array(str(inputs / n), mode="r")[:] for n in ("a.zarr", "b.zarr"))
    assert_product(zarr.open_array(str(out), mode="r")[:], np.asarray(a), np.asarray(b))


def _loop(root: Path) -> str:
    (root / "loop.zarr").symlink_to("loop.zarr")
    return str(root / "loop.zarr")


def _dangling(root: Path) -> str:
    (root / "gone.zarr").symlink_to(root / "moved-away.zarr")
    return str(root / "gone.zarr")


def _unreadable_metadata(root: Path) -> str:
    shutil.copytree(root / "a.zarr", root / "m.zarr")
    (root / "m.zarr" / "zarr.json").unlink()
    (root / "m.zarr" / "zarr.json").symlink_to("zarr.json")
    return str(root / "m.zarr")


def _zero_chunks(root: Path) -> str:
    """Metadata with a chunk dimension of 0 (zarr refuses to create it, but opens it)."""
    shutil.copytree(root / "a.zarr", root / "z.zarr")
    meta = json.loads((root / "z.zarr" / "zarr.json").read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [0, 2]
    (root / "z.zarr" / "zarr.json").write_text(json.dumps(meta))
    return str(root / "z.zarr")


NO_AWS: dict[str, str | None] = {
    "AWS_ACCESS_KEY_ID": None,
    "AWS_SECRET_ACCESS_KEY": None,
    "AWS_SESSION_TOKEN": None,
    "AWS_PROFILE": None,
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_MAX_ATTEMPTS": "1",
}
"""No credentials from anywhere (environment, files, instance metadata); botocore tries a
dead endpoint once, not 5 times with back-off (the error is the same, 4 s sooner)."""
DEAD_ENDPOINT = ("--storage-option", "endpoint_url=http://127.0.0.1:9")
"""Loopback port 9 (discard): nothing listens, connections are refused at once."""
FAKE_KEYS = ("--storage-option", "key=k", "--storage-option", "secret=s")
needs_s3fs = pytest.mark.skipif(
    importlib.util.find_spec("s3fs") is None, reason="s3fs is not installed"
)


@pytest.mark.parametrize(
    ("a", "extra", "words"),
    [
        # A is a symlink to itself, or to nothing
        pytest.param(_loop, [], ["A (", "loop.zarr", "symbolic link"], id="a-symlink-loop"),
        pytest.param(_dangling, [], ["A (", "gone.zarr", "symbolic link"], id="a-dangling-link"),
        # A's metadata cannot be opened
        pytest.param(
            _unreadable_metadata, [], ["A (", "m.zarr", "zarr.json"], id="a-unreadable-metadata"
        ),
        # A's metadata says its chunks are 0x2
        pytest.param(_zero_chunks, [], ["A has chunks 0x2", "at least 1x1"], id="a-zero-chunk"),
        # A's URL has a protocol fsspec does not know
        pytest.param("foo://x", [], ["A (foo://x)", "'foo://'"], id="a-unknown-protocol"),
        # OUT's URL has a protocol fsspec does not know
        pytest.param(None, ["--out", "foo://y"], ["OUT (foo://y)", "'foo://'"], id="out-protocol"),
        # A on S3 without any credentials
        pytest.param(
            "s3://bucket/a.zarr",
            [*DEAD_ENDPOINT],
            ["A (s3://bucket/a.zarr)", "credentials", "anon=true"],
            id="s3-no-credentials",
            marks=needs_s3fs,
        ),
        # A on S3 with credentials, at an endpoint that refuses connections
        pytest.param(
            "s3://bucket/a.zarr",
            [*DEAD_ENDPOINT, *FAKE_KEYS],
            ["A (s3://bucket/a.zarr)", "http://127.0.0.1:9", "did not answer", "endpoint_url"],
            id="s3-dead-endpoint",
            marks=needs_s3fs,
        ),
        # OUT on S3 without any credentials
        pytest.param(
            None,
            ["--out", "s3://bucket/c.zarr", *DEAD_ENDPOINT],
            ["OUT (s3://bucket/c.zarr)", "credentials"],
            id="s3-out-no-credentials",
            marks=needs_s3fs,
        ),
        # a storage option the S3 file system does not take
        pytest.param(
            "s3://bucket/a.zarr",
            [*DEAD_ENDPOINT, *FAKE_KEYS, "--storage-option", "retries=1"],
            ["A (s3://bucket/a.zarr)", "'retries'", "--storage-option"],
            id="s3-unknown-option",
            marks=needs_s3fs,
        ),
        # schedulers that cannot be reached: no port, a host that cannot exist
        pytest.param(
            None, ["--scheduler", "nonsense"], ["nonsense", "port"], id="scheduler-no-port"
        ),
        pytest.param(
            None,
            ["--scheduler", "tcp://256.1.1.1:1"],
            ["tcp://256.1.1.1:1", "check the address"],
            id="scheduler-bad-host",
        ),
        # a memory limit of nothing
        pytest.param(None, ["--memory-limit", "0"], ["--memory-limit", "'0'"], id="memory-zero"),
    ],
)
def test_refused_before_any_work(
    inputs: Path, a: Callable[[Path], str] | str | None, extra: list[str], words: list[str]
) -> None:
    a_url = a(inputs) if callable(a) else a or str(inputs / "a.zarr")
    out, options = str(inputs.parent / "c.zarr"), list(extra)
    if "--out" in options:
        at = options.index("--out")
        out, options = options[at + 1], options[:at] + options[at + 2 :]
    before = tree_digest(inputs)
    started = time.monotonic()
    done = run_cli("multiply", a_url, str(inputs / "b.zarr"), out, *CLUSTER, *options, env=NO_AWS)
    assert_refused(done, 2, words)
    if "--scheduler" in options:  # a host that cannot resolve: no waiting for the timeout
        assert time.monotonic() - started < CONNECT_TIMEOUT_S, "waited for the connect timeout"
    assert tree_digest(inputs) == before, "an input changed"
    assert not (inputs.parent / "c.zarr").exists(), "OUT was created"


@needs_s3fs
def test_s3_profile_that_does_not_exist(inputs: Path) -> None:
    before = tree_digest(inputs)
    a, b, out = "s3://bucket/a.zarr", str(inputs / "b.zarr"), str(inputs.parent / "c.zarr")
    env = {**NO_AWS, "AWS_PROFILE": "no-such-profile"}
    done = run_cli("multiply", a, b, out, *CLUSTER, *DEAD_ENDPOINT, env=env)
    assert_refused(done, 2, ["A (s3://bucket/a.zarr)", "no-such-profile", "AWS_PROFILE"])
    assert tree_digest(inputs) == before


def test_empty_0x0_product(tmp_path: Path) -> None:
    a = write_array(tmp_path / "a.zarr", np.zeros((0, 0), dtype="float32"), (1, 1))
    out = tmp_path / "c.zarr"
    done = run_cli("multiply", a, a, str(out), *CLUSTER)
    assert done.returncode == 0, done.stderr
    assert "tiles computed 0, skipped 0" in done.stdout
    c = zarr.open_array(str(out), mode="r")
    assert c.shape == (0, 0) and c.dtype == np.float32
    assert of_array(c).complete is True


@pytest.mark.parametrize(
    ("path", "words"),
    [
        # A's chunk (1, 0) without read permission
        ("c/1/0", ["A (", "a.zarr/c/1/0", "PermissionError"]),
        # A's metadata without read permission
        ("zarr.json", ["A (", "a.zarr", "Permission denied"]),
    ],
)
def test_unreadable_files(inputs: Path, path: str, words: list[str]) -> None:
    """As root (how CI runs) too: the job runs without the capabilities that ignore modes."""
    prefix = file_modes_bind()
    if prefix is None:
        pytest.skip("root here cannot drop CAP_DAC_OVERRIDE (setpriv missing or refused)")
    target = inputs / "a.zarr" / path
    before = tree_digest(inputs)
    target.chmod(0)
    try:
        out = inputs.parent / "c.zarr"
        done = run_cli(
            "multiply", str(inputs / "a.zarr"), str(inputs / "b.zarr"), str(out), *CLUSTER,
            prefix=prefix,
        )  # fmt: skip
    finally:
        target.chmod(0o644)
    assert_refused(done, 2, words)
    assert tree_digest(inputs) == before, "an input changed"

"""What A, B and OUT may be: paths, os.PathLike, file:// and zip:// URLs, zarr.Array objects;
what is refused (in-memory stores, archives as OUT, other types) and how."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client
from zarr.storage import FsspecStore, LocalStore, MemoryStore, ZipStore

from pipeline import multiply, prepare
from pipeline.errors import (
    ArgumentTypeError,
    OutputExistsError,
    PipelineError,
    UnsafeOutputError,
    UsageError,
)
from pipeline.store.locate import _array_location, merge_options
from tests.helpers import assert_product, random_matrix, run_cli, write_array

FAST = ("--workers", "1", "--threads-per-worker", "1", "--dashboard-address", "127.0.0.1:0")


@pytest.fixture
def ab(tmp_path: Path) -> tuple[Any, Any, str, str]:
    rng = np.random.default_rng(0)
    a, b = random_matrix(rng, (30, 20), "float32"), random_matrix(rng, (20, 25), "float32")
    return (
        a,
        b,
        write_array(tmp_path / "a.zarr", a, (8, 8)),
        write_array(tmp_path / "b.zarr", b, (8, 8)),
    )


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_arrays_and_pathlike(tmp_path: Path, client: Client, ab: tuple[Any, Any, str, str]) -> None:
    a, b, a_url, b_url = ab
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_array("b", data=b, chunks=(5, 5))
    result = multiply(
        zarr.open_array(a_url, mode="r"), group["b"], tmp_path / "c.zarr", client=client
    )
    assert_product(zarr.open_array(str(tmp_path / "c.zarr"))[:], a, b)
    assert result.plan.b.chunks == (5, 5)  # B really is the group's array


def test_file_urls(tmp_path: Path, ab: tuple[Any, Any, str, str]) -> None:
    """file:// URLs, OUT's included, run as plain paths do (no raw FileNotFoundError)."""
    a, b, a_url, b_url = ab
    out = tmp_path / "c.zarr"
    done = run_cli("multiply", f"file://{a_url}", f"file://{b_url}", f"file://{out}", *FAST)
    assert done.returncode == 0, done.stderr
    assert_product(zarr.open_array(str(out))[:], a, b)


def test_zip_inputs(tmp_path: Path, client: Client, ab: tuple[Any, Any, str, str]) -> None:
    a, b, _, _ = ab
    archive = tmp_path / "inputs.zip"
    with ZipStore(str(archive), mode="w") as store:
        zarr.create_array(store, name="A", data=a, chunks=(8, 8))
        zarr.create_array(store, name="B", data=b, chunks=(8, 8))
    out = tmp_path / "c.zarr"
    multiply(f"zip://A::{archive}", f"zip://B::file://{archive}", str(out), client=client)
    assert_product(zarr.open_array(str(out))[:], a, b)
    with ZipStore(str(archive), mode="r") as store:  # zarr's own zip store, as an array
        a_array = zarr.open_array(store, path="A", mode="r")
        multiply(a_array, f"zip://B::{archive}", str(out), client=client, overwrite=True)
    assert_product(zarr.open_array(str(out))[:], a, b)
    with pytest.raises(PipelineError, match=r"is a zip archive; address the array inside it as"):
        prepare(str(archive), f"zip://B::{archive}", str(tmp_path / "d.zarr"))


@pytest.mark.parametrize(
    ("out", "words"),
    [
        ("c.zip", "is an archive, which can't take concurrent writers"),
        ("zip://c::{tmp}/x.zip", "is an archive, which can't take concurrent writers"),
        ("memory://c.zarr", "is in memory://, which each process has its own copy of"),
        ("https://example.com/c.zarr", "is read-only over https://"),
    ],
)
def test_outs_that_cant_take_the_writers(
    tmp_path: Path, ab: tuple[Any, Any, str, str], out: str, words: str
) -> None:
    _, _, a_url, b_url = ab
    target = (
        out.format(tmp=tmp_path) if "{" in out else str(tmp_path / out) if "://" not in out else out
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_cli("multiply", a_url, b_url, target, *FAST)
    assert done.returncode == 2, done.stderr
    assert words in one_error(done)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ([[1.0, 2.0]], "builtins.list"),  # numpy and dask arrays: test_api_arrays.py
        (b"a.zarr", "builtins.bytes"),
        (42, "builtins.int"),
        (None, "builtins.NoneType"),
    ],
)
def test_other_types_are_refused_naming_the_accepted_forms(
    ab: tuple[Any, Any, str, str], tmp_path: Path, value: object, kind: str
) -> None:
    _, _, a_url, b_url = ab
    accepted = r"give a path \(str or os\.PathLike\), an fsspec URL .*, or a zarr\.Array"
    for args, name in (((value, b_url, "c.zarr"), "A"), ((a_url, b_url, value), "OUT")):
        with pytest.raises(TypeError, match=rf"{name} is a {kind}; {accepted}") as caught:
            prepare(*args)
        assert isinstance(caught.value, ArgumentTypeError | UsageError)


def test_in_memory_arrays_are_refused(ab: tuple[Any, Any, str, str], tmp_path: Path) -> None:
    _, b, a_url, b_url = ab
    in_memory = zarr.create_array(MemoryStore(), data=b, chunks=(8, 8))
    with pytest.raises(
        UsageError, match=r"B is a zarr.Array in memory \(a MemoryStore\), which the"
    ):
        prepare(a_url, in_memory, str(tmp_path / "c.zarr"))
    with pytest.raises(UsageError, match=r"A \(memory://a\.zarr\) is in memory://"):
        prepare("memory://a.zarr", b_url, str(tmp_path / "c.zarr"))


def test_an_array_as_out(tmp_path: Path, client: Client, ab: tuple[Any, Any, str, str]) -> None:
    """An array object as OUT is one this tool wrote, replaced or finished: never another."""
    a, b, a_url, b_url = ab
    foreign = zarr.create_array(str(tmp_path / "mine.zarr"), shape=(30, 25), dtype="float32")
    with pytest.raises(UnsafeOutputError, match=r"OUT is a zarr\.Array .* this tool did not write"):
        prepare(a_url, b_url, foreign)
    assert (tmp_path / "mine.zarr").exists()  # never deleted
    multiply(a_url, b_url, str(tmp_path / "c.zarr"), client=client)
    ours = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")
    with pytest.raises(OutputExistsError, match="pass overwrite=True to replace it or resume=True"):
        multiply(a_url, b_url, ours, client=client)
    resumed = multiply(a_url, b_url, ours, client=client, resume=True)
    assert resumed.tiles_computed == 0 and resumed.tiles_skipped == resumed.plan.n_tiles
    again = multiply(a_url, b_url, ours, client=client, overwrite=True)
    assert again.tiles_computed == again.plan.n_tiles
    assert_product(zarr.open_array(str(tmp_path / "c.zarr"))[:], a, b)


def test_store_locations(tmp_path: Path) -> None:
    """How each zarr store becomes a URL and options the workers can open."""

    def array(store: object, path: str = "") -> Any:
        return SimpleNamespace(store=store, path=path)

    assert _array_location(array(LocalStore(str(tmp_path)), "g/a"), "A") == (f"{tmp_path}/g/a", {})
    local = FsspecStore.from_url(f"file://{tmp_path}/a.zarr", read_only=True)  # wrapped, sync fs
    assert _array_location(array(local), "A") == (str(tmp_path / "a.zarr"), {})
    s3fs = pytest.importorskip("s3fs")
    remote = s3fs.S3FileSystem(anon=False, endpoint_url="http://127.0.0.1:9", asynchronous=True)
    s3 = FsspecStore(fs=remote, path="bucket/ds.zarr", read_only=True)
    url, options = _array_location(array(s3, "A"), "A")
    assert url == "s3://bucket/ds.zarr/A"
    assert options["endpoint_url"] == "http://127.0.0.1:9" and "asynchronous" not in options


def test_options_are_merged_or_refused() -> None:
    merged = merge_options([("storage_options=", {"anon": True}), ("A", {"anon": True, "x": 1})])
    assert merged == {"anon": True, "x": 1}
    with pytest.raises(UsageError, match=r"A and B disagree on the storage option 'endpoint_url'"):
        merge_options([("A", {"endpoint_url": "http://a"}), ("B", {"endpoint_url": "http://b"})])

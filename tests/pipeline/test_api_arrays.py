"""numpy and dask arrays as the API's A, B and X: copied once to a private temporary Zarr array
(pipeline.store.in_memory), refused with their bytes where they do not fit, removed with the
job; and the result's handles on OUT (open, to_dask, to_xarray)."""

from __future__ import annotations

import gc
import os
import stat
import sys
import tempfile
import warnings
from collections import namedtuple
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client

import pipeline
from cluster.spec import ClusterSpec
from pipeline.errors import (
    COPY_FOLDER_PREFIX,
    ArgumentTypeError,
    InputError,
    InputUnreachableError,
    MissingPackageError,
    UsageError,
)
from pipeline.options.job_options import MultiplyResult
from pipeline.store import in_memory, inputs
from tests.helpers import assert_product, random_matrix, write_array


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tempfile's folder for this test alone, so its copies can be counted."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def copies_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(COPY_FOLDER_PREFIX))


def stored(path: Path, rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> Any:
    data = random_matrix(rng, shape, dtype)
    write_array(path, data, (16, 16))
    return data


# ---------------------------------------------------------------------------------------------
# The common case, end to end: a projection in memory against a stored X, as B and as A


def test_a_projection_in_memory_as_b_and_as_a(tmp_path: Path, temp: Path, client: Client) -> None:
    """As B on the local cluster the API starts (client=None), verified; as A on one of ours."""
    rng = np.random.default_rng(1)
    x = stored(tmp_path / "x.zarr", rng, (50, 256), "float32")
    xt = stored(tmp_path / "xt.zarr", rng, (12, 50), "float32")
    proj = random_matrix(rng, (256, 12), "float32")
    local = ClusterSpec(workers=1, threads_per_worker=1, dashboard_address="127.0.0.1:0")
    result = pipeline.multiply(
        str(tmp_path / "x.zarr"), proj, str(tmp_path / "p.zarr"), cluster=local, verify=True
    )
    assert_product(result.open()[:], x, proj)
    assert result.verified is True
    result = pipeline.multiply(
        proj, str(tmp_path / "xt.zarr"), str(tmp_path / "q.zarr"), client=client
    )
    assert_product(result.open()[:], proj, xt)
    assert copies_in(temp) == []  # removed once each job ran
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "p.zarr",
        "q.zarr",
        "tmp",
        "x.zarr",
        "xt.zarr",
    ]


def test_correlation_of_embeddings_in_memory(temp: Path, tmp_path: Path, client: Client) -> None:
    """gram(np_array, scale=True) is np.corrcoef of its columns in float64, to float32's
    error; X given once is copied once."""
    rng = np.random.default_rng(2)
    embeddings = (rng.standard_normal((300, 24)) + rng.uniform(-3, 3, 24)).astype(np.float32)
    job = pipeline.prepare_gram(embeddings, str(tmp_path / "g.zarr"), scale=True)
    assert job.operands is not None and list(job.operands.copies) == ["X"]
    assert repr(job).startswith("<MatmulJob gram X (numpy array)ᵀ @ X (numpy array) -> /")
    g = job.execute(client).open()[:]
    want = np.corrcoef(embeddings.astype(np.float64), rowvar=False)
    assert g.dtype == np.float32 and not np.isnan(g).any()
    own = np.abs(np.corrcoef(embeddings, rowvar=False, dtype=np.float32) - want).max()
    assert np.abs(g - want).max() <= max(4 * own, 16 * np.finfo(np.float32).eps)
    np.testing.assert_array_equal(np.diag(g), 1.0)
    assert copies_in(temp) == []


def test_a_lazy_dask_array_as_x(temp: Path, tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(3)
    x = random_matrix(rng, (70, 30), "float64")
    lazy = da.from_array(x, chunks=(25, 16)) * 2.0
    result = pipeline.gram(lazy, str(tmp_path / "g.zarr"), rows=True, client=client)
    assert_product(result.open()[:], 2 * x, 2 * x.T)
    assert copies_in(temp) == []


# ---------------------------------------------------------------------------------------------
# What is copied, and how: prepare alone (no cluster), the copy read back

Case = namedtuple("Case", "operand want chunks")


def numpy_cases() -> list[Any]:
    rng = np.random.default_rng(4)
    base = random_matrix(rng, (40, 60), "float32")
    ints = rng.integers(-5, 5, (20, 30)).astype(np.int32)
    return [
        pytest.param(base, base, (40, 60), id="float32"),
        pytest.param(base.astype(np.float64), base.astype(np.float64), (40, 60), id="float64"),
        pytest.param(ints, ints, (20, 30), id="int32"),
        pytest.param(np.asfortranarray(base), base, (40, 60), id="fortran"),
        pytest.param(base[::2, 1::3], base[::2, 1::3], (20, 20), id="strided-view"),
        pytest.param(base.T, base.T, (60, 40), id="transposed-view"),
        pytest.param(base.astype(">f4"), base, (40, 60), id="big-endian"),
        pytest.param(ints > 0, ints > 0, (20, 30), id="bool"),
    ]


@pytest.mark.parametrize(("operand", "want", "chunks"), numpy_cases())
def test_numpy_copies(temp: Path, tmp_path: Path, operand: Any, want: Any, chunks: Any) -> None:
    other = write_array(tmp_path / "b.zarr", np.ones((operand.shape[1], 3), "float32"), (8, 3))
    job = pipeline.prepare(operand, other, str(tmp_path / "c.zarr"))
    assert job.operands is not None
    copy = zarr.open_array(job.operands.copies["A"], mode="r")
    assert copy.chunks == chunks and copy.dtype == want.dtype.newbyteorder("=")
    np.testing.assert_array_equal(copy[:], want)
    assert copy.metadata.zarr_format == 3
    folder = Path(job.operands.folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.parent == temp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.zarr", "tmp"]  # nothing in the user's
    del job
    gc.collect()
    assert copies_in(temp) == []  # garbage-collected with the job


@pytest.mark.parametrize(
    ("chunks", "stored_chunks", "computed"),
    [
        ((16, 24), (32, 24), 3),  # regular: grown by whole blocks, each computed once
        ((40, 24), (40, 24), 1),  # regular, one block: as it is
        (((7, 13, 20), (10, 14)), (40, 24), None),  # irregular: rechunked to whole chunks
    ],
)
def test_dask_copies(
    temp: Path, tmp_path: Path, chunks: Any, stored_chunks: Any, computed: int | None
) -> None:
    rng = np.random.default_rng(5)
    data = random_matrix(rng, (40, 24), "float32")
    calls: list[tuple[int, ...]] = []

    def block(x: Any, block_info: Any = None) -> Any:
        calls.append(tuple(block_info[0]["chunk-location"]))
        return x + 1

    lazy = da.from_array(data, chunks=chunks).map_blocks(block, meta=np.empty((0, 0), "f4"))
    other = write_array(tmp_path / "b.zarr", np.ones((24, 3), "float32"), (8, 3))
    with dask.config.set(scheduler="sync"):  # counted in this process
        job = pipeline.prepare(lazy, other, str(tmp_path / "c.zarr"))
    assert job.operands is not None
    copy = zarr.open_array(job.operands.copies["A"], mode="r")
    assert copy.chunks == stored_chunks
    np.testing.assert_array_equal(copy[:], data + 1)
    if computed is not None:
        assert sorted(calls) == sorted(set(calls)) and len(calls) == computed


@pytest.mark.parametrize(
    ("shape", "itemsize", "chunks"),
    [
        ((256, 12), 4, (256, 12)),  # small: one chunk
        ((3000, 2000), 4, (2048, 1024)),  # grown along the longer axis to 8 MiB
        ((2000, 3000), 8, (1024, 1024)),  # already 8 MiB
        ((10**6, 16), 4, (131072, 16)),  # tall and thin: not a thousand tiny chunks
        ((16, 10**6), 4, (16, 131072)),  # wide and flat
        ((5, 7), 1, (5, 7)),
    ],
)
def test_copy_chunks(shape: Any, itemsize: int, chunks: Any) -> None:
    assert in_memory.copy_chunks(shape, itemsize) == chunks


# ---------------------------------------------------------------------------------------------
# Refusals: before anything is copied, nothing left behind


@pytest.mark.parametrize(
    ("operand", "error", "words"),
    [
        (np.arange(5.0), InputError, r"A is a 1-D numpy array of shape \(5,\); only 2-D"),
        (np.array(1.0), InputError, r"A is a 0-D numpy array of shape \(\)"),
        (np.ones((2, 2, 2)), InputError, r"A is a 3-D numpy array"),
        (np.ones((0, 5)), InputError, r"A is an empty numpy array \(0x5\)"),
        (np.array([["a", "b"]]), InputError, r"A is a numpy array of dtype <U1, which is not"),
        (np.array([[1, None]], dtype=object), InputError, r"dtype object, which is not numeric"),
        (np.ma.masked_array(np.ones((2, 2))), InputError, r"A is a masked array, whose mask"),
        (da.ones((4,), chunks=2), InputError, r"A is a 1-D dask array"),
        (da.ones((0, 4), chunks=2), InputError, r"A is an empty dask array"),
    ],
)
def test_refused_operands(
    temp: Path, tmp_path: Path, operand: Any, error: type[Exception], words: str
) -> None:
    b = write_array(tmp_path / "b.zarr", np.ones((5, 3), "float32"), (5, 3))
    with pytest.raises(error, match=words) as caught:
        pipeline.prepare(operand, b, str(tmp_path / "c.zarr"))
    assert caught.value.exit_code == 2  # the CLI's usage status
    assert copies_in(temp) == []


def test_dask_of_unknown_shape_is_refused(temp: Path, tmp_path: Path) -> None:
    x = da.ones((6, 4), chunks=3)
    unknown = x[x[:, 0] > 0]
    with pytest.raises(InputError, match=r"X is a dask array of unknown shape .*compute_chunk"):
        pipeline.prepare_gram(unknown, str(tmp_path / "g.zarr"))


@pytest.mark.parametrize("out", [np.zeros((4, 4)), da.zeros((4, 4))], ids=["numpy", "dask"])
def test_out_in_memory_is_refused(temp: Path, tmp_path: Path, out: Any) -> None:
    a = np.ones((4, 4), "float32")
    with pytest.raises(ArgumentTypeError, match=r"OUT is a (numpy|dask) array; OUT is written"):
        pipeline.prepare(a, a, out)
    with pytest.raises(TypeError, match=r"read the product back with the result's open\(\)"):
        pipeline.multiply(a, a, out)
    assert copies_in(temp) == []  # refused before A was copied


def test_too_big_for_the_temporary_folder(
    temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copies' bytes must leave the reserve free: the second operand is refused with its
    bytes and what is left once the first is counted."""
    usage = namedtuple("usage", "total used free")
    reserve = in_memory.reserve_bytes(10**9)  # 100 MB: a tenth of the file system
    monkeypatch.setattr(in_memory.shutil, "disk_usage", lambda _: usage(10**9, 0, reserve + 6000))
    a, b = np.ones((25, 40), "float32"), np.ones((40, 30), "float32")  # 4,000 and 4,800 bytes
    with pytest.raises(UsageError) as caught:
        pipeline.prepare(a, b, str(tmp_path / "c.zarr"))
    message = str(caught.value)
    assert "B is a numpy array of 4.7 KiB (4800 bytes)" in message
    assert f"in {temp}, where 2.0 KiB (2000 bytes) can be taken" in message
    assert "write it to Zarr yourself" in message and "and pass that path or URL" in message
    assert copies_in(temp) == []
    square = np.ones((30, 30), "float32")  # 3,600 bytes, given twice: copied once
    job = pipeline.prepare(square, square, str(tmp_path / "c.zarr"))
    assert job.operands is not None and list(job.operands.copies) == ["A"]
    assert job.store.a_url == job.store.b_url


def test_a_dask_chunk_larger_than_memory(
    temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = namedtuple("memory", "available")
    monkeypatch.setattr(in_memory.psutil, "virtual_memory", lambda: memory(1000))
    lazy = da.ones((20, 20), chunks=(20, 20), dtype="float32")  # one 1,600-byte chunk
    with pytest.raises(UsageError, match=r"X is a dask array whose largest stored chunk takes"):
        pipeline.prepare_gram(lazy, str(tmp_path / "g.zarr"))
    pipeline.prepare_gram(np.ones((20, 20), "float32"), str(tmp_path / "g.zarr"))  # in memory


# ---------------------------------------------------------------------------------------------
# The copies' life: with the job, gone on error, a job that ran cannot run again


def test_copies_go_when_planning_fails(temp: Path, tmp_path: Path) -> None:
    b = write_array(tmp_path / "b.zarr", np.ones((7, 3), "float32"), (7, 3))
    with pytest.raises(InputError, match="7"):  # A's 5 columns against B's 7 rows
        pipeline.prepare(np.ones((4, 5), "float32"), b, str(tmp_path / "c.zarr"))
    assert copies_in(temp) == []


def test_a_job_that_ran_cannot_run_again(temp: Path, tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(6)
    a, b = random_matrix(rng, (9, 7), "float32"), random_matrix(rng, (7, 5), "float32")
    job = pipeline.prepare(a, b, str(tmp_path / "c.zarr"))
    assert job.operands is not None and len(copies_in(temp)) == 1
    assert list(job.operands.copies) == ["A", "B"]
    assert_product(job.execute(client).open()[:], a, b)
    assert job.operands.removed and copies_in(temp) == []
    with pytest.raises(UsageError, match=r"this job's A and B .* prepare the job again"):
        job.execute(client)


def test_a_worker_that_cannot_see_the_copy_is_told_to_pass_a_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"/tmp/{COPY_FOLDER_PREFIX}abc/A.zarr"
    monkeypatch.setattr(inputs, "worker_address", lambda: "tcp://10.0.0.7:4000")
    error = inputs.unreachable(FileNotFoundError(url), url, "A")
    assert isinstance(error, InputUnreachableError)
    message = str(error.named("A", then=", then rerun with --resume"))
    assert message.startswith(f"a worker (tcp://10.0.0.7:4000) cannot read A ({url})")
    assert "an array in memory that this machine copied to its temporary folder" in message
    assert "write the array to Zarr on storage they can read" in message
    assert "and pass that URL, then rerun" in message
    other = str(InputUnreachableError("/data/a.zarr", "tcp://w:1", "it does not exist there"))
    assert "array in memory" not in other and "a shared file system" in other


# ---------------------------------------------------------------------------------------------
# The result's handles on OUT


def test_result_handles(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(7)
    ds = xr.Dataset(
        {
            "A": (("x", "y"), random_matrix(rng, (30, 20), "float32")),
            "B": (("y", "z"), random_matrix(rng, (20, 25), "float32")),
        },
        coords={"x": np.arange(30) * 10, "y": np.arange(20), "z": np.arange(25) + 100},
    )
    store = str(tmp_path / "ds.zarr")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds.to_zarr(store, zarr_format=3, mode="w", consolidated=True)
    result = pipeline.multiply(f"{store}/A", f"{store}/B", f"{store}/C", client=client)
    assert result.url == os.path.realpath(f"{store}/C") and result.storage_options == {}
    want = ds["A"].values.astype(np.float64) @ ds["B"].values.astype(np.float64)
    opened = result.open()
    assert isinstance(opened, zarr.Array) and opened.read_only
    with pytest.raises(Exception):  # noqa: B017 - zarr's own error for a read-only array
        opened[0, 0] = 1.0
    assert_product(opened[:], ds["A"].values, ds["B"].values)
    lazy = result.to_dask()
    assert isinstance(lazy, da.Array) and lazy.chunksize == opened.chunks
    np.testing.assert_array_equal(lazy.compute(), opened[:])
    array = result.to_xarray()
    assert isinstance(array, xr.DataArray) and array.dims == ("x", "z")
    np.testing.assert_array_equal(array["x"].values, ds["x"].values)  # the group's coordinates
    np.testing.assert_array_equal(array["z"].values, ds["z"].values)
    np.testing.assert_allclose(array.values, want, rtol=1e-5, atol=1e-5)


def test_to_xarray_of_an_out_outside_a_group(tmp_path: Path, client: Client) -> None:
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    result = pipeline.gram(x, str(tmp_path / "g.zarr"), client=client)
    array = result.to_xarray()
    assert array.dims == ("i", "j") and array.name == "g.zarr"
    np.testing.assert_array_equal(array.values, x.T @ x)


def test_handles_carry_the_storage_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def opened(url: str, mode: str, storage_options: Any) -> Any:
        seen.update(url=url, mode=mode, storage_options=storage_options)
        return zarr.create_array({}, shape=(2, 2), dtype="float32", fill_value=3.0)

    monkeypatch.setattr(zarr, "open_array", opened)
    result = result_at("s3://bucket/c.zarr", {"anon": True})
    assert result.open().shape == (2, 2)
    assert seen == {"url": "s3://bucket/c.zarr", "mode": "r", "storage_options": {"anon": True}}
    with dask.config.set(scheduler="sync"):  # the array is in this process's memory
        np.testing.assert_array_equal(result.to_dask().compute(), np.full((2, 2), 3.0))
    assert "anon" not in repr(result)


def test_to_xarray_without_xarray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "xarray", None)
    result = result_at(str(tmp_path / "c.zarr"), {})
    with pytest.raises(ModuleNotFoundError, match=r"to_xarray\(\) needs xarray.*pip install"):
        result.to_xarray()
    assert issubclass(MissingPackageError, pipeline.PipelineError)


def test_a_result_with_no_out(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="names no OUT"):
        result_at("", {}).open()


def result_at(url: str, storage_options: dict[str, Any]) -> MultiplyResult:
    return MultiplyResult(
        (2, 2), "float32", 0.0, 0, 0, 0, "cpu", None,  # type: ignore[arg-type]
        url=url, storage_options=storage_options,
    )  # fmt: skip


def test_other_types_name_the_array_forms(tmp_path: Path) -> None:
    b = write_array(tmp_path / "b.zarr", np.ones((5, 3), "float32"), (5, 3))
    with pytest.raises(TypeError, match=r"A is a builtins.list; .*, or a numpy or dask array"):
        pipeline.prepare([[1.0] * 5], b, str(tmp_path / "c.zarr"))


# ---------------------------------------------------------------------------------------------
# A dask array that lies about its blocks; the temporary folder's owner and the stale copies


@pytest.mark.parametrize(
    ("shrink", "says"),
    [
        (lambda b: b[:1, :1], r"computes to shape \(1, 1\), not its declared \(8, 6\)"),
        (lambda b: b[:, :1], r"computes to shape \(8, 1\), not its declared \(8, 6\)"),
    ],
)
def test_a_dask_block_of_another_shape_is_refused_not_broadcast(
    temp: Path, shrink: Any, says: str
) -> None:
    x = np.arange(48.0).reshape(8, 6)
    lying = da.from_array(x, chunks=(8, 6)).map_blocks(shrink, dtype=x.dtype)
    with pytest.raises(InputError, match=r"^A is a dask array whose block at rows 0:8, columns "
                       r"0:6 " + says):  # fmt: skip
        in_memory.stage([lying], ["A"])
    assert copies_in(temp) == []


def test_blocks_that_do_not_fit_together_are_refused(temp: Path) -> None:
    x = np.arange(96.0).reshape(16, 6)
    widths = lambda b: b[:, : 1 + int(b[0, 0] > 0)]  # noqa: E731  (blocks 1 and 2 wide)
    lying = da.from_array(x, chunks=(4, 6)).map_blocks(widths, dtype=x.dtype)
    says = r"^A is a dask array whose block .* cannot be computed"
    with pytest.raises(InputError, match=says), pytest.MonkeyPatch.context() as mp:
        mp.setattr(in_memory, "_stored_chunks", lambda array: (16, 6))
        in_memory.stage([lying], ["A"])
    assert copies_in(temp) == []


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_temporary_folder_others_can_rename_in_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    with pytest.raises(UsageError, match=r"is writable by others without the sticky bit, so "
                       r"another user could replace the copy"):  # fmt: skip
        in_memory.stage([np.ones((3, 3))], ["A"])
    assert list(shared.iterdir()) == []
    shared.chmod(mode | stat.S_ISVTX)  # sticky, as /tmp: only the owner renames
    given, copies = in_memory.stage([np.ones((3, 3))], ["A"])
    assert copies is not None and str(given[0]).startswith(str(shared))
    copies.remove()


def test_copies_of_a_killed_process_go_with_the_next_job(temp: Path) -> None:
    prefix = in_memory._prefix()
    dead = temp / f"{prefix}{2**22 + 12345}-abc"  # beyond pid_max's default: no such process
    alive = temp / f"{prefix}{os.getppid()}-abc"
    other_host = temp / f"{COPY_FOLDER_PREFIX}elsewhere-{2**22 + 12345}-abc"
    for folder in (dead, alive, other_host):
        (folder / "A.zarr").mkdir(parents=True)
    given, copies = in_memory.stage([np.ones((2, 2))], ["A"])
    assert copies is not None
    left = set(copies_in(temp))
    assert dead.name not in left and {alive.name, other_host.name} <= left
    copies.remove()

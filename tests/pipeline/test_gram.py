"""Gram matrices: G = XᵀX (rows: X Xᵀ) with only the tiles on and above the diagonal computed,
each written with its mirror: against float64 numpy, bitwise symmetric, resumed, verified."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import gram, multiply, verify_product
from pipeline.errors import InputError, UsageError
from pipeline.gramian import prepare_gram
from pipeline.plan.fitted_costs import COSTS
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec, OutputSpec
from pipeline.store.mirror import same_bits
from pipeline.store.record import of_array
from tests.helpers import assert_product, random_matrix, refused, run_cli, write_array
from tests.pipeline.test_s3 import put, s3  # noqa: F401, F811 - the moto S3 fixture

GiB = 2**30


@pytest.fixture
def many_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans of several tiles for tiny products: jobs planned (in this process) with a cost
    model of no modelled cost per task, as this host's."""
    free_tasks = replace(COSTS, task_seconds=0.0)
    monkeypatch.setattr("pipeline.facts.job_plan.host_costs", lambda: free_tasks)


def _gram(x: Any, rows: bool) -> tuple[Any, Any]:
    """(op(A), op(B)) of the Gram product."""
    return (x, x.T) if rows else (x.T, x)


@pytest.mark.parametrize(
    ("shape", "chunks", "rows", "dtype", "options"),
    [
        ((300, 700), (128, 256), False, "float32", {}),  # 3x3 blocks: 6 tiles, ragged edge
        ((700, 260), (256, 100), True, "float64", {}),  # X Xᵀ
        ((1100, 520), (300, 260), False, "float32", {}),  # 2x2 blocks: split K, then mirrored
        ((90, 70), (30, 20), False, "float32", {"chunks": (25, 25), "shards": (50, 50)}),
        ((40, 30), (7, 9), False, "int16", {"dtype": "int64"}),  # integers: no syrk
        ((40, 30), (7, 9), True, "complex64", {}),  # complex: G = X Xᵀ (no conjugate)
    ],
)
def test_gram_matches_numpy_and_is_exactly_symmetric(
    tmp_path: Path,
    client: Client,
    many_tiles: None,
    shape: tuple[int, int],
    chunks: tuple[int, int],
    rows: bool,
    dtype: str,
    options: dict[str, Any],
) -> None:
    rng = np.random.default_rng(sum(shape))
    x = random_matrix(rng, shape, dtype)
    x_url = write_array(tmp_path / "x.zarr", x, chunks)
    out = str(tmp_path / "g.zarr")
    result = gram(x_url, out, rows=rows, client=client, **options)
    g = zarr.open_array(out, mode="r")[:]  # created NaN-filled: unwritten mirrors would show
    assert_product(g, *_gram(x, rows), options.get("dtype"))
    assert same_bits(g, g.T), "G is not bitwise symmetric"
    plan = result.plan
    t = plan.grid[0]
    assert t > 1 or plan.split_k > 1 or min(shape) < 300, plan  # several tiles, or split K
    assert plan.symmetric and plan.grid == (t, t) and plan.tile_shape[0] == plan.tile_shape[1]
    assert result.tiles_computed == plan.n_tiles == t * (t + 1) // 2
    assert all(tile.index[0] <= tile.index[1] for tile in plan.tiles())
    record = of_array(zarr.open_array(out, mode="r"))
    assert record is not None and record.symmetric is True and record.transpose_a is (not rows)
    assert verify_product(client, x_url, x_url, out).asymmetric == 0


def test_plan_does_half_the_work() -> None:
    """Square tiles on one grid, T(T+1)/2 tasks, useful flops k·m·(m+1) (the tiles' sum)."""
    x = ArraySpec((32768, 4096), (2048, 2048), "float32")
    kw: dict[str, Any] = {"workers": 1, "threads_per_worker": 2, "memory_limit_bytes": 16 * GiB}
    general = plan_matmul(x.transposed(), x, transposed=(True, False), **kw)
    g = plan_matmul(x.transposed(), x, transposed=(True, False), symmetric=True, **kw)
    assert g.flops == 32768 * 4096 * 4097 and general.flops == 2 * 32768 * 4096**2
    assert sum(g.tile_flops(t) for t in g.tiles()) == g.flops
    assert g.estimated_seconds < 0.65 * general.estimated_seconds
    assert g.compulsory_read_bytes == 32768 * 4096 * 4
    assert g.lower_bound_read_bytes <= general.lower_bound_read_bytes


@pytest.mark.parametrize(
    ("shape", "memory_limit"),
    # A wide X: its several tiles (G is 3x X) share one cache. A small G is one tile when it
    # fits (the worker's threads share its gemm calls), so the second case is held to 300 MiB.
    [((2048, 6144), "4GiB"), ((4096, 3072), "300MiB")],
    ids=["X fits", "X does not fit"],
)
def test_planned_reads_are_the_reads(
    tmp_path: Path, shape: tuple[int, int], memory_limit: str
) -> None:
    """A Gram product reads X's blocks for both operands from one cache: the plan counts X
    once when it fits (not once per operand), and at most 1.5x what the run reads when it
    does not."""
    from distributed import LocalCluster

    rng = np.random.default_rng(3)
    x_url = write_array(tmp_path / "x.zarr", random_matrix(rng, shape, "float32"), (512, 512))
    # The limit goes to the plan only: an in-process worker with it would pause on the test
    # process's own memory (distributed measures the whole process).
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:  # fmt: skip
        result = gram(x_url, str(tmp_path / "g.zarr"), client=c, memory_limit=memory_limit)
    x_bytes = shape[0] * shape[1] * 4
    planned, read = result.plan.read_bytes, result.bytes_read
    if memory_limit == "4GiB":
        assert result.plan.n_tiles > 1 and planned == read == x_bytes
    else:
        # the model errs by overcounting; a loaded machine's cache can read a little more
        assert result.plan.n_tiles > 1 and x_bytes < planned <= 1.5 * read


def test_refusals(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x_url = write_array(tmp_path / "x.zarr", random_matrix(rng, (40, 30), "float32"), (10, 10))
    cube = str(tmp_path / "cube.zarr")
    zarr.create_array(cube, shape=(4, 4, 4), chunks=(2, 2, 2), dtype="float32")
    g = str(tmp_path / "g.zarr")
    with pytest.raises(InputError, match=r"^X has 3 dimension\(s\) \(4, 4, 4\); only 2-D"):
        prepare_gram(cube, g)
    with pytest.raises(UsageError, match="chunks must be square, not 10x20; pass e.g."):
        prepare_gram(x_url, g, chunks=(10, 20))
    with pytest.raises(UsageError, match="gram takes no transpose_a=True"):
        prepare_gram(x_url, g, transpose_a=True)
    with pytest.raises(UsageError, match="gram takes no accumulate=True"):
        prepare_gram(x_url, g, accumulate=True)
    y_url = write_array(tmp_path / "y.zarr", random_matrix(rng, (40, 30), "float32"), (10, 10))
    from pipeline import prepare

    with pytest.raises(UsageError, match=r"use `pipeline.gram\(X, G\[, rows=True\]\)`"):
        prepare(x_url, y_url, g, transpose_a=True, symmetric=True)


def test_resume_of_a_partial_gram(tmp_path: Path, client: Client, many_tiles: None) -> None:
    """A killed gram: its journaled tiles are kept (both blocks of each), a tile whose mirror
    was damaged and the tiles never journaled are computed again."""
    rng = np.random.default_rng(2)
    x = random_matrix(rng, (200, 700), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (100, 256))
    out = tmp_path / "g.zarr"
    first = gram(x_url, str(out), client=client)
    journal = sorted((out / "journal").glob("tile-*.json"))
    assert len(journal) == 6
    # as if killed: two tiles never journaled, OUT not complete, one mirror block damaged
    for entry in journal[:2]:
        entry.unlink()
    meta = zarr.open_array(str(out), mode="r+")
    meta.attrs.update(replace(of_array(meta), complete=False).attributes())
    kept = [json.loads(p.read_text())["index"] for p in journal[2:]]
    off = next(i for i in kept if i[0] != i[1])
    t = first.plan.tile_shape[0]
    meta[off[1] * t, off[0] * t] = np.nan  # in the mirror (j, i) of a kept tile (i, j)
    again = gram(x_url, str(out), client=client, resume=True)
    assert again.tiles_skipped == 3 and again.tiles_computed == 3
    g = zarr.open_array(str(out), mode="r")[:]
    assert_product(g, x.T, x)
    assert same_bits(g, g.T)


def test_verify_catches_an_asymmetric_g(tmp_path: Path, client: Client, many_tiles: None) -> None:
    rng = np.random.default_rng(3)
    x = random_matrix(rng, (60, 40), "float64")
    x_url = write_array(tmp_path / "x.zarr", x, (20, 20))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, client=client)
    g = zarr.open_array(out, mode="r+")
    g[30, 5] = np.nextafter(g[30, 5], np.inf)  # one ulp: within Freivalds' tolerance
    result = verify_product(client, x_url, x_url, out)
    assert result.asymmetric == 1 and not result.passed


def test_gram_is_faster_work_than_the_general_product(tmp_path: Path, client: Client) -> None:
    """Same G bitwise or within rounding as multiply --transpose-a X X, with fewer flops."""
    rng = np.random.default_rng(4)
    x = random_matrix(rng, (300, 600), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (150, 200))
    g = gram(x_url, str(tmp_path / "g.zarr"), client=client)
    general = multiply(x_url, x_url, str(tmp_path / "c.zarr"), client=client, transpose_a=True)
    assert g.plan.flops < 0.7 * general.plan.flops
    assert_product(zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[:], x.T, x)


def test_dimension_names(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(5)
    zarr.create_array(
        tmp_path / "x.zarr", data=random_matrix(rng, (9, 6), "float32"), chunks=(3, 3),
        dimension_names=("sample", "feature"),
    )  # fmt: skip
    for rows, dims in ((False, ("feature", "feature_2")), (True, ("sample", "sample_2"))):
        out = str(tmp_path / f"g{rows}.zarr")
        gram(str(tmp_path / "x.zarr"), out, rows=rows, client=client)
        assert zarr.open_array(out, mode="r").metadata.dimension_names == dims


def test_cli_gram_dry_run_run_and_verify(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    x = random_matrix(rng, (80, 50), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (40, 25))
    out = str(tmp_path / "g.zarr")
    common = ["--workers", "1", "--threads-per-worker", "1", "--dashboard-address", ":0"]
    dry = run_cli("gram", x_url, out, "--rows", "--dry-run")
    assert dry.returncode == 0 and "Gram X·Xᵀ" in dry.stdout and "80x50 @ 50x80" in dry.stdout
    done = run_cli("gram", x_url, out, "--verify", "--no-progress", *common)
    assert done.returncode == 0, done.stderr
    assert "verify passed" in done.stdout
    assert_product(zarr.open_array(out, mode="r")[:], x.T, x)
    checked = run_cli("verify", x_url, x_url, out, *common)
    assert checked.returncode == 0 and "0 element(s) differ from their mirror" in checked.stdout
    two = run_cli("verify", x_url, out, *common)  # `verify X G`: X, X and G's transposes
    assert two.returncode == 0, two.stderr
    assert two.stdout == checked.stdout  # the same check, the same seed
    bad = run_cli("gram", x_url, str(tmp_path / "h.zarr"), "--transpose-a")
    assert bad.returncode == 2 and "gram takes no --transpose-a: " in bad.stderr


def test_verify_x_g_reads_x_x_from_gs_record(tmp_path: Path, client: Client) -> None:
    """`verify X G` of a G = X·Xᵀ: the orientation comes from G's record (read as Xᵀ·X its
    shapes would not match), and a wrong G fails the check as `verify X X G` would."""
    x = random_matrix(np.random.default_rng(7), (24, 16), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (8, 8))
    g_url = str(tmp_path / "g.zarr")
    gram(x_url, g_url, rows=True, client=client)
    common = ["--workers", "1", "--threads-per-worker", "1", "--dashboard-address", ":0"]
    done = run_cli("verify", x_url, g_url, "--no-progress", *common)
    assert done.returncode == 0 and done.stdout.startswith("verify ok:"), done.stderr
    g = zarr.open_array(g_url, mode="r+")
    g[0, 0] = float(np.asarray(g[0, 0])) + 1.0  # the diagonal: still symmetric, no longer X·Xᵀ
    wrong = run_cli("verify", x_url, g_url, "--no-progress", *common)
    assert wrong.returncode == 1 and "verify FAILED" in wrong.stdout, wrong.stderr


@pytest.mark.parametrize("written_by", ["multiply", "hand"])
def test_verify_x_c_of_no_gram_is_refused(tmp_path: Path, client: Client, written_by: str) -> None:
    """Two operands name a Gram product of ours; any other C is refused before a cluster
    starts, with the fix: pass A B C."""
    x = random_matrix(np.random.default_rng(8), (16, 16), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (8, 8))
    c_url = str(tmp_path / "c.zarr")
    if written_by == "multiply":  # ours, but a plain product's record (`multiply`), not gram's
        multiply(x_url, x_url, c_url, transpose_a=True, client=client)
    else:  # no record at all
        write_array(tmp_path / "c.zarr", x.T @ x, (8, 8))
    line = refused(run_cli("verify", x_url, c_url))
    assert line == (
        f"error: G ({c_url}) is not a Gram product this tool wrote (its tilegemm attribute "
        "does not record one), so `verify X G` cannot tell what it is a product of; pass A B C: "
        "`python -m pipeline verify A B C`"
    )


def test_output_request_is_square_by_default() -> None:
    x = ArraySpec((100, 60), (30, 20), "float32")
    kw: dict[str, Any] = {"workers": 1, "threads_per_worker": 1, "memory_limit_bytes": GiB}
    cols = plan_matmul(x.transposed(), x, transposed=(True, False), symmetric=True, **kw)
    rows = plan_matmul(x, x.transposed(), transposed=(False, True), symmetric=True, **kw)
    assert cols.out.chunks == (20, 20) and rows.out.chunks == (30, 30)
    with pytest.raises(UsageError, match="--shards must be square"):
        plan_matmul(x.transposed(), x, symmetric=True, output=OutputSpec(shards=(40, 60)), **kw)


def test_staged_backends_transposed_and_gram(
    tmp_path: Path, client: Client, many_tiles: None
) -> None:
    """The staged GPU path places transposed panels on the host: our CUDA kernel in the
    simulator (tiny shapes), and the emulated device (no math: it must still write every
    chunk, mirrors included, which stay NaN)."""
    rng = np.random.default_rng(7)
    x, y = random_matrix(rng, (24, 40), "float32"), random_matrix(rng, (24, 16), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (8, 20))
    y_url = write_array(tmp_path / "y.zarr", y, (12, 8))
    xty = str(tmp_path / "xty.zarr")
    multiply(x_url, y_url, xty, client=client, backend="cuda", transpose_a=True)
    assert_product(zarr.open_array(xty, mode="r")[:], x.T, y)
    g = str(tmp_path / "g.zarr")
    result = gram(x_url, g, client=client, backend="cuda")
    assert result.backend == "cuda"
    got = zarr.open_array(g, mode="r")[:]
    assert_product(got, x.T, x)
    assert same_bits(got, got.T)
    emulated = gram(x_url, str(tmp_path / "e.zarr"), client=client, backend="emulated")
    assert emulated.tiles_computed == emulated.plan.n_tiles


def test_gram_and_transpose_on_s3(s3: dict[str, Any], client: Client) -> None:  # noqa: F811
    rng = np.random.default_rng(8)
    x, y = random_matrix(rng, (60, 40), "float32"), random_matrix(rng, (60, 20), "float32")
    x_url = put("s3://bucket/general/x.zarr", x, (20, 20), s3)
    y_url = put("s3://bucket/general/y.zarr", y, (30, 10), s3)
    g_url, c_url = "s3://bucket/general/g.zarr", "s3://bucket/general/xty.zarr"
    done = gram(x_url, g_url, client=client, storage_options=s3, verify=True)
    assert done.verified is True
    g = zarr.open_array(g_url, mode="r", storage_options=s3)[:]
    assert_product(g, x.T, x)
    assert same_bits(g, g.T)
    multiply(x_url, y_url, c_url, client=client, storage_options=s3, transpose_a=True)
    assert_product(zarr.open_array(c_url, mode="r", storage_options=s3)[:], x.T, y)

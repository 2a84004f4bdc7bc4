"""N-D fields read in place as matrices (pipeline.store.fields): a (time, lat, lon) field's
covariance of grid points (``gram T G --over time --center``) against float64 ``np.cov``, the
same G by ``--stack``, G's dimensions unstacked by xarray as the README says, a product of a
field with a 2-D array, and the refusals."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from distributed import Client

from pipeline.plan.fitted_costs import COSTS
from pipeline.store.fields import FieldMatrix
from pipeline.store.inputs import read_block
from pipeline.store.mirror import same_bits
from pipeline.store.signature import changed_chunks
from tests.helpers import run_main
from tests.pipeline.test_cli_refusals import error_line, tree_digest

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
"""zarr warns that v3 consolidated metadata (xarray's default) is not in the spec yet."""

SHAPE = (30, 6, 8)
CHUNKS = (10, 3, 4)


@pytest.fixture
def many_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans of several tiles for tiny products (no modelled cost per task)."""
    free_tasks = replace(COSTS, task_seconds=0.0)
    monkeypatch.setattr("pipeline.facts.job_plan.host_costs", lambda: free_tasks)


@pytest.fixture
def field(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, np.ndarray[Any, Any]]:
    """A float32 (time, lat, lon) field in Kelvin, written by xarray (Zarr v3, or the format
    given as the fixture's param), chunked in all three dimensions, with a 2-D (time, mode)
    variable beside it; (the dataset, the field)."""
    rng = np.random.default_rng(3)
    t = (280 + rng.standard_normal(SHAPE) * np.linspace(1, 3, 8)).astype("float32")
    modes = rng.standard_normal((SHAPE[0], 5)).astype("float32")
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t), "pc": (("time", "mode"), modes)},
        coords={
            "time": pd.date_range("2000-01-01", periods=SHAPE[0]),
            "lat": np.linspace(-50.0, 50.0, SHAPE[1]),
            "lon": np.arange(0.0, 360.0, 360 / SHAPE[2]),
        },
    )
    encoding = {"t2m": {"chunks": CHUNKS}, "pc": {"chunks": (10, 5)}}
    zarr_format = getattr(request, "param", 3)
    ds.to_zarr(tmp_path / "ds.zarr", encoding=encoding, consolidated=True, zarr_format=zarr_format)
    return str(tmp_path / "ds.zarr"), t


def cli(client: Client) -> list[str]:
    return ["--scheduler", str(client.scheduler.address), "--no-progress"]


# --- the view --------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 2, 3])
def test_blocks_are_the_reshaped_arrays(tmp_path: Path, split: int) -> None:
    data = np.arange(7 * 5 * 4 * 3, dtype="int32").reshape(7, 5, 4, 3)
    stored = zarr.create_array(str(tmp_path / "f.zarr"), data=data, chunks=(3, 2, 3, 2))
    view = FieldMatrix(stored, split)
    matrix = data.reshape(int(np.prod(data.shape[:split])), -1)
    assert view.shape == matrix.shape
    inner = (int(np.prod(data.shape[1:split])), int(np.prod(data.shape[split + 1 :])))
    assert view.chunks == (3 * inner[0], (3, 2, 3, 2)[split] * inner[1])
    rng = np.random.default_rng(split)
    spans = [(0, view.chunks[0]), (0, matrix.shape[0]), (1, 2)]
    spans += [tuple(sorted(rng.integers(0, matrix.shape[0] + 1, 2))) for _ in range(4)]
    cuts = [(0, view.chunks[1]), (0, matrix.shape[1]), (1, 2)]
    cuts += [tuple(sorted(rng.integers(0, matrix.shape[1] + 1, 2))) for _ in range(4)]
    for rows, cols in itertools.product(spans, cuts):
        want = matrix[rows[0] : rows[1], cols[0] : cols[1]]
        got = read_block(view, rows, cols, "float64")  # type: ignore[arg-type]
        assert got.flags.c_contiguous and got.dtype == np.float64
        np.testing.assert_array_equal(got, want)
        into = np.full(want.shape, np.nan, dtype="float32")
        read_block(view, rows, cols, "float32", out=into)  # type: ignore[arg-type]
        np.testing.assert_array_equal(into, want)


# --- gram of a field --------------------------------------------------------------------------


def _g(url: str) -> Any:
    return zarr.open_array(url, mode="r")[:]


@pytest.mark.parametrize(
    ("field", "chunks"),
    [
        (3, []),
        (3, ["--chunks", "20x20"]),  # G's chunks not whole lon rows: blocks read unaligned
        (2, []),  # xarray's v2 dataset: _ARRAY_DIMENSIONS
    ],
    indirect=["field"],
)
def test_covariance_of_grid_points(
    field: tuple[str, Any],
    client: Client,
    many_tiles: None,
    capsys: pytest.CaptureFixture[str],
    chunks: list[str],
) -> None:
    ds, t = field
    done = run_main(["gram", f"{ds}/t2m", f"{ds}/C", "--over", "time", "--center", *chunks,
                     "--verify", *cli(client)], capsys)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "verify passed" in done.stdout, done.stdout
    g, x = _g(f"{ds}/C"), t.reshape(SHAPE[0], -1).astype("float64")
    assert g.dtype == np.float32 and same_bits(g, g.T)
    want = np.cov(x, rowvar=False)
    np.testing.assert_allclose(g, want, rtol=0, atol=2e-6 * np.abs(want).max())
    assert xr.open_zarr(ds)["C"].dims == ("lat_lon", "lat_lon_2")


def test_several_tiles_of_unaligned_blocks(
    tmp_path: Path, client: Client, many_tiles: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """G of 600 grid points in 256-wide gemm blocks (--chunks 64x64): tiles whose columns are
    not whole lon rows (30), read from boxes of whole rows and cut."""
    t = np.random.default_rng(5).standard_normal((12, 20, 30)).astype("float32")
    ds = str(tmp_path / "ds.zarr")
    data = xr.Dataset({"t": (("time", "lat", "lon"), t)})
    data.to_zarr(ds, encoding={"t": {"chunks": (6, 7, 11)}}, consolidated=True)
    argv = ["gram", f"{ds}/t", f"{ds}/C", "--over", "time", "--center", "--chunks", "64x64"]
    done = run_main([*argv, *cli(client)], capsys)
    assert done.returncode == 0, done.stderr
    assert "tiles computed 6," in done.stdout, done.stdout
    want = np.cov(t.reshape(12, -1).astype("float64"), rowvar=False)
    np.testing.assert_allclose(_g(f"{ds}/C"), want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_plain_gram_stack_and_unstack(
    field: tuple[str, Any], client: Client, many_tiles: None, capsys: pytest.CaptureFixture[str]
) -> None:
    ds, t = field
    for out, how in (("G", ["--over", "time"]), ("S", ["--stack", "lat,lon"])):
        done = run_main(["gram", f"{ds}/t2m", f"{ds}/{out}", *how, *cli(client)], capsys)
        assert done.returncode == 0, done.stderr
    x = t.reshape(SHAPE[0], -1).astype("float64")
    g = _g(f"{ds}/G")
    np.testing.assert_allclose(g, x.T @ x, rtol=2e-6)
    assert same_bits(g, _g(f"{ds}/S")), "--stack lat,lon is --over time"
    # The README's unstack: G's dimensions back to (lat, lon, lat_2, lon_2).
    opened = xr.open_zarr(ds)
    G = opened["G"]
    for dim, suffix in (("lat_lon", ""), ("lat_lon_2", "_2")):
        index = pd.MultiIndex.from_product(
            [opened.lat.values, opened.lon.values], names=["lat" + suffix, "lon" + suffix]
        )
        G = G.assign_coords(xr.Coordinates.from_pandas_multiindex(index, dim))
    G = G.unstack()
    assert G.dims == ("lat", "lon", "lat_2", "lon_2")
    np.testing.assert_array_equal(G.values, g.reshape(6, 8, 6, 8))
    at = G.sel(lat=opened.lat[2], lon=opened.lon[5], lat_2=opened.lat[4], lon_2=opened.lon[1])
    assert float(at) == g[2 * 8 + 5, 4 * 8 + 1]


def test_summed_over_the_grid_and_times_a_matrix(
    field: tuple[str, Any], client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    ds, t = field
    x = t.reshape(SHAPE[0], -1).astype("float64")
    done = run_main(["gram", f"{ds}/t2m", f"{ds}/T", "--over", "lat,lon", *cli(client)], capsys)
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(_g(f"{ds}/T"), x @ x.T, rtol=2e-6)  # time x time
    assert zarr.open_array(f"{ds}/T").metadata.dimension_names == ("time", "time_2")
    # A field times a 2-D array, over their shared time (its coordinates compared)
    argv = ["multiply", f"{ds}/t2m", f"{ds}/pc", f"{ds}/P", "--over", "time", "--verify"]
    done = run_main([*argv, *cli(client)], capsys)
    assert done.returncode == 0, done.stderr
    assert "verify passed" in done.stdout, done.stdout
    pc = zarr.open_array(f"{ds}/pc")[:].astype("float64")
    np.testing.assert_allclose(_g(f"{ds}/P"), x.T @ pc, rtol=1e-5, atol=1e-2)
    assert xr.open_zarr(ds)["P"].dims == ("lat_lon", "mode")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["gram", "{ds}/t2m"],
         "error: X has 3 dimension(s) (30, 6, 8); only 2-D matrices can be multiplied, or an "
         "N-D field read as one: name the dimensions summed over with --over (multiply and "
         "gram; verify takes no N-D field yet)"),
        (["gram", "{ds}/t2m", "--over", "lat"],
         "error: --over lat: X is (time, lat, lon), and the summed dimensions must be the first "
         "or the last ones in its stored order"),
        (["gram", "{ds}/t2m", "--stack", "time,lon"], "ds.transpose('lat', 'time', 'lon')"),
        (["multiply", "{ds}/t2m", "{ds}/pc", "--over", "time", "--accumulate"],
         "error: --accumulate does not take N-D fields yet"),
        (["gram", "{ds}/t2m", "--stack", "lon,lat"],
         "error: --stack lon,lat: X stores them as (lat, lon), and G is indexed by them in "
         "stored order (read in place); pass --stack lat,lon"),
        (["multiply", "{ds}/t2m", "{ds}/pc", "--over", "mode"],
         "error: --over mode: A has no dimension 'mode'; its dimensions are (time, lat, lon)"),
    ],
)  # fmt: skip
def test_refusals(
    field: tuple[str, Any], capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    ds, _ = field
    command, *rest = (a.format(ds=ds) for a in argv)
    rest.insert(1 if command == "gram" else 2, f"{ds}/OUT")
    before = tree_digest(Path(ds))
    done = run_main([command, *rest, "--workers", "1", "--no-progress"], capsys)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in error_line(done), error_line(done)
    assert tree_digest(Path(ds)) == before, "a refused run wrote or changed something"


def test_changed_chunks_of_a_field_are_the_matrix_chunks() -> None:
    """--resume: a field's changed chunk c/i/j/k is in the matrix's chunk (i, j) when one
    dimension forms the rows, (i, k) when two do."""
    then = {"c/0/1/2": "a", "c/2/0/1": "b", "zarr.json": "m"}
    now = {"c/0/1/2": "a2", "c/2/0/1": "b", "c/1/1/0": "new", "zarr.json": "m2"}
    encoding = ("default", "/")
    assert changed_chunks(then, now, encoding, split=1) == {(0, 1), (1, 1)}
    assert changed_chunks(then, now, encoding, split=2) == {(0, 2), (1, 0)}
    assert changed_chunks(then, now, encoding) == set()  # not 2-D chunk keys


def test_a_stacked_name_another_array_of_the_group_uses_is_renamed(
    field: tuple[str, Any], client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    """xarray opens a group only where each dimension name has one length: G's stacked names
    step aside from a sibling's ``lat_lon`` of another length."""
    ds, t = field
    zarr.create_array(f"{ds}/w", shape=(3,), dtype="f4", dimension_names=("lat_lon",))
    done = run_main(["gram", f"{ds}/t2m", f"{ds}/G", "--over", "time", *cli(client)], capsys)
    assert done.returncode == 0, done.stderr
    g = xr.open_zarr(ds, consolidated=False)["G"]
    assert g.dims == ("lat_lon_2", "lat_lon_2_2") and g.shape == (48, 48)
    flat = t.reshape(t.shape[0], -1).astype(np.float64)
    np.testing.assert_allclose(g.values, flat.T @ flat, rtol=1e-5)


def test_fit_dimensions_keeps_what_fits_and_renames_what_clashes() -> None:
    from pipeline.plan.layout import fit_dimensions

    assert fit_dimensions(("x", "y"), (4, 5), {"x": 4, "y": 5, "z": 1}) == ("x", "y")
    assert fit_dimensions(("x", "y"), (4, 5), {"x": 3}) == ("x_2", "y")
    assert fit_dimensions(("x", "x_2"), (4, 4), {"x": 3, "x_2": 9}) == ("x_3", "x_2_2")
    assert fit_dimensions(("x", "y"), (4, 5), {"x": 3, "x_2": 7}) == ("x_3", "y")


def test_resume_reading_the_field_another_way_is_refused(tmp_path: Path, client: Client) -> None:
    """(4, 2, 2): summed over time, G is (lat·lon)²; over lat,lon, time² — both 4x4."""
    from pipeline import gram
    from pipeline.errors import UsageError

    t = np.random.default_rng(5).standard_normal((4, 2, 2))
    url = str(tmp_path / "t.zarr")
    zarr.create_array(url, data=t, chunks=(2, 1, 2), dimension_names=("time", "lat", "lon"))
    out = str(tmp_path / "g.zarr")
    gram(url, out, client=client, over="time")
    before = zarr.open_array(out, mode="r")[:]
    with pytest.raises(UsageError, match=r"^resume=True: G .* was started without rows=True"):
        gram(url, out, client=client, over="lat,lon", resume=True)
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], before)
    flat = t.reshape(4, 4)
    np.testing.assert_allclose(before, flat.T @ flat, rtol=1e-12)

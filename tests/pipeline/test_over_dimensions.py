"""Products asked for by dimension name: ``--over`` (and gram's ``--stack``) resolved into the
transposes (pipeline.plan.dimensions, pure), each refusal as one ``error:`` line with exit 2,
and the products against numpy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client

from pipeline import gram, multiply
from pipeline.api import prepare
from pipeline.errors import InputError, UsageError
from pipeline.gramian import prepare_gram
from pipeline.plan import dimensions
from pipeline.plan.dimensions import Names, resolve_gram, resolve_multiply
from tests.helpers import run_main
from tests.pipeline.test_cli_refusals import error_line, tree_digest

TLL: Names = ("time", "lat", "lon")


# --- the resolver (pure) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "over", "stack", "rows", "transposed", "split", "x_sides"),
    [
        # X (variants, samples): G = XᵀX over the variants (samples x samples)
        (("variants", "samples"), "variants", None, False, (True, False), None,
         (("samples",), ("variants",))),
        # X (samples, variants): G = X·Xᵀ, i.e. --rows
        (("samples", "variants"), "variants", None, False, (False, True), None,
         (("samples",), ("variants",))),
        # --rows given and agreeing
        (("samples", "variants"), "variants", None, True, (False, True), None,
         (("samples",), ("variants",))),
        # --stack names G's side: the same as --over the other
        (("variants", "samples"), None, "samples", False, (True, False), None,
         (("samples",), ("variants",))),
        # both, agreeing
        (("variants", "samples"), "variants", "samples", False, (True, False), None,
         (("samples",), ("variants",))),
        # a (time, lat, lon) field: time x (lat·lon), G over the grid points
        (TLL, "time", None, False, (True, False), 1, (("lat", "lon"), ("time",))),
        (TLL, None, "lat,lon", False, (True, False), 1, (("lat", "lon"), ("time",))),
        # summed over the grid: G is time x time (X·Xᵀ of the same matrix)
        (TLL, "lat,lon", None, False, (False, True), 1, (("time",), ("lat", "lon"))),
        (TLL, " lon , lat ", None, True, (False, True), 1, (("time",), ("lat", "lon"))),
        # time trailing: (lat·lon) x time
        (("lat", "lon", "time"), "time", None, False, (False, True), 2,
         (("lat", "lon"), ("time",))),
        # stacking time with lat: (time·lat) x lon
        (TLL, None, "time,lat", False, (False, True), 2, (("time", "lat"), ("lon",))),
        # no names given: the flags as they are
        ((None, None), None, None, True, (False, True), None, ((None,), (None,))),
    ],
)  # fmt: skip
def test_gram_resolution(
    names: Names,
    over: str | None,
    stack: str | None,
    rows: bool,
    transposed: tuple[bool, bool],
    split: int | None,
    x_sides: tuple[Any, Any],
) -> None:
    found = resolve_gram(names, over, stack, rows)
    assert found.transposed == transposed
    assert found.splits == (split, split)
    assert found.sides[0] == x_sides  # X as used: (G's side, the summed side)
    assert found.sides[1] == (x_sides[1], x_sides[0])


@pytest.mark.parametrize(
    ("a", "b", "over", "given", "transposed", "splits"),
    [
        (("time", "x"), ("time", "y"), "time", (False, False), (True, False), (None, None)),
        (("x", "time"), ("y", "time"), "time", (False, False), (False, True), (None, None)),
        (("time", "x"), ("y", "time"), "time", (False, False), (True, True), (None, None)),
        (("x", "time"), ("time", "y"), "time", (False, False), (False, False), (None, None)),
        # explicit flags that agree
        (("time", "x"), ("y", "time"), "time", (True, True), (True, True), (None, None)),
        # an N-D operand: its other dimensions stacked
        (TLL, ("time", "mode"), "time", (False, False), (True, False), (1, None)),
        (TLL, TLL, "lat,lon", (False, False), (False, True), (1, 1)),
        (("mode", "lat", "lon"), TLL, "lat,lon", (False, False), (False, True), (1, 1)),
    ],
)  # fmt: skip
def test_multiply_resolution(
    a: Names,
    b: Names,
    over: str,
    given: tuple[bool, bool],
    transposed: tuple[bool, bool],
    splits: tuple[int | None, int | None],
) -> None:
    shapes = (_shape(a), _shape(b))
    found = resolve_multiply((a, b), shapes, over, given)
    assert (found.transposed, found.splits) == (transposed, splits)
    assert found.summed == tuple(n for n in a if n in over)


def _shape(names: Names) -> tuple[int, ...]:
    lengths = {"time": 30, "lat": 6, "lon": 8, "x": 3, "y": 4, "mode": 5}
    return tuple(lengths.get(str(n), 2) for n in names)


@pytest.mark.parametrize(
    ("a", "b", "transposed"),
    [
        (("i", "k"), ("k", "j"), (False, False)),  # the names contracted agree
        (("time", "x"), ("time", "y"), (True, False)),  # the shared one is the one summed
        (("x", "k"), ("y", "z"), (False, False)),  # nothing shared: names differ freely
        (("i", "j"), ("i", "j"), (False, False)),  # this tool's placeholders: no evidence
        (("x", None), ("time", "x"), (False, False)),  # A's contracted one unnamed
        (("time", "x", "y"), ("time", "y"), (False, False)),  # N-D: refused elsewhere
    ],
)
def test_names_that_pass_without_over(a: Names, b: Names, transposed: tuple[bool, bool]) -> None:
    dimensions.check_shared((a, b), transposed)


@pytest.mark.parametrize(
    ("a", "b", "transposed", "says"),
    [
        (("time", "x"), ("time", "y"), (False, False),
         "A and B share the dimension 'time', but the product sums A's 'x' against B's 'time'; "
         "pass --over time (or --transpose-a)"),
        (("t", "x"), ("y", "x"), (False, False),
         "A and B share the dimension 'x', but the product sums A's 'x' against B's 'y'; "
         "pass --over x (or --transpose-b)"),
        (("x", "t"), ("t", "y"), (True, False),
         "sums A's 'x' against B's 't'; pass --over t (or no --transpose-a)"),
    ],
)  # fmt: skip
def test_shared_name_not_summed_is_refused(
    a: Names, b: Names, transposed: tuple[bool, bool], says: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(says)):
        dimensions.check_shared((a, b), transposed)


@pytest.mark.parametrize(
    ("names", "over", "stack", "rows", "says"),
    [
        (TLL, "depth", None, False,
         "--over depth: X has no dimension 'depth'; its dimensions are (time, lat, lon)"),
        (TLL, None, "depth", False, "--stack depth: X has no dimension 'depth'"),
        (TLL, "time", None, True,
         "--over time contradicts --rows: X is (time, lat, lon), so summing 'time' is G = XᵀX; "
         "drop --rows"),
        ((None, None), "time", None, False,
         "--over needs dimension names, and X has none (Zarr v3 dimension_names or xarray's "
         "_ARRAY_DIMENSIONS); use --rows instead"),
        (TLL, "lat", None, False,
         "--over lat: X is (time, lat, lon), and the summed dimensions must be the first or the "
         "last ones in its stored order"),
        (TLL, "time,lon", None, False, "ds.transpose('time', 'lon', 'lat')"),
        (TLL, "time,lat,lon", None, False, "--over time,lat,lon sums every dimension of X"),
        (TLL, None, "time,lat,lon", False, "--stack time,lat,lon names every dimension of X"),
        (TLL, "time", "lat", False, "--over time and --stack lat disagree"),
        (TLL, "time,time", None, False, "--over 'time,time' names a dimension twice"),
        (TLL, "time,", None, False, "give dimension names separated by commas"),
        (("x", "x"), "x", None, False, "X names 2 dimensions 'x'"),
    ],
)  # fmt: skip
def test_gram_refusals(
    names: Names, over: str | None, stack: str | None, rows: bool, says: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(says)):
        resolve_gram(names, over, stack, rows)


@pytest.mark.parametrize(
    ("a", "b", "over", "given", "error", "says"),
    [
        (("time", "x"), ("y", "z"), "time", (False, False), UsageError,
         "--over time: B has no dimension 'time'; its dimensions are (y, z)"),
        (("x", "time"), ("time", "y"), "time", (True, False), UsageError,
         "--over time contradicts --transpose-a: A is (x, time), so 'time' is summed as A is "
         "stored; drop --transpose-a"),
        (("x", "time"), ("time", "y"), "time", (False, True), UsageError,
         "--over time contradicts --transpose-b: B is (time, y)"),
        (("x", "time"), (None, None), "time", (False, False), UsageError,
         "--over needs dimension names, and B has none"),
        (("mode", "lat", "lon"), ("time", "lon", "lat"), "lat,lon", (False, False), UsageError,
         "--over lat,lon: A stores them as (lat, lon) and B as (lon, lat)"),
        (("x", "lat"), ("lat", "mode"), "lat", (False, False), InputError,
         "--over lat: A's 'lat' has 6 elements and B's 7"),
    ],
)  # fmt: skip
def test_multiply_refusals(
    a: Names,
    b: Names,
    over: str,
    given: tuple[bool, bool],
    error: type[Exception],
    says: str,
) -> None:
    shapes = (_shape(a), (7, 5) if b == ("lat", "mode") else _shape(b))
    with pytest.raises(error, match=re.escape(says)):
        resolve_multiply((a, b), shapes, over, given)


# --- on the command line and in Python -------------------------------------------------------


def named(path: Path, data: Any, chunks: tuple[int, ...], names: Names | None) -> str:
    """A Zarr v3 array with ``dimension_names`` (None: unnamed)."""
    zarr.create_array(str(path), data=data, chunks=chunks, dimension_names=names)
    return str(path)


@pytest.fixture
def arrays(tmp_path: Path) -> dict[str, str]:
    """X (variants, samples) and samples-first, A (time, x), B (time, y), an unnamed U, and
    xarray's v2 dataset with a (time, x) variable."""
    rng = np.random.default_rng(7)
    made = {
        "X": named(tmp_path / "x.zarr", rng.random((12, 5), "float32"), (6, 5),
                   ("variants", "samples")),
        "S": named(tmp_path / "s.zarr", rng.random((5, 12), "float32"), (5, 6),
                   ("samples", "variants")),
        "A": named(tmp_path / "a.zarr", rng.random((10, 3), "float32"), (5, 3), ("time", "x")),
        "B": named(tmp_path / "b.zarr", rng.random((10, 4), "float32"), (5, 4), ("time", "y")),
        "U": named(tmp_path / "u.zarr", rng.random((10, 3), "float32"), (5, 3), None),
    }  # fmt: skip
    ds = xr.Dataset({"v": (("time", "x"), rng.random((10, 3), "float32"))})
    ds.to_zarr(tmp_path / "ds.zarr", zarr_format=2, consolidated=True)
    made["V2"] = str(tmp_path / "ds.zarr" / "v")
    return made


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["gram", "X", "--over", "time"],
         "error: --over time: X has no dimension 'time'; its dimensions are (variants, samples)"),
        (["gram", "X", "--over", "variants", "--rows"],
         "error: --over variants contradicts --rows: X is (variants, samples)"),
        (["gram", "U", "--over", "time"], "error: --over needs dimension names, and X has none"),
        (["gram", "X", "--stack", "variants", "--over", "variants"],
         "error: --over variants and --stack variants disagree"),
        (["multiply", "A", "B", "--over", "x"],
         "error: --over x: B has no dimension 'x'; its dimensions are (time, y)"),
        (["multiply", "A", "B", "--over", "time", "--transpose-b"],
         "error: --over time contradicts --transpose-b: B is (time, y)"),
        (["multiply", "A", "U", "--over", "time"],
         "error: --over needs dimension names, and B has none"),
        (["multiply", "A", "B"],
         "error: A and B share the dimension 'time', but the product sums A's 'x' against B's "
         "'time'; pass --over time (or --transpose-a)"),
        (["multiply", "V2", "B"],  # xarray's v2 _ARRAY_DIMENSIONS
         "error: A and B share the dimension 'time'"),
    ],
)  # fmt: skip
def test_refused_on_the_command_line(
    arrays: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    command, *rest = argv
    args = [arrays.get(x, x) for x in rest]
    operands = 1 if command == "gram" else 2
    args.insert(operands, str(tmp_path / "out.zarr"))
    before = tree_digest(tmp_path)
    done = run_main([command, *args, "--workers", "1", "--no-progress"], capsys)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert error_line(done).startswith(says), error_line(done)
    assert tree_digest(tmp_path) == before, "a refused run wrote or changed something"


def test_without_names_the_flags_stand(arrays: dict[str, str], tmp_path: Path) -> None:
    job = prepare(arrays["U"], arrays["U"], str(tmp_path / "o.zarr"), transpose_a=True)
    assert job.store.transposed == (True, False) and job.store.splits == (None, None)
    job = prepare(arrays["A"], arrays["U"], str(tmp_path / "o.zarr"), transpose_a=True)
    assert job.store.transposed == (True, False)  # A (time, x) with an unnamed B: no check


@pytest.mark.parametrize(
    ("x", "over", "stack", "rows"),
    [("X", "variants", None, False), ("S", "variants", None, True), ("S", None, "samples", True)],
)
def test_gram_by_name_is_planned_as_the_flags(
    arrays: dict[str, str], tmp_path: Path, x: str, over: str | None, stack: str | None, rows: bool
) -> None:
    out = str(tmp_path / "g.zarr")
    job = prepare_gram(arrays[x], out, over=over, stack=stack)
    assert job.store.transposed == (not rows, rows)
    assert job.plan.out.shape == (5, 5)  # samples x samples either way
    assert job.dimension_names == ("samples", "samples_2")


def test_products_by_name_match_numpy(
    arrays: dict[str, str], tmp_path: Path, client: Client
) -> None:
    a, b = (zarr.open_array(arrays[k])[:] for k in "AB")
    c = str(tmp_path / "c.zarr")
    multiply(arrays["A"], arrays["B"], c, over="time", client=client)
    np.testing.assert_allclose(zarr.open_array(c)[:], a.T.astype("f8") @ b, rtol=1e-5)
    assert zarr.open_array(c).metadata.dimension_names == ("x", "y")
    s = zarr.open_array(arrays["S"])[:]
    g = str(tmp_path / "g.zarr")
    gram(arrays["S"], g, over="variants", client=client)  # samples-first: X·Xᵀ
    np.testing.assert_allclose(zarr.open_array(g)[:], s.astype("f8") @ s.T, rtol=1e-5)

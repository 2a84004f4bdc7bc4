"""gram --center, --scale, --kinship end to end: G against float64 numpy (np.cov, np.corrcoef,
VanRaden's matrix) in both orientations, over several tiles, K panels and a split K; OUT's
record and moments; --verify and the standalone verify, which fails a tampered G and refuses
an X changed since; the refusals (exit 2, one `error:` line, nothing written); --resume with
another standardization."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import gram, verify_product
from pipeline.errors import PipelineError
from pipeline.plan.fitted_costs import COSTS
from pipeline.plan.standardize import MEAN_KEY, Standardize
from tests.helpers import run_cli, run_main, write_array
from tests.pipeline.test_cli_refusals import FAST_CLUSTER, error_line, tree_digest


@pytest.fixture
def many_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans of several tiles for small products (no modelled cost per task), as test_gram's."""
    free_tasks = replace(COSTS, task_seconds=0.0)
    monkeypatch.setattr("pipeline.facts.job_plan.host_costs", lambda: free_tasks)


@pytest.fixture
def chunk_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """One chunk per moments task (the client cuts X): Chan's merges run on the cluster."""
    monkeypatch.setattr("pipeline.run.moments.BLOCK_ELEMENTS", 1)


# ---------------------------------------------------------------------------------------------
# Data and float64 references


def kelvin(seed: int, shape: tuple[int, int], dtype: str = "float32") -> Any:
    """Temperatures: mean 280, spread 3 (per variable a little different)."""
    rng = np.random.default_rng(seed)
    x = 280.0 + rng.uniform(-2, 2, shape[1]) + 3.0 * rng.standard_normal(shape)
    return x.astype(dtype)


def genotypes(seed: int, samples: int, variants: int) -> Any:
    """Dosages 0/1/2 (samples x variants) at allele frequencies 0.05..0.95, with some
    monomorphic variants (all 0, all 2) VanRaden leaves out, and one all heterozygous (p = ½,
    kept)."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.95, variants)
    x = rng.binomial(2, p, (samples, variants)).astype(np.int8)
    x[:, 3], x[:, 10], x[:, 11], x[:, 20] = 0, 2, 0, 1
    return x


def vanraden(samples_by_variants: Any, dtype: Any = np.float64) -> Any:
    """G = Z Zᵀ / m, Z = (x − 2p)/√(2p(1 − p)) over the variants with p in (0, 1); Z is
    computed in float64 and rounded to ``dtype``, the product taken in ``dtype``."""
    x = samples_by_variants.astype(np.float64)
    p = x.mean(axis=0) / 2
    keep = (p > 0) & (p < 1)
    z = (x[:, keep] - 2 * p[keep]) / np.sqrt(2 * p[keep] * (1 - p[keep]))
    z = z.astype(dtype)
    return (z @ z.T) / dtype(keep.sum())


def reference(x: Any, mode: str, rows: bool, ddof: int, dtype: Any = np.float64) -> Any:
    """numpy's answer, computed in ``dtype`` (float64: the reference; float32: numpy's own
    float32 error, the yardstick)."""
    if mode == "kinship":  # --rows: X samples x variants; else variants x samples
        return vanraden(x if rows else x.T, dtype)
    data = x.astype(dtype) if x.dtype.kind in "iu" else x
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant variable: NaN
        if mode == "center":
            return np.cov(data, rowvar=rows, ddof=ddof, dtype=dtype)
        return np.corrcoef(data, rowvar=rows, dtype=dtype)


def assert_standardized(g: Any, x: Any, mode: str, rows: bool, ddof: int = 1) -> None:
    """G == numpy's in float64: to 1e-13 of its largest element for float64 G; for float32 G
    within twice the error numpy's own float32 computation makes. A correlation's diagonal is
    exactly 1 and every element within [-1, 1]."""
    want = reference(x, mode, rows, ddof)
    assert g.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(g), nan, err_msg="NaN where numpy has none, or not")
    size = float(np.abs(want[~nan]).max())
    error = float(np.abs(g.astype(np.float64) - want)[~nan].max())
    if g.dtype == np.float64:
        assert error <= 1e-13 * size, f"error {error:.3g} > 1e-13 x {size:.3g}"
    else:
        own = float(np.abs(reference(x, mode, rows, ddof, np.float32) - want)[~nan].max())
        # Dosages are small integers: numpy's float32 is sometimes nearly exact on a small X,
        # so a kinship may also be within a few float32 ulps of G's largest element.
        ulps = 8 * float(np.finfo(np.float32).eps) * size if mode == "kinship" else 0.0
        assert error <= max(2 * own, ulps), f"error {error:.3g} > 2 x numpy's float32 {own:.3g}"
    if mode == "scale":
        diagonal = np.diag(g)[~np.isnan(np.diag(want))]
        np.testing.assert_array_equal(diagonal, 1.0)
        assert (np.abs(g[~nan]) <= 1).all()


def variables_mean(x: Any, mode: str, rows: bool) -> Any:
    """The per-variable (kinship: per-variant) means OUT's moments hold, in float64."""
    per_column = (mode == "kinship") == rows
    return x.astype(np.float64).mean(axis=0 if per_column else 1)


# ---------------------------------------------------------------------------------------------
# G against numpy, through the API


CASES = [
    # (mode, rows, X's dtype, ddof, shape, chunks, Zarr format, the plan's shape), one a line
    # 900x600 in 256-chunks: G is 3x3 blocks (6 tiles), K two panels, both axes ragged
    ("center", False, "float32", 1, (900, 600), (256, 256), 3, "tiles"),
    ("scale", True, "float32", 1, (600, 900), (256, 256), 3, "tiles"),  # X Xᵀ: rows are variables
    # one tile, K split in two groups (pipeline.run.worker.tile_write finishes it)
    ("scale", False, "float32", 1, (1100, 600), (300, 200), 3, "split"),
    ("center", True, "float32", 0, (600, 1100), (200, 300), 3, "split"),
    # one 600x600 tile written in three bands of rows (pipeline.run.band_writer), 4 K panels
    ("scale", False, "float32", 1, (2000, 600), (256, 256), 3, "bands"),
    # float64: tight; Zarr v2 inputs; chunks 17x23 cut both axes unevenly
    ("center", False, "float64", 5, (90, 70), (17, 23), 2, ""),
    ("scale", True, "float64", 1, (70, 90), (23, 17), 2, ""),
    ("center", False, "float64", 0, (1100, 300), (256, 100), 3, "split"),
    # genotypes: samples x variants with --rows (6 tiles), variants x samples without
    ("kinship", True, "int8", 1, (600, 900), (256, 256), 3, "tiles"),
    ("kinship", False, "int8", 1, (130, 70), (33, 16), 2, ""),
]


def assert_plan(plan: Any, shape: str) -> None:
    """The plan has the shape the case is there for."""
    bands = plan.block_shape[0] < plan.tile_shape[0]
    if shape == "tiles":
        assert plan.n_tiles > 1 and len(plan.k_panels) > 1, plan
    if shape == "split":
        assert plan.split_k > 1, plan
    if shape == "bands":
        assert plan.n_tiles == 1 and plan.split_k == 1 and bands, plan


@pytest.mark.parametrize(
    ("mode", "rows", "dtype", "ddof", "shape", "chunks", "zarr_format", "plan_shape"), CASES
)
def test_matches_numpy(
    tmp_path: Path,
    client: Client,
    request: pytest.FixtureRequest,
    chunk_blocks: None,
    mode: str,
    rows: bool,
    dtype: str,
    ddof: int,
    shape: tuple[int, int],
    chunks: tuple[int, int],
    zarr_format: int,
    plan_shape: str,
) -> None:
    if plan_shape != "bands":  # the host's cost per task makes one tile of bands
        request.getfixturevalue("many_tiles")
    if mode == "kinship":
        samples, variants = shape if rows else shape[::-1]
        x = genotypes(sum(shape), samples, variants)
        x = x if rows else x.T
    else:
        x = kelvin(sum(shape), shape, dtype)
    x_url = write_array(tmp_path / "x.zarr", x, chunks, zarr_format)
    out = str(tmp_path / "g.zarr")
    options: dict[str, Any] = {mode: True} | ({"ddof": ddof} if mode == "center" else {})
    result = gram(x_url, out, rows=rows, client=client, verify=True, **options)
    g: Any = zarr.open_array(out, mode="r")
    assert g.dtype == (np.float64 if dtype == "float64" else np.float32)
    assert_standardized(g[:], x, mode, rows, ddof)
    assert result.verified is True
    assert_plan(result.plan, plan_shape)

    record = json.loads(g.attrs["tilegemm"])
    assert record["complete"] is True and record["verified"] is True
    summed, size = (shape[1], shape[0]) if rows else shape  # K, and G's side
    n = size if mode == "kinship" else summed  # each shift's values: per variable or variant
    mean = variables_mean(x, mode, rows)
    np.testing.assert_allclose(g.attrs[MEAN_KEY], mean, 1e-12)
    axis = "columns" if (mode == "kinship") == rows else "rows"
    std = record["standardize"]
    assert (std["mode"], std["axis"], std["count"]) == (mode, axis, n)
    if mode == "center":
        assert (std["ddof"], std["divisor"]) == (ddof, n - ddof)
    if mode == "scale":
        assert std["constant"] == 0 and "divisor" not in std
    if mode == "kinship":
        polymorphic = int(((mean > 0) & (mean < 2)).sum())
        assert (std["variants_used"], std["monomorphic"]) == (polymorphic, len(mean) - polymorphic)
        assert std["monomorphic"] == 3  # the all-0 and all-2 variants; the all-1 one is used


def test_a_constant_variable_gives_nan_as_numpy(tmp_path: Path, client: Client) -> None:
    """A correlation with a constant variable: its row and column NaN (its diagonal too), as
    np.corrcoef's; the rest as numpy's, and the record counts it."""
    x = kelvin(5, (80, 30))
    x[:, 7] = 281.25
    x_url = write_array(tmp_path / "x.zarr", x, (25, 11))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, client=client, scale=True)
    g: Any = zarr.open_array(out, mode="r")
    assert_standardized(g[:], x, "scale", rows=False)
    assert np.isnan(g[7]).all() and np.isnan(g[:, 7]).all()
    assert json.loads(g.attrs["tilegemm"])["standardize"]["constant"] == 1


def test_float32_keeps_the_digits_a_large_mean_would_cost(tmp_path: Path, client: Client) -> None:
    """The point of centering as X is read, in float64: a one-pass float32 covariance
    (XᵀX − n·mean·meanᵀ)/(n − 1) of 280 K temperatures loses its digits; ours does not."""
    x = kelvin(9, (400, 40))
    x_url = write_array(tmp_path / "x.zarr", x, (128, 16))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, client=client, center=True)
    want = np.cov(x.astype(np.float64), rowvar=False)
    mean = x.mean(axis=0, dtype=np.float32)
    naive = (x.T @ x - np.float32(400) * np.outer(mean, mean)) / np.float32(399)
    got = zarr.open_array(out, mode="r")[:]
    size = np.abs(want).max()
    assert np.abs(naive - want).max() > 1e-2 * size  # float32's cancellation: the naive way
    assert np.abs(got - want).max() < 1e-5 * size


@pytest.fixture(scope="module")
def in_process() -> Iterator[Client]:
    """One in-process worker: the product's code can be changed by monkeypatch."""
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.mark.parametrize(
    ("mode", "rows", "broken"),
    [
        ("center", False, "apply"),  # X not centered: XᵀX/(n − 1)
        ("scale", True, "apply"),
        ("kinship", True, "apply"),
        ("scale", False, "finish"),  # a correlation's diagonal a few ulp off 1, not clipped
    ],
)
def test_the_comparison_catches_a_skipped_step(
    tmp_path: Path,
    in_process: Client,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    rows: bool,
    broken: str,
) -> None:
    """The comparison with numpy fails G computed with a step of the standardization left
    out; verify, reading X through the same Standardize, cannot tell (the tampered-G test
    below shows it tells a wrong G)."""
    x = genotypes(2, 60, 90) if mode == "kinship" else kelvin(2, (300, 64))
    x_url = write_array(tmp_path / "x.zarr", x, (64, 32))
    monkeypatch.setattr(Standardize, broken, lambda self, *args: None)
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, rows=rows, client=in_process, **{mode: True})
    with pytest.raises(AssertionError):
        assert_standardized(zarr.open_array(out, mode="r")[:], x, mode, rows)


# ---------------------------------------------------------------------------------------------
# The CLI: --verify, the standalone verify on a correct, a tampered and a stale G


@pytest.mark.parametrize(
    ("mode", "rows", "flags"),
    [
        ("center", False, ["--center", "--ddof", "0"]),
        ("kinship", True, ["--kinship", "--rows"]),
    ],
)
def test_cli_verify_passes_fails_a_tampered_g_and_refuses_a_changed_x(
    tmp_path: Path, mode: str, rows: bool, flags: list[str]
) -> None:
    x = genotypes(7, 70, 130) if mode == "kinship" else kelvin(7, (203, 57))
    chunks = (40, 25) if mode == "center" else (32, 48)
    x_url = write_array(tmp_path / "x.zarr", x, chunks)
    g_url = str(tmp_path / "g.zarr")
    done = run_cli("gram", x_url, g_url, *flags, "--verify", *FAST_CLUSTER)
    assert done.returncode == 0, done.stderr
    assert "verify passed" in done.stdout, done.stdout
    g: Any = zarr.open_array(g_url, mode="r+")
    good = g[:]
    assert_standardized(good, x, mode, rows, ddof=0)
    verify = ("verify", x_url, x_url, g_url, *FAST_CLUSTER)
    done = run_cli(*verify)
    assert done.returncode == 0, done.stderr
    assert "verify ok" in done.stdout, done.stdout

    # One element (and its mirror, so G stays symmetric) off by 5 % of G's largest
    i, j = 3, 17
    g[i, j] = g[j, i] = good[i, j] + 0.05 * np.abs(good).max()
    done = run_cli(*verify)
    assert done.returncode not in (0, 2), (done.stdout, done.stderr)
    assert "verify ok" not in done.stdout
    g[i, j] = g[j, i] = good[i, j]

    # X changed after G was written (same shape, chunks, dtype): its moments no longer match
    changed = x.copy()
    changed[0, :] = changed[1, :]
    zarr.create_array(x_url, data=changed, chunks=chunks, overwrite=True)
    before = tree_digest(tmp_path)
    done = run_cli(*verify)
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = error_line(done)
    assert "X changed after C was written" in line and "digest" in line, line
    assert tree_digest(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Refusals: exit 2, one `error:` line, nothing written


def refusal_inputs(root: Path) -> dict[str, str]:
    rng = np.random.default_rng(11)
    good = rng.integers(0, 3, (20, 12)).astype(np.int8)
    outside = good.copy()
    outside[4, 5] = 3  # a missing genotype coded as 3
    holed = kelvin(1, (20, 12), "float64")
    holed[6, 2] = np.nan
    return {
        "x": write_array(root / "x.zarr", good, (7, 5)),
        "outside": write_array(root / "outside.zarr", outside, (7, 5)),
        "holed": write_array(root / "holed.zarr", holed, (7, 5)),
        "complex": write_array(root / "complex.zarr", holed.astype(np.complex64), (7, 5)),
    }


REFUSALS = [
    # (id, argv with refusal_inputs' names, what the error line says, refused before X is read)
    ("kinship-and-center", ["gram", "x", "--kinship", "--center"], "drop --center and", True),
    ("ddof-alone", ["gram", "x", "--ddof", "1"], "--ddof sets --center's divisor", True),
    ("ddof-negative", ["gram", "x", "--center", "--ddof", "-1"], "whole number >= 0", True),
    ("ddof-not-a-number", ["gram", "x", "--center", "--ddof", "one"], "got 'one'", True),
    ("integer-dtype", ["gram", "x", "--center", "--dtype", "int32"], "not whole numbers", True),
    ("complex", ["gram", "complex", "--center"], "--center takes real data; X is complex64", True),
    ("multiply-center", ["multiply", "x", "x", "--center"],
     "--center: gram's option(s), for G = XᵀX", True),
    ("multiply-stack", ["multiply", "x", "x", "--stack", "a"],
     "multiply names the summed dimensions with --over", True),
    # X is 20x12: 20 values per variable (its columns), 12 with --rows (its rows)
    ("ddof-is-n", ["gram", "x", "--center", "--ddof", "20"], "--ddof 20 leaves no divisor", False),
    ("ddof-above-n", ["gram", "x", "--rows", "--center", "--ddof", "13"], "has 12 value(s)",
     False),
    ("kinship-outside", ["gram", "outside", "--kinship"], "from 0 to 3", False),
    ("missing-alone", ["gram", "x", "--missing", "impute"], "add --center, --scale or --kinship",
     True),
    ("missing-code-alone", ["gram", "x", "--missing-code", "-1"], "drop --missing-code", True),
    ("kinship-form", ["gram", "x", "--kinship", "gcta"], "invalid choice: 'gcta'", True),
    ("center-nan", ["gram", "holed", "--center"], "(the first in column 2); --center", False),
    ("scale-nan", ["gram", "holed", "--rows", "--scale"], "(the first in row 6); --scale", False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "says", "early"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str, early: bool
) -> None:
    """Refused before X is read: in this process (fast); after its moments are measured: as a
    user meets it, in a subprocess with a cluster of its own."""
    urls = refusal_inputs(tmp_path)
    command, *rest = argv
    args = [urls.get(a, a) for a in rest]
    args.insert(1 if command == "gram" else 2, str(tmp_path / "g.zarr"))
    before = tree_digest(tmp_path)
    full = [command, *args, *FAST_CLUSTER]
    done = run_main(full, capsys) if early else run_cli(*full)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in error_line(done)
    assert tree_digest(tmp_path) == before, "a refused run wrote or changed something"


# ---------------------------------------------------------------------------------------------
# --resume and --overwrite of a standardized G


@pytest.mark.parametrize(
    ("other", "says"),
    [
        ({"center": True, "ddof": 0}, "this run has center=True ddof=0"),  # another divisor
        ({}, "this run has no center=True, scale=True or kinship=True"),  # a plain product
        ({"scale": True}, "this run has scale=True"),  # a correlation
        ({"kinship": True}, "this run has kinship=True"),
    ],
    ids=["ddof-0", "plain", "scale", "kinship"],
)
def test_resume_with_another_standardization_is_refused(
    tmp_path: Path, client: Client, other: dict[str, Any], says: str
) -> None:
    x = np.random.default_rng(3).integers(0, 3, (40, 24)).astype(np.int8)
    x_url = write_array(tmp_path / "x.zarr", x, (16, 10))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, client=client, center=True)
    before = tree_digest(tmp_path)
    started = "was started with center=True ddof=1 and " + says
    with pytest.raises(PipelineError, match=rf"^resume=True: G \(.*\) {started}; rerun with"):
        gram(x_url, out, client=client, resume=True, **other)
    assert tree_digest(tmp_path) == before
    again = gram(x_url, out, client=client, resume=True, center=True)  # as it was started
    assert again.tiles_computed == 0
    assert_standardized(zarr.open_array(out, mode="r")[:], x, "center", rows=False)


def test_a_refused_overwrite_leaves_the_old_g(tmp_path: Path, client: Client) -> None:
    x = kelvin(4, (30, 12))
    x_url = write_array(tmp_path / "x.zarr", x, (7, 5))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, client=client, center=True)
    before = tree_digest(tmp_path)
    with pytest.raises(PipelineError, match=r"^ddof=30 leaves no divisor"):
        gram(x_url, out, client=client, overwrite=True, center=True, ddof=30)
    assert tree_digest(tmp_path) == before


def test_standalone_verify_through_the_api(tmp_path: Path, client: Client) -> None:
    """verify_product measures X again and checks G against X standardized."""
    x = kelvin(8, (64, 20), "float64")
    x_url = write_array(tmp_path / "x.zarr", x, (16, 8))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, rows=True, client=client, scale=True)
    assert verify_product(client, x_url, x_url, out).passed
    g: Any = zarr.open_array(out, mode="r+")
    g[2, 2] = 1 - 1e-3  # the diagonal of a correlation, a thousandth off
    assert not verify_product(client, x_url, x_url, out).passed
    assert math.isclose(float(g[3, 3]), 1.0)


# ---------------------------------------------------------------------------------------------
# Found by this file's first run, fixed since


def test_int64_genotypes(tmp_path: Path, client: Client) -> None:
    x = genotypes(6, 40, 30).astype(np.int64)
    x_url = write_array(tmp_path / "x.zarr", x, (16, 16))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, rows=True, client=client, kinship=True)
    assert_standardized(zarr.open_array(out, mode="r")[:], x, "kinship", rows=True)


def test_verify_passes_a_rare_binary_variables_covariance(tmp_path: Path, client: Client) -> None:
    x = np.ones((56, 6), np.int8)  # columns 2, 4 and 5 hold one or two zeros, the rest 1s
    x[[0, 23], 2], x[40, 4], x[4, 5] = 0, 0, 0
    x_url = write_array(tmp_path / "x.zarr", x, (16, 6))
    out = str(tmp_path / "g.zarr")
    gram(x_url, out, client=client, center=True)
    g: Any = zarr.open_array(out, mode="r")[:]
    z = ((x - x.mean(axis=0)) / math.sqrt(55)).astype(np.float32)
    # G is what float32 arithmetic gives for X centered, 30 ulp off in G[5, 5] as numpy's is
    np.testing.assert_allclose(g, z.T @ z, rtol=0, atol=1e-9)
    assert verify_product(client, x_url, x_url, out).passed

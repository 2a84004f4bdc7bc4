"""The three users' recipes, run as the README prints them, each checked against float64
numpy or pandas: a GRM of sgkit-style calls by dimension name, with missing calls, in both
forms; the EOF covariance of a (time, lat, lon) field with land points, unstacked; a numpy
projection against a stored X and the correlation of embeddings from the Python API."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import zarr

from tests.helpers import REPO, run_cli, write_array
from tests.pipeline.test_kinship_missing import calls, imputed_kinship

xr = pytest.importorskip("xarray")

README = (REPO / "README.md").read_text()


def block(lang: str, holding: str) -> str:
    """The README's one ``lang`` code block holding ``holding``."""
    found = [b.split("```", 1)[0] for b in README.split(f"```{lang}\n")[1:] if holding in b]
    assert len(found) == 1, f"{len(found)} {lang} blocks hold {holding!r}"
    return found[0]


def command(holding: str) -> list[str]:
    """The README's command line holding ``holding``, as its arguments after ``-m pipeline``."""
    (line,) = [x for x in block("", holding).splitlines() if holding in x] or [
        x for x in block("bash", holding).splitlines() if holding in x
    ]
    words = shlex.split(line)
    assert words[:3] == ["python", "-m", "pipeline"], line
    return words[3:]


def ran(argv: list[str], cwd: Path) -> None:
    done = run_cli(*argv, "--no-progress", "--workers", "1", cwd=cwd, timeout=180)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("form", ["standardized", "vanraden"])
def test_the_sgkit_grm_by_dimension_names(tmp_path: Path, form: str) -> None:
    g = calls(11, 12, 60)  # samples x variants, NaN calls; sgkit stores (variants, samples)
    ds = xr.Dataset({"call_dosage": (("variants", "samples"), g.T.astype(np.float32))})
    ds.chunk({"variants": 16, "samples": 5}).to_zarr(tmp_path / "geno.zarr", zarr_format=2)
    argv = command("geno.zarr/call_dosage geno.zarr/grm")
    assert argv[argv.index("--kinship") + 1 :][:2] == ["--over", "variants"]
    if form == "vanraden":
        argv.insert(argv.index("--kinship") + 1, "vanraden")
    ran(argv, tmp_path)
    grm = xr.open_zarr(tmp_path / "geno.zarr")["grm"]
    assert grm.dims == ("samples", "samples_2")
    np.testing.assert_allclose(grm.values, imputed_kinship(g, form), rtol=2e-5, atol=2e-5)


def test_the_eof_covariance_of_a_field_with_land_points(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    time, lat, lon = 36, 4, 6
    t2m = 280 + rng.standard_normal((time, lat, lon))
    land = rng.random((lat, lon)) < 0.3
    land[0, 0] = True
    t2m[:, land] = np.nan
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m.astype(np.float32))},
        coords={"lat": np.linspace(-30, 30, lat), "lon": np.arange(lon) * 10.0},
    )
    ds.chunk({"time": 12, "lat": 2, "lon": 3}).to_zarr(tmp_path / "ds.zarr", zarr_format=2)
    ran(command("ds.zarr/t2m ds.zarr/C"), tmp_path)
    code = block("python", 'ds = xr.open_zarr("ds.zarr")')
    found: dict[str, Any] = {"xr": xr, "pd": pd, "np": np}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        exec(code, found)  # noqa: S102  (our own README's snippet)
    c = found["C"]
    assert c.dims == ("lat", "lon", "lat_2", "lon_2")
    flat = pd.DataFrame(t2m.reshape(time, -1))
    keep = ~flat.isna().any().to_numpy()
    want = np.full((lat * lon, lat * lon), np.nan)
    want[np.ix_(keep, keep)] = flat.loc[:, keep].cov().to_numpy()
    got = c.values.reshape(lat * lon, lat * lon)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(c["lat"].values, ds.lat.values)


def test_the_api_with_a_projection_and_embeddings(tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    x = rng.standard_normal((96, 256)).astype(np.float32)
    write_array(tmp_path / "x.zarr", x, (32, 64), 3)
    embeddings = rng.standard_normal((80, 24)).astype(np.float32)
    code = block("python", "pipeline.gram(embeddings")
    found: dict[str, Any] = {"rng": rng, "embeddings": embeddings}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        exec("import pipeline\n" + code, found)  # noqa: S102  (our own README's snippet)
    proj = found["proj"]
    wide = x.astype(np.float64)
    xp = zarr.open_array(tmp_path / "xp.zarr", mode="r")[:]
    np.testing.assert_allclose(xp, wide @ proj, rtol=1e-4, atol=1e-3)
    px = zarr.open_array(tmp_path / "px.zarr", mode="r")[:]
    np.testing.assert_allclose(px, proj.T.astype(np.float64) @ wide.T, rtol=1e-4, atol=1e-3)
    corr = found["g"].open()[:]
    want = np.corrcoef(embeddings.astype(np.float64), rowvar=False)
    np.testing.assert_allclose(corr, want, rtol=1e-5, atol=1e-5)
    assert re.search(r"scale=True", code)

"""pca and svd against float64 numpy and scikit-learn: accuracy no worse than scikit-learn's
randomized SVD with the same oversampling and iterations, scikit-learn's own conventions (signs,
explained variance, scores), refusals, OUT's rules, resume after a failed step, the command
line and verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline.decompose import _Runner, pca, prepare_decomposition, svd
from pipeline.errors import PipelineError, UsageError
from tests.helpers import run_cli, write_array

decomposition = pytest.importorskip("sklearn.decomposition")
extmath = pytest.importorskip("sklearn.utils.extmath")
preprocessing = pytest.importorskip("sklearn.preprocessing")


def spectrum(rng: np.random.Generator, n: int, p: int, decay: float = 0.7) -> Any:
    """A matrix with a known, decaying spectrum, column means away from zero, a little noise."""
    r = min(n, p)
    u, _ = np.linalg.qr(rng.standard_normal((n, r)))
    v, _ = np.linalg.qr(rng.standard_normal((p, r)))
    s = 50 * decay ** np.arange(r)
    return (u * s) @ v.T + 0.001 * rng.standard_normal((n, p)) + rng.uniform(-3, 3, p)


def angle(ours: Any, exact: Any) -> float:
    """The largest principal angle between two row spaces (orthonormal rows)."""
    cosines = np.linalg.svd(ours @ exact.T, compute_uv=False)
    return float(np.arccos(np.clip(cosines.min(), -1, 1)))


def group(path: Path) -> Any:
    return zarr.open_group(str(path), mode="r")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accuracy_no_worse_than_randomized_svd(tmp_path: Path, client: Client, dtype: str) -> None:
    """The top-K subspace and singular values against the exact SVD of the centred matrix, as
    close as scikit-learn's randomized_svd with the same P and Q (the same seed policy: a
    fixed seed), in the matrix's own dtype."""
    rng = np.random.default_rng(1)
    x = spectrum(rng, 300, 120).astype(dtype)
    k, p, q = 6, 4, 1
    result = pca(write_array(tmp_path / "x.zarr", x, (64, 32)), str(tmp_path / "o"),
                 components=k, oversample=p, power_iterations=q, client=client)  # fmt: skip
    centred = x.astype(np.float64) - x.astype(np.float64).mean(axis=0)
    _, s_exact, vt_exact = np.linalg.svd(centred, full_matrices=False)
    data = (x - x.mean(axis=0)).astype(dtype)
    _, s_sk, vt_sk = extmath.randomized_svd(data, k, n_oversamples=p, n_iter=q, random_state=0)
    ours = group(tmp_path / "o")["components"][:].astype(np.float64)
    slack = 2.0  # another random sketch: the same distribution of errors, not the same draw
    floor = 50 * np.finfo(dtype).eps
    assert angle(ours, vt_exact[:k]) <= slack * angle(vt_sk, vt_exact[:k]) + floor
    ours_err = np.abs(result.singular_values - s_exact[:k]) / s_exact[:k]
    sk_err = np.abs(s_sk - s_exact[:k]) / s_exact[:k]
    assert ours_err.max() <= slack * sk_err.max() + floor


def test_pca_is_scikit_learns(tmp_path: Path, client: Client) -> None:
    """With a spectral gap the sketch finds the components exactly: scikit-learn's PCA's
    components (signs included), explained variance and ratio, mean, and scores."""
    rng = np.random.default_rng(2)
    x = spectrum(rng, 200, 40, decay=0.3)
    url = write_array(tmp_path / "x.zarr", x, (50, 16))
    pca(url, str(tmp_path / "o"), components=3, client=client)
    got, exact = group(tmp_path / "o"), decomposition.PCA(3, svd_solver="full").fit(x)
    np.testing.assert_allclose(got["components"][:], exact.components_, atol=1e-9)
    np.testing.assert_allclose(got["explained_variance"][:], exact.explained_variance_, rtol=1e-9)
    np.testing.assert_allclose(
        got["explained_variance_ratio"][:], exact.explained_variance_ratio_, rtol=1e-9
    )
    np.testing.assert_allclose(got["mean"][:], exact.mean_, rtol=1e-12)
    np.testing.assert_allclose(got["scores"][:], exact.transform(x), atol=1e-8)
    for name in ("components", "scores", "singular_values", "explained_variance"):
        assert not np.isnan(got[name][:]).any()  # every element written (created NaN-filled)


def test_scale_is_standard_scaler_then_pca(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(3)
    x = spectrum(rng, 150, 30, decay=0.3) * rng.uniform(0.1, 10, 30)
    x[:, 7] = 4.0  # a constant variable: its scale is 1, as StandardScaler's, and it adds nothing
    url = write_array(tmp_path / "x.zarr", x, (50, 10))
    pca(url, str(tmp_path / "o"), components=3, scale=True, client=client)
    scaler = preprocessing.StandardScaler().fit(x)
    exact = decomposition.PCA(3, svd_solver="full").fit(scaler.transform(x))
    got = group(tmp_path / "o")
    np.testing.assert_allclose(got["scale"][:], scaler.scale_, rtol=1e-12)
    np.testing.assert_allclose(got["components"][:], exact.components_, atol=1e-8)
    np.testing.assert_allclose(
        got["explained_variance_ratio"][:], exact.explained_variance_ratio_, rtol=1e-8
    )


def test_svd_is_truncated_svd(tmp_path: Path, client: Client) -> None:
    """svd: X uncentred, TruncatedSVD's explained variance (of the scores) and ratio."""
    rng = np.random.default_rng(4)
    x = spectrum(rng, 120, 30, decay=0.3)
    url = write_array(tmp_path / "x.zarr", x, (40, 10))
    result = svd(url, str(tmp_path / "o"), components=3, client=client)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    scores = u[:, :3] * s[:3]
    got = group(tmp_path / "o")
    np.testing.assert_allclose(result.singular_values, s[:3], rtol=1e-10)
    np.testing.assert_allclose(np.abs(got["components"][:]), np.abs(vt[:3]), atol=1e-9)
    np.testing.assert_allclose(got["explained_variance"][:], scores.var(axis=0), rtol=1e-8)
    ratio = scores.var(axis=0) / x.var(axis=0).sum()
    np.testing.assert_allclose(got["explained_variance_ratio"][:], ratio, rtol=1e-8)
    assert "mean" not in got


def test_orientation_by_flag_or_name(tmp_path: Path, client: Client) -> None:
    """rows=True on Xᵀ, and over= naming the observations, give X's own decomposition."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(5)
    x = spectrum(rng, 60, 20, decay=0.3)
    plain = pca(write_array(tmp_path / "x.zarr", x, (20, 10)), str(tmp_path / "a"),
                components=2, client=client)  # fmt: skip
    flipped = pca(write_array(tmp_path / "xt.zarr", x.T, (10, 20)), str(tmp_path / "b"),
                  components=2, rows=True, client=client)  # fmt: skip
    ds = xr.Dataset({"d": (("variants", "samples"), x.T)})
    ds.to_zarr(tmp_path / "named.zarr", zarr_format=2)
    named = pca(str(tmp_path / "named.zarr/d"), str(tmp_path / "c"), components=2,
                over="samples", client=client)  # fmt: skip
    for other in (flipped, named):
        np.testing.assert_allclose(other.singular_values, plain.singular_values, rtol=1e-10)
    assert group(tmp_path / "c")["scores"].metadata.dimension_names == ("samples", "component")
    with pytest.raises(UsageError, match="'variants', 'samples'"):
        prepare_decomposition("pca", str(tmp_path / "named.zarr/d"), str(tmp_path / "d"),
                              components=2, over="time")  # fmt: skip
    with pytest.raises(UsageError, match="drop rows"):
        prepare_decomposition("pca", str(tmp_path / "named.zarr/d"), str(tmp_path / "d"),
                              components=2, over="variants", rows=True)  # fmt: skip


def test_integer_dosages_and_refusals(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(6)
    dosage = rng.integers(0, 3, (50, 30)).astype(np.int8)
    url = write_array(tmp_path / "g.zarr", dosage, (25, 10))
    result = pca(url, str(tmp_path / "o"), components=2, client=client)
    s = np.linalg.svd(dosage - dosage.mean(axis=0), compute_uv=False)
    np.testing.assert_allclose(result.singular_values, s[:2], rtol=1e-3)  # a randomized bound
    wide = write_array(tmp_path / "w.zarr", dosage.astype(np.int64), (25, 10))
    with pytest.raises(UsageError, match="cast X to float64"):
        prepare_decomposition("pca", wide, str(tmp_path / "w"), components=2)
    with pytest.raises(UsageError, match="at most 30 components"):
        prepare_decomposition("pca", url, str(tmp_path / "k"), components=31)
    with pytest.raises(UsageError, match="svd decomposes X as it is"):
        prepare_decomposition("svd", url, str(tmp_path / "s"), components=2, scale=True)
    holed = dosage.astype(np.float32)
    holed[3, 4] = np.nan
    with pytest.raises(PipelineError, match="1 NaN value"):
        pca(write_array(tmp_path / "n.zarr", holed, (25, 10)), str(tmp_path / "n"),
            components=2, client=client)  # fmt: skip


def test_out_rules(tmp_path: Path, client: Client) -> None:
    """OUT existing needs overwrite or resume; a folder of someone else's is never replaced;
    resume with other options is refused; resuming a complete OUT runs nothing."""
    rng = np.random.default_rng(7)
    url = write_array(tmp_path / "x.zarr", spectrum(rng, 40, 12), (20, 6))
    out = str(tmp_path / "o")
    pca(url, out, components=2, client=client)
    with pytest.raises(FileExistsError):
        prepare_decomposition("pca", url, out, components=2)
    with pytest.raises(UsageError, match="another decomposition"):
        prepare_decomposition("pca", url, out, components=3, resume=True)
    again = pca(url, out, components=2, resume=True, client=client)
    assert (again.x_passes, again.steps_run) == (0, 0)
    pca(url, out, components=3, overwrite=True, client=client)
    assert group(Path(out))["components"].shape == (3, 12)
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(PipelineError, match="not a decomposition written by this tool"):
        prepare_decomposition("pca", url, str(foreign), components=2, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "keep"


def test_resume_after_a_failed_step(
    tmp_path: Path, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped mid-way keeps its finished steps; resume does only the rest, and gives
    the uninterrupted run's bytes."""
    rng = np.random.default_rng(8)
    url = write_array(tmp_path / "x.zarr", spectrum(rng, 60, 16), (20, 8))
    kw: dict[str, Any] = {"components": 3, "power_iterations": 2, "client": client}
    whole = pca(url, str(tmp_path / "whole"), passes_from="storage", **kw)
    calls = {"n": 0}
    original = _Runner._orthonormalize

    def failing(self: Any, step: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("killed")
        original(self, step)

    monkeypatch.setattr(_Runner, "_orthonormalize", failing)
    with pytest.raises(RuntimeError, match="killed"):
        pca(url, str(tmp_path / "o"), passes_from="storage", **kw)
    monkeypatch.setattr(_Runner, "_orthonormalize", original)
    resumed = pca(url, str(tmp_path / "o"), passes_from="storage", resume=True, **kw)
    assert resumed.steps_skipped > 0 and resumed.x_passes < whole.x_passes
    for name in ("components", "scores", "singular_values"):
        np.testing.assert_array_equal(group(tmp_path / "o")[name][:],
                                      group(tmp_path / "whole")[name][:])  # fmt: skip


def test_command_line_dry_run_errors_and_verify(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    x = spectrum(rng, 80, 20, decay=0.3).astype(np.float32)
    url = write_array(tmp_path / "x.zarr", x, (40, 10))
    out = str(tmp_path / "o")
    plan = run_cli("pca", url, out, "--components", "3", "--dry-run")
    assert plan.returncode == 0 and "passes over X" in plan.stdout
    assert not Path(out).exists()
    bad = run_cli("pca", url, out, "--components", "99", "--workers", "1")
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1
    assert "Traceback" not in bad.stderr
    done = run_cli("pca", url, out, "--components", "3", "--workers", "1", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("done: pca of 80x20, 3 component(s)")
    ok = run_cli("verify", url, out, "--workers", "1")
    assert ok.returncode == 0 and "verify ok" in ok.stdout, ok.stderr
    scores = zarr.open_group(out, mode="r+")["scores"]
    scores[0:5, 0] = -scores[0:5, 0]  # a chunk's values tampered with
    tampered = run_cli("verify", url, out, "--workers", "1")
    assert tampered.returncode == 1 and "FAILED" in tampered.stdout

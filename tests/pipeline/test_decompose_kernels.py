"""A decomposition's passes: on X held in the workers' memory or read from storage in every
pass, the same; on the GPU path (our CUDA kernel in the simulator here, tiny shapes, through
the staged engine as ``multiply`` runs it), the CPU backend's result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline.decompose import pca, svd
from tests.helpers import write_array


def test_pca_on_the_cuda_backend_matches_the_cpu(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((24, 3)) @ rng.standard_normal((3, 16))).astype(
        np.float32
    ) + 0.01 * rng.standard_normal((24, 16)).astype(np.float32)
    url = write_array(tmp_path / "x.zarr", x + 3, (8, 8))
    kw = {"components": 2, "oversample": 2, "power_iterations": 1, "client": client}
    cuda = pca(url, str(tmp_path / "cuda"), backend="cuda", **kw)
    cpu = pca(url, str(tmp_path / "cpu"), backend="cpu", **kw)
    assert (cuda.backend, cpu.backend) == ("cuda", "cpu")
    np.testing.assert_allclose(cuda.singular_values, cpu.singular_values, rtol=1e-5)
    for name in ("components", "scores", "mean"):
        got = zarr.open_group(str(tmp_path / "cuda"), mode="r")[name][:]
        want = zarr.open_group(str(tmp_path / "cpu"), mode="r")[name][:]
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("kind", "rows", "dtype"),
    [("pca", False, "float32"), ("pca", True, "float64"), ("svd", False, "int8")],
)
def test_x_held_in_memory_or_read_each_pass_agree(
    tmp_path: Path, client: Client, kind: str, rows: bool, dtype: str
) -> None:
    """X read once and held by the workers, or read from storage in every pass (each pass a
    ``multiply`` job): the same decomposition, to rounding; the held one reads X once."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 4)) @ rng.standard_normal((4, 30)) * 2 + 1
    stored = x.T if rows else x
    url = write_array(
        tmp_path / "x.zarr",
        stored.round().astype(dtype) if dtype == "int8" else stored.astype(dtype),
        (16, 8),
    )
    run = pca if kind == "pca" else svd
    kw = {"components": 3, "oversample": 3, "power_iterations": 2, "client": client, "rows": rows}
    held = run(url, str(tmp_path / "held"), passes_from="memory", **kw)
    read = run(url, str(tmp_path / "read"), passes_from="storage", **kw)
    assert (held.x_passes, read.x_passes) == (1, 2 * 2 + 3)
    rtol = 1e-4 if dtype == "float32" else 1e-9
    np.testing.assert_allclose(held.singular_values, read.singular_values, rtol=rtol)
    for name in ("components", "scores"):
        a = zarr.open_group(str(tmp_path / "held"), mode="r")[name][:]
        b = zarr.open_group(str(tmp_path / "read"), mode="r")[name][:]
        assert not np.isnan(a).any() and not np.isnan(b).any()
        np.testing.assert_allclose(a, b, rtol=rtol * 10, atol=rtol * 10 * np.abs(b).max())


def test_one_out_rewritten_by_either_path_on_one_cluster(tmp_path: Path, client: Client) -> None:
    """A long-lived worker keeps the folders earlier jobs pinned: OUT's passes made again by
    the other path are reached, not refused as swapped."""
    rng = np.random.default_rng(8)
    url = write_array(tmp_path / "x.zarr", rng.standard_normal((30, 12)), (10, 6))
    out = str(tmp_path / "out")
    found = [
        pca(url, out, components=2, client=client, overwrite=True, passes_from=mode)
        for mode in ("storage", "memory", "storage")
    ]
    for result in found[1:]:
        np.testing.assert_allclose(result.singular_values, found[0].singular_values, rtol=1e-9)

"""A decomposition's passes on the GPU path: our CUDA kernel (in the simulator here, tiny
shapes) through the staged engine, as ``multiply`` runs it, gives the CPU backend's result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr
from distributed import Client

from pipeline.decompose import pca
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

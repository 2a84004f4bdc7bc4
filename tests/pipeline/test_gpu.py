"""On a real GPU only (`make test-gpu`): the cuda backend end to end, ragged and large shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply
from tests.helpers import assert_product, random_matrix, write_array


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("m", "k", "n", "chunks"),
    [
        (1, 1000, 1, (1, 333)),  # 1x1 output, long K
        (997, 1531, 613, (256, 384)),  # ragged everywhere
        (4096, 4096, 4096, (1024, 1024)),  # interior tiles of the register-blocked kernel
    ],
)
def test_cuda_backend_on_a_gpu(
    tmp_path: Path, client: Client, dtype: str, m: int, k: int, n: int, chunks: tuple[int, int]
) -> None:
    rng = np.random.default_rng(m + n)
    a, b = random_matrix(rng, (m, k), dtype), random_matrix(rng, (k, n), dtype)
    out = str(tmp_path / "c.zarr")
    result = multiply(
        write_array(tmp_path / "a.zarr", a, chunks),
        write_array(tmp_path / "b.zarr", b, chunks[::-1]),
        out,
        client=client,
        backend="cuda",
    )
    assert result.backend == "cuda"
    assert_product(zarr.open_array(out)[:], a, b)

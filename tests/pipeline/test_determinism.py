"""The same output bytes whatever the cluster: 1, 2 or 3 workers, 1 or 2 threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import multiply
from tests.helpers import random_matrix, write_array

CLUSTERS = [(1, 1, False), (1, 2, False), (2, 1, True), (3, 1, True)]
"""(workers, threads per worker, processes)."""


@pytest.mark.parametrize(
    ("m", "k", "n", "chunks"),
    [
        (900, 1300, 700, (128, 256)),  # many tiles; tile shapes differ with the cluster
        (40, 20_000, 30, (40, 1000)),  # one output block: K split into a fixed tree
    ],
)
def test_bytes_do_not_depend_on_the_cluster(
    tmp_path: Path, m: int, k: int, n: int, chunks: tuple[int, int]
) -> None:
    rng = np.random.default_rng(m + k + n)
    a, b = random_matrix(rng, (m, k), "float32"), random_matrix(rng, (k, n), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, chunks)
    b_url = write_array(tmp_path / "b.zarr", b, (chunks[1], chunks[0]))
    outputs, tilings = [], set()
    for workers, threads, processes in CLUSTERS:
        out = str(tmp_path / f"c-{workers}-{threads}.zarr")
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=threads,
                processes=processes,
                dashboard_address=":0",
                host="127.0.0.1" if processes else None,
            ) as cluster,
            Client(cluster) as client,
        ):
            result = multiply(a_url, b_url, out, client=client)
        tilings.add((result.plan.tile_shape, result.plan.split_k))
        outputs.append(zarr.open_array(out, mode="r")[:])
    for other in outputs[1:]:
        assert other.tobytes() == outputs[0].tobytes()
    if m > 100:  # the point of the test: different tilings, same bytes
        assert len(tilings) > 1, tilings

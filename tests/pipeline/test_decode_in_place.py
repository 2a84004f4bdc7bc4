"""Large chunks decoded straight into the caller's buffer when a block is one chunk wide: the
same values as zarr's read, no scratch buffer for whole chunks, zarr's path for the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from pipeline.store import inputs
from pipeline.store.chunks import unsharded as chunk_read
from pipeline.store.chunks.bounded import bounded

CHUNKS = (512, 1024)  # 2 MiB of float32: over DIRECT_MAX_CHUNK_BYTES


@pytest.fixture()
def stored(tmp_path: Path) -> tuple[Any, np.ndarray]:
    values = np.random.default_rng(2).standard_normal((1700, 2500)).astype(np.float32)
    array = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=values.shape, chunks=CHUNKS, dtype="float32"
    )  # fmt: skip (zstd by default)
    array[:, :] = values
    return bounded(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")), values


@pytest.mark.parametrize(
    ("rows", "cols", "in_place"),
    [
        ((0, 1024), (1024, 2048), 2),  # two whole chunks
        ((100, 1600), (0, 1024), 2),  # partial first and last chunk rows: copied
        ((1024, 1700), (2048, 3072), 0),  # the last chunk column is narrower: zarr's path
    ],
)
def test_same_values_and_no_scratch_for_whole_chunks(
    stored: tuple[Any, np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    rows: tuple[int, int],
    cols: tuple[int, int],
    in_place: int,
) -> None:
    array, values = stored
    cols = (cols[0], min(cols[1], values.shape[1]))
    decoded_into: list[bool] = []
    real = chunk_read.decode_exact

    def spy(codec: str, data: Any, expected: int, what: str, into: Any = None) -> Any:
        decoded_into.append(into is not None and np.shares_memory(into, out))  # not scratch
        return real(codec, data, expected, what, into)

    monkeypatch.setattr(chunk_read, "decode_exact", spy)
    out = np.full((rows[1] - rows[0], cols[1] - cols[0]), np.nan, np.float32)
    got = inputs.read_block(array, rows, cols, "float32", out=out)
    assert np.array_equal(got, values[rows[0] : rows[1], cols[0] : cols[1]])
    assert sum(decoded_into) == in_place, decoded_into


def test_readable_only_one_chunk_wide(stored: tuple[Any, np.ndarray]) -> None:
    array, _ = stored
    assert chunk_read.readable(array, (0, 512), (0, 1024))
    assert not chunk_read.readable(array, (0, 512), (0, 2048))  # rows not contiguous in out
    assert not chunk_read.readable(array, (0, 512), (512, 1536))  # not on chunk columns
    assert not chunk_read.readable(array, (100, 600), (0, 1024))  # no whole chunk in it
    assert not chunk_read.readable(array)  # no block: large chunks go through zarr

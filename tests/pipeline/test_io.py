"""Zarr I/O helpers: the output codec choice and read-only inputs."""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline.errors import UsageError
from pipeline.store.inputs import open_input
from pipeline.store.output import Output, output_compressors
from tests.helpers import cpu_tile_task, write_array


@pytest.mark.parametrize(
    ("setting", "dtype", "codec"),
    [
        ("auto", "float32", None),  # noise mantissas: stored raw
        ("auto", "complex64", None),  # same for complex
        ("auto", "int64", "blosc"),  # integers compress
        ("zstd", "float64", "zstd"),  # asked for
        ("lz4", "float32", "blosc"),  # asked for
    ],
)
def test_output_codec(tmp_path: Path, setting: str, dtype: str, codec: str | None) -> None:
    with dask.config.set({"tilegemm.output-compressor": setting}):
        array = Output(str(tmp_path / "c.zarr")).create((10, 10), (5, 5), dtype, {})
    names = [type(c).__name__.lower() for c in array.compressors]
    assert (names == []) if codec is None else any(codec in n for n in names), names


def test_bad_codec_setting_is_a_usage_error() -> None:
    with (
        dask.config.set({"tilegemm.output-compressor": "brotli"}),
        pytest.raises(UsageError, match="use auto, none, lz4 or zstd"),
    ):
        output_compressors("float32")


def test_inputs_are_opened_read_only(tmp_path: Path) -> None:
    zarr.create_array(str(tmp_path / "a.zarr"), data=np.ones((4, 4)), chunks=(2, 2))
    array = open_input(str(tmp_path / "a.zarr"))
    with pytest.raises(ValueError, match="read-only"):
        array[0, 0] = 5


def _write_through_task_handles(spec: object, tile: object) -> list[str]:
    """On a worker: open A and B as a tile task does, try to write each, say what happened."""
    from pipeline.run.reading import open_task

    a, b, _ = open_task(spec, tile, ())
    said = []
    for array in (a, b):
        try:
            array[0, 0] = 5
            said.append("written")
        except ValueError as e:
            said.append(str(e))
    return said


def test_workers_open_inputs_read_only(tmp_path: Path, client: Client) -> None:
    """The handles a tile task reads A and B through, on a worker process, refuse writes."""
    ones = np.ones((4, 4), "float32")
    a_url = write_array(tmp_path / "a.zarr", ones, (2, 2))
    b_url = write_array(tmp_path / "b.zarr", ones, (2, 2))
    plan, spec = cpu_tile_task(a_url, b_url, tmp_path / "c.zarr")
    said = client.submit(_write_through_task_handles, spec, next(plan.tiles()), pure=False)
    assert ["read-only" in s for s in said.result()] == [True, True], said.result()
    for url in (a_url, b_url):
        np.testing.assert_array_equal(zarr.open_array(url, mode="r")[:], ones)

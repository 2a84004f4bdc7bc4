"""Zarr I/O helpers: the output codec choice and read-only inputs."""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
import zarr

from pipeline.errors import UsageError
from pipeline.store.inputs import open_input
from pipeline.store.output import Output, output_compressors


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

"""Test helpers: write inputs, make matrices, compare a product with float64 numpy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zarr

TOLERANCE = {
    "float16": 1e-2,
    "float32": 2e-4,
    "float64": 1e-11,
    "complex64": 2e-4,
    "complex128": 1e-11,
}
"""Relative error allowed against float64 numpy, scaled by |A|·|B|."""


def write_array(
    path: Path, data: np.ndarray[Any, Any], chunks: tuple[int, int], zarr_format: int = 3
) -> str:
    zarr.create_array(str(path), data=data, chunks=chunks, zarr_format=zarr_format)  # type: ignore[arg-type]
    return str(path)


def random_matrix(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> Any:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dt)
    if dt.kind == "c":
        return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dt)
    return rng.integers(-5, 5, shape).astype(dt)


def assert_product(out: Any, a: Any, b: Any) -> None:
    """out == a @ b against float64 (or complex128) numpy, tolerance by dtype and |A|·|B|."""
    got = np.asarray(out)
    wide = "complex128" if np.iscomplexobj(a) or np.iscomplexobj(b) else "float64"
    want = a.astype(wide) @ b.astype(wide)
    assert got.shape == want.shape
    assert got.dtype == np.result_type(a.dtype, b.dtype)
    assert not np.isnan(got).any(), "unwritten (NaN) elements in the output"
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        return
    scale = np.abs(a).astype("float64") @ np.abs(b).astype("float64") + 1e-30
    rel = np.abs(got.astype(wide) - want) / scale
    assert rel.max(initial=0.0) <= TOLERANCE[str(got.dtype)], rel.max()

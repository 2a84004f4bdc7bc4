"""``python -m pipeline random``: reproducible random matrices, chunk by chunk."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import zarr

from pipeline.errors import InputError, OutputExistsError, UsageError
from pipeline.store.fs import check_writable, fsspec_options, resolve_url
from pipeline.store.output import ATTRS_KEY, Output


def write_random(
    url: str,
    shape: tuple[int, int],
    chunks: tuple[int, int],
    dtype: str,
    seed: int,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Any:
    """Uniform values in [-1, 1) (small integers for integer dtypes); each chunk has its own
    seed, so the array is the same whatever the order or parallelism of the writes."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = np.dtype("V1")
    if dt.kind not in "biufc":
        raise InputError(f"--dtype {dtype} is not a numeric dtype; use e.g. float32 or float64")
    if min(chunks) < 1:
        raise UsageError(f"--chunks {chunks[0]}x{chunks[1]} must be at least 1x1")
    url = resolve_url(url, "OUT")
    output = Output(url, dict(storage_options or {}))
    check_writable(url)
    state = output.state()  # refuses a foreign OUT, whatever the flags
    if state is not None and not overwrite:
        raise OutputExistsError(f"{url} already exists; pass --overwrite to replace it")
    with output.claim(state, overwrite=overwrite, resume=False):
        if state is not None:
            output.remove_ours()
        array = zarr.create_array(
            url,
            shape=shape,
            chunks=chunks,
            dtype=dt,
            zarr_format=3,
            attributes={ATTRS_KEY: {"generated": {"seed": seed}}},
            storage_options=fsspec_options(url, storage_options),
        )
        _fill(array, shape, chunks, dt, seed)
    return array


def _fill(array: Any, shape: tuple[int, int], chunks: tuple[int, int], dt: Any, seed: int) -> None:
    starts = [(i, j) for i in range(0, shape[0], chunks[0]) for j in range(0, shape[1], chunks[1])]

    def fill(start: tuple[int, int]) -> None:
        i, j = start
        rows, cols = min(chunks[0], shape[0] - i), min(chunks[1], shape[1] - j)
        rng = np.random.default_rng([seed, i // chunks[0], j // chunks[1]])
        array[i : i + rows, j : j + cols] = _sample(rng, (rows, cols), dt)

    with ThreadPoolExecutor() as pool:
        list(pool.map(fill, starts))


def _sample(rng: np.random.Generator, shape: tuple[int, int], dt: np.dtype[Any]) -> Any:
    if dt.kind == "f":
        return rng.uniform(-1.0, 1.0, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.uniform(-1, 1, size=shape) + 1j * rng.uniform(-1, 1, size=shape)).astype(dt)
    if dt.kind == "b":
        return rng.random(size=shape) < 0.5
    low = 0 if dt.kind == "u" else -10
    return rng.integers(low, 10, size=shape).astype(dt)

"""``python -m pipeline random``: reproducible random matrices, chunk by chunk."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import zarr

from pipeline.errors import InputError, OutputExistsError, UsageError
from pipeline.store import groups
from pipeline.store.fs import check_protocol, check_writable, refuse_linked, resolve_url
from pipeline.store.output import MAX_CHUNKS as MAX_CHUNKS  # the limit random states
from pipeline.store.output import Output
from pipeline.store.output import check_chunk_count as check_grid
from pipeline.store.record import OutRecord

BATCH = 1024
"""Chunks handed to the writer threads at once (a bounded queue, whatever the count)."""


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
    check_seed(seed)
    check_chunk_count(shape, chunks)
    check_protocol(url, "OUT")
    if overwrite:
        refuse_linked(url, "OUT", "--overwrite")
    url = resolve_url(url, "OUT")
    output = Output(url, dict(storage_options or {}))
    check_writable(url)
    state = output.state()  # refuses a foreign OUT, whatever the flags
    if state is not None and not overwrite:
        raise OutputExistsError(f"{url} already exists; pass --overwrite to replace it")
    # Dimension names in a group only: xarray opens a group's arrays by them.
    names = groups.group_dimensions(url, output.storage_options)
    with output.claim(state, overwrite=overwrite, resume=False):
        if state is not None:
            output.remove_ours()
        store, options = output.store()  # a local OUT: written through its door
        array = zarr.create_array(
            store,
            shape=shape,
            chunks=chunks,
            dtype=dt,
            zarr_format=3,
            attributes=OutRecord(seed=int(seed)).attributes(),
            dimension_names=names,
            **options,
        )
        _fill(array, shape, chunks, dt, seed)
        output.refresh_consolidated()  # so xarray's open_zarr(group) lists OUT
    return array


def check_seed(seed: object) -> None:
    """Refuse a seed numpy would refuse (a negative one) before OUT is created."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or int(seed) < 0:
        raise UsageError(f"--seed {seed} is not a seed: seeds are integers >= 0, e.g. --seed 0")


def check_chunk_count(shape: tuple[int, int], chunks: tuple[int, int]) -> None:
    """Refuse more than MAX_CHUNKS chunks with the numbers, before OUT is created."""
    named = f"--shape {shape[0]}x{shape[1]}"
    check_grid(shape, chunks, named, " or a smaller --shape")


def _fill(array: Any, shape: tuple[int, int], chunks: tuple[int, int], dt: Any, seed: int) -> None:
    def fill(start: tuple[int, int]) -> None:
        i, j = start
        rows, cols = min(chunks[0], shape[0] - i), min(chunks[1], shape[1] - j)
        rng = np.random.default_rng([seed, i // chunks[0], j // chunks[1]])
        array[i : i + rows, j : j + cols] = _sample(rng, (rows, cols), dt)

    with ThreadPoolExecutor() as pool:
        for batch in _batches(shape, chunks):
            list(pool.map(fill, batch))


def _batches(shape: tuple[int, int], chunks: tuple[int, int]) -> Iterator[list[tuple[int, int]]]:
    """Each chunk's start, BATCH at a time (never the whole list of a big array at once)."""
    starts = itertools.product(range(0, shape[0], chunks[0]), range(0, shape[1], chunks[1]))
    while batch := list(itertools.islice(starts, BATCH)):
        yield batch


def _sample(rng: np.random.Generator, shape: tuple[int, int], dt: np.dtype[Any]) -> Any:
    if dt.kind == "f":
        return rng.uniform(-1.0, 1.0, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.uniform(-1, 1, size=shape) + 1j * rng.uniform(-1, 1, size=shape)).astype(dt)
    if dt.kind == "b":
        return rng.random(size=shape) < 0.5
    low = 0 if dt.kind == "u" else -10
    return rng.integers(low, 10, size=shape).astype(dt)

"""OUT read back for the API's caller (``MultiplyResult.open``, ``to_dask``, ``to_xarray``):
read-only, with the URL and fsspec options the job wrote it with."""

from __future__ import annotations

import os
from typing import Any

import zarr
import zarr.errors

from pipeline.errors import InputNotFoundError, MissingPackageError, UsageError
from pipeline.plan.layout import DEFAULT_DIMENSIONS
from pipeline.store.fs import fsspec_options, local_path
from pipeline.store.groups import enclosing_groups, quiet
from pipeline.store.inputs import dimension_names


def open_product(url: str, storage_options: dict[str, Any]) -> Any:
    """OUT as a read-only zarr.Array."""
    if not url:
        raise UsageError("this result names no OUT (it was not made by a job's execute())")
    try:
        return zarr.open_array(url, mode="r", storage_options=fsspec_options(url, storage_options))
    except (FileNotFoundError, zarr.errors.NodeTypeValidationError) as e:
        raise InputNotFoundError(
            f"OUT ({url}) holds no Zarr array any more (moved or removed since the job wrote it)"
        ) from e


def product_dask(url: str, storage_options: dict[str, Any]) -> Any:
    """OUT as a dask array of its chunks."""
    import dask.array as da

    return da.from_zarr(open_product(url, storage_options))


def product_xarray(url: str, storage_options: dict[str, Any]) -> Any:
    """OUT as a lazy xarray.DataArray: the variable of the Zarr group OUT is in, as
    ``xarray.open_zarr`` reads it (the group's coordinates along OUT's dimensions come along),
    else OUT alone with its dimension names and attributes."""
    try:
        import xarray as xr
    except ImportError as e:
        raise MissingPackageError(
            "to_xarray() needs xarray, which is not installed: pip install xarray (or read "
            "OUT with open() or to_dask())"
        ) from e
    array = open_product(url, storage_options)
    name = _basename(url)
    groups = enclosing_groups(url, storage_options)
    if groups:
        group = groups[0]
        with quiet():
            dataset = xr.open_zarr(
                group.url,
                consolidated=group.consolidated,
                storage_options=fsspec_options(group.url, storage_options),
            )
        if name in dataset.data_vars:
            return dataset[name]
    dims = dimension_names(array)
    import dask.array as da

    return xr.DataArray(
        da.from_zarr(array),
        dims=DEFAULT_DIMENSIONS if None in dims else dims,
        name=name,
        attrs=dict(array.attrs),
    )


def _basename(url: str) -> str:
    local = local_path(url)
    path = local if local is not None else url.split("://", 1)[-1]
    return os.path.basename(path.rstrip("/"))

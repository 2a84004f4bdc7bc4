"""The Zarr groups OUT sits in: their format (a v2 group only sees v2 arrays) and their
consolidated metadata, refreshed once OUT is complete so xarray's ``open_zarr`` lists it."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import zarr

from pipeline.errors import PipelineError
from pipeline.plan.layout import DEFAULT_DIMENSIONS
from pipeline.store.chunks.input_store import InputStore
from pipeline.store.direct import OutStore
from pipeline.store.door import Door, Made
from pipeline.store.fields import stored_names
from pipeline.store.fs import fsspec_options, local_path

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class GroupInfo:
    url: str
    zarr_format: int
    consolidated: bool
    """The group has consolidated metadata (which readers like xarray trust over listings)."""


def enclosing_groups(url: str, storage_options: dict[str, Any]) -> list[GroupInfo]:
    """The Zarr groups holding ``url``, innermost first (up to the first non-group folder)."""
    groups = []
    for parent in _parents(url):
        try:
            with quiet():
                group = _open_group(parent, storage_options)
        except Exception:  # noqa: BLE001 - not a group (or unreadable): the hierarchy ends
            break
        meta = group.metadata
        groups.append(GroupInfo(parent, meta.zarr_format, meta.consolidated_metadata is not None))
    return groups


def _open_group(url: str, storage_options: dict[str, Any], consolidated: bool | None = None) -> Any:
    """A folder above OUT read as a group: a local one bounded and never waiting on a FIFO
    (anyone may have written the folders around OUT); ``consolidated`` False: its members as
    stored, not as its consolidated metadata (which may be stale) lists them."""
    if local_path(url) is not None:
        return zarr.open_group(store=InputStore(url), mode="r", use_consolidated=consolidated)
    return zarr.open_group(
        url,
        mode="r",
        storage_options=fsspec_options(url, storage_options),
        use_consolidated=consolidated,
    )


def in_group(url: str, storage_options: dict[str, Any]) -> bool:
    """OUT goes into a Zarr group: one there already, or a local folder a job will make (and
    write as a group: ``new_group``)."""
    local = local_path(url)
    if local is not None and not os.path.lexists(os.path.dirname(os.path.abspath(local))):
        return True
    return bool(enclosing_groups(url, storage_options))


def group_dimensions(url: str, storage_options: dict[str, Any]) -> tuple[str, str] | None:
    """Dimension names for an array without its own, inside a group: named after the array
    (``C_i``, ``C_j``), since xarray opens a group only where each name has one length and
    arrays of other shapes may share it; None outside a group."""
    if not in_group(url, storage_options):
        return None
    name = url.rstrip("/").rsplit("/", 1)[-1]
    return (f"{name}_{DEFAULT_DIMENSIONS[0]}", f"{name}_{DEFAULT_DIMENSIONS[1]}")


MAX_SIBLINGS = 10_000
"""The most arrays of OUT's group whose dimensions are read (a bigger group: the rest unread)."""


def dimension_lengths(url: str, storage_options: dict[str, Any]) -> dict[str, int]:
    """The length of each dimension the other arrays of OUT's group name (xarray opens a group
    only where each name has one length); empty outside a group, or where it cannot be read."""
    found: dict[str, int] = {}
    folder, name = parent(url), url.rstrip("/").rsplit("/", 1)[-1]
    if folder is None or not enclosing_groups(url, storage_options):
        return found
    try:
        with quiet():
            group = _open_group(folder, storage_options, consolidated=False)
            members = itertools.islice(group.arrays(), MAX_SIBLINGS)
            for key, array in members:
                if key == name:
                    continue
                for dim, length in zip(stored_names(array), array.shape, strict=True):
                    if dim is not None:
                        found.setdefault(dim, int(length))
    except Exception as e:  # noqa: BLE001 - an unreadable sibling: nothing to avoid there
        log.debug("the dimensions of %s's group were not read: %s", url, e)
    return found


def coordinates_along(
    url: str, storage_options: dict[str, Any], lengths: dict[str, int]
) -> list[tuple[str, str]]:
    """The 1-D arrays beside ``url`` in its group that lie along one of ``lengths``'
    dimensions, at its length (xarray's coordinates of X): (name, dimension) pairs."""
    folder, name = parent(url), url.rstrip("/").rsplit("/", 1)[-1]
    if folder is None or not enclosing_groups(url, storage_options):
        return []
    found = []
    try:
        with quiet():
            group = _open_group(folder, storage_options, consolidated=False)
            for key, array in itertools.islice(group.arrays(), MAX_SIBLINGS):
                dims = stored_names(array)
                if key == name or len(dims) != 1 or dims[0] not in lengths:
                    continue
                if int(array.shape[0]) == lengths[dims[0]] and array.dtype.kind in "biufmM":
                    found.append((key, str(dims[0])))
    except Exception as e:  # noqa: BLE001 - an unreadable group: no coordinates to copy
        log.debug("the coordinates beside %s were not read: %s", url, e)
    return found


def output_format(url: str, storage_options: dict[str, Any]) -> int:
    """2 when OUT goes into a Zarr v2 group (a v3 array there is invisible to it), else 3."""
    groups = enclosing_groups(url, storage_options)
    return 2 if groups and groups[0].zarr_format == 2 else 3


def refresh_consolidated(url: str, storage_options: dict[str, Any]) -> list[str]:
    """Re-consolidate every enclosing group that has consolidated metadata (innermost first,
    so an outer one includes the inner one's); returns their URLs."""
    done = []
    for info in enclosing_groups(url, storage_options):
        if not info.consolidated:
            continue
        with quiet():
            if local_path(info.url) is not None:  # its metadata written through its door
                group = zarr.open_group(OutStore(info.url, what="OUT's group"), mode="r+")
            else:
                options = fsspec_options(info.url, storage_options)
                group = zarr.open_group(info.url, mode="r+", storage_options=options)
            zarr.consolidate_metadata(group.store, path=group.path)
        done.append(info.url)
    return done


NEW_GROUP = (
    b'{"zarr_format": 3, "node_type": "group", "attributes": {}, "consolidated_metadata": '
    b'{"kind": "inline", "must_understand": false, "metadata": {}}}'
)
"""A group with consolidated metadata (refreshed once OUT is complete), which is what xarray's
``open_zarr`` reads first."""


class NewGroup:
    """The group document a claim wrote into OUT's parent folder, which it made."""

    def __init__(self, folder: str) -> None:
        self.door = Door(folder, "OUT's group")
        self.fd = self.door.create("zarr.json", NEW_GROUP)

    def close(self) -> None:
        """Remove the document again while the group holds nothing else (OUT's folder gone:
        the job left it empty) and it is still the one written here."""
        try:
            # two entries at most: a job that wrote OUT leaves a tree of chunks beside
            if [e.path for e in itertools.islice(self.door.walk(), 2)] == ["zarr.json"]:
                self.door.remove_if_same("zarr.json", self.fd)
        except (OSError, PipelineError) as e:  # the folder replaced meanwhile: left as found
            log.warning("OUT's new group %s was left as it is: %s", self.door.root, e)
        finally:
            os.close(self.fd)


def new_group(url: str, made: list[Made]) -> NewGroup | None:
    """Where a claim made OUT's parent folder (``res.zarr`` of ``res.zarr/C``), the folder
    becomes a Zarr group: xarray opens groups, not arrays, so ``xr.open_zarr("res.zarr")``
    then holds OUT. None where the parent was there already (or is not local)."""
    local = local_path(url)
    if local is None or os.path.dirname(os.path.abspath(local)) not in {m.path for m in made}:
        return None
    try:
        return NewGroup(os.path.dirname(os.path.abspath(local)))
    except FileExistsError:
        return None  # someone else's document, written meanwhile


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """zarr warns that consolidated metadata is not in the v3 spec yet; xarray writes it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        yield


def parent(url: str) -> str | None:
    """The folder or URL holding ``url`` (``s3://b/ds.zarr/X`` -> ``s3://b/ds.zarr``); None
    at a root."""
    return next(_parents(url), None)


def _parents(url: str) -> Iterator[str]:
    """``s3://b/ds.zarr/sub/C`` -> ``s3://b/ds.zarr/sub``, ``s3://b/ds.zarr``, ``s3://b``."""
    local = local_path(url)
    if local is not None:
        path = os.path.abspath(local)
        while os.path.dirname(path) != path:
            path = os.path.dirname(path)
            yield path
        return
    protocol, rest = url.split("://", 1)
    parts = rest.rstrip("/").split("/")
    for end in range(len(parts) - 1, 0, -1):
        yield f"{protocol}://{'/'.join(parts[:end])}"

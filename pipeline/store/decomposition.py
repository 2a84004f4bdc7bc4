"""A decomposition's OUT: a Zarr group of named arrays (components, scores, the spectra, the
mean) and, while it runs, the passes' tall-skinny arrays under ``passes/``. The group's
attributes hold its record: what was asked, the steps finished (with the small results later
steps need) and whether it is complete. Only a group this tool wrote is ever replaced or
resumed, and then only the names its record lists are removed."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import zarr

from pipeline.errors import OutputExistsError, UnsafeOutputError
from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr
from pipeline.store import door, lock
from pipeline.store.direct import OutStore
from pipeline.store.fs import fsspec_options, local_path, url_to_fs
from pipeline.store.groups import quiet
from pipeline.store.handles import open_output
from pipeline.store.output import Output

RECORD_KEY = "tilegemm_decomposition"
PASSES = "passes"
"""The sub-group of the passes' arrays, removed once the decomposition is complete."""
OWN_NAMES = {"zarr.json", lock.LOCK_NAME, PASSES}


@dataclass(frozen=True)
class Decomposition:
    """OUT of ``pca`` or ``svd`` at ``url``."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict, metadata=SENSITIVE_FIELD)

    __repr__ = redacted_repr

    def at(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{name}"

    def passes(self, name: str) -> str:
        return self.at(f"{PASSES}/{name}")

    def _names(self) -> list[str] | None:
        """The entries of OUT's folder (None: there is no folder)."""
        path = local_path(self.url)
        if path is not None:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return None
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafeOutputError(
                    f"OUT ({self.url}) is a {'link' if stat.S_ISLNK(st.st_mode) else 'file'}, "
                    "not a folder; it will not be replaced: choose another OUT path"
                )
            return sorted(os.listdir(path))
        fs, root = url_to_fs(self.url, self.storage_options)
        if not fs.exists(root):
            return None
        return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))

    def state(self) -> dict[str, Any] | None:
        """OUT's record; None when OUT does not exist or is an empty folder (or holds only a
        lock); refused when it is anything else this tool did not write as a decomposition."""
        names = self._names()
        if names is None or set(names) <= {lock.LOCK_NAME}:
            return None
        found = self._record() if "zarr.json" in names else None
        if found is None:
            raise UnsafeOutputError(
                f"OUT ({self.url}) exists and is not a decomposition written by this tool (it "
                f"holds {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}); it will not "
                "be replaced: choose another OUT path or remove it yourself"
            )
        return found

    def _record(self) -> dict[str, Any] | None:
        try:
            with quiet():
                group = zarr.open_group(**self._store(), mode="r")
            found = group.attrs.get(RECORD_KEY)
        except Exception:  # noqa: BLE001 - anything zarr can't open is not ours
            return None
        return dict(found) if isinstance(found, dict) else None

    def foreign(self, record: dict[str, Any]) -> list[str]:
        """Entries of OUT that its record does not name."""
        names = self._names() or []
        return [n for n in names if n not in OWN_NAMES | set(record.get("arrays", []))]

    def _store(self, name: str = "") -> dict[str, Any]:
        url = self.at(name) if name else self.url
        if local_path(url) is not None:
            return {"store": OutStore(url, what="OUT")}
        return {"store": url, "storage_options": fsspec_options(url, self.storage_options)}

    @contextlib.contextmanager
    def claim(
        self, seen: dict[str, Any] | None, *, overwrite: bool, resume: bool
    ) -> Iterator[dict[str, Any] | None]:
        """OUT's folder (created if new) and its lock for the whole run; under the lock, OUT
        is still what was planned with and holds nothing foreign. Yields OUT's record."""
        # created exclusively; another user's empty folder in a shared one refused
        made = Output(self.url, self.storage_options)._make_folder()
        try:
            with lock.hold_lock(self.url, self.storage_options) as held:
                held.pin_folder()
                now = self.state()
                if now != seen:
                    raise UnsafeOutputError(
                        f"OUT ({self.url}) changed after this decomposition was planned "
                        "(written by another job?); rerun the command"
                    )
                if now is not None:
                    if not (overwrite or resume):
                        raise OutputExistsError(
                            f"OUT ({self.url}) already exists; pass --overwrite to replace it or "
                            "--resume to finish an interrupted run"
                        )
                    if extra := self.foreign(now):
                        flag = "--resume" if resume else "--overwrite"
                        raise UnsafeOutputError(
                            f"OUT ({self.url}) holds {len(extra)} entr(y/ies) this tool did not "
                            f"write ({', '.join(extra[:5])}); {flag} writes only into its own "
                            "arrays: move them out or choose another OUT"
                        )
                yield now
        finally:
            door.remove_empty_folders(made[-1:])
            door.remove_empty_folders(made[:-1])

    def save(self, record: dict[str, Any], *, new: bool = False) -> None:
        """Write the record into OUT's group attributes (``new``: create the group)."""
        with quiet():
            if new:
                group = zarr.create_group(
                    **self._store(), attributes={RECORD_KEY: record}, overwrite=False
                )
            else:
                group = zarr.open_group(**self._store(), mode="r+")
                group.attrs[RECORD_KEY] = record
        del group

    def remove(self, name: str) -> None:
        """Remove one of OUT's arrays (or ``passes``): a folder of our own files."""
        url = self.at(name)
        path = local_path(url)
        if path is None:
            fs, root = url_to_fs(url, self.storage_options)
            if fs.exists(root):
                fs.rm(root, recursive=True)
            return
        folder = door.Door(local_path(self.url) or "")
        st = folder.lstat(name)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeOutputError(
                f"{path} is not a folder this tool wrote (a link or a file); it is left as it "
                "is: remove it yourself, then rerun"
            )
        folder.remove_tree(name)  # links inside are removed as links, never followed

    def remove_ours(self, record: dict[str, Any]) -> None:
        """--overwrite: every array the record names, the passes and the group document."""
        for name in [*record.get("arrays", []), PASSES]:
            self.remove(name)
        path = local_path(self.url)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                door.Door(path).remove("zarr.json")
        else:
            fs, root = url_to_fs(self.at("zarr.json"), self.storage_options)
            with contextlib.suppress(FileNotFoundError):
                fs.rm(root)

    def create(
        self,
        name: str,
        shape: tuple[int, ...],
        chunks: tuple[int, ...],
        dtype: str,
        dimension_names: tuple[str, ...],
        attributes: dict[str, Any] | None = None,
        fill_value: Any = float("nan"),
    ) -> Any:
        """A new array in OUT (one by the same name removed first), NaN-filled (a float's)
        so an element nobody wrote shows."""
        self.remove(name)
        if (path := local_path(self.at(name))) is not None:
            door.release(door.create_folder(path))
        with quiet():
            return zarr.create_array(
                **self._store(name),
                shape=shape,
                chunks=tuple(max(1, c) for c in chunks),
                dtype=dtype,
                fill_value=fill_value,
                compressors=None,
                dimension_names=dimension_names,
                attributes=attributes or {},
                overwrite=False,
            )

    def pin_on_workers(self, client: Any, name: str = "") -> None:
        """Every worker's doors reach OUT (or its array ``name``) only in the folder there now:
        pins left below it by earlier jobs on a long-lived worker let go, OUT pinned."""
        path = local_path(self.at(name) if name else self.url)
        if path is None:
            return
        st = os.stat(path, follow_symlinks=False)
        client.run(_repin, path, (st.st_dev, st.st_ino) if not name else None)

    def unpin_on_workers(self, client: Any) -> None:
        """Let OUT go on every worker once the run ends (a later job may make it again)."""
        if (path := local_path(self.url)) is not None:
            client.run(_repin, path, None)

    def product_output(self, name: str) -> Output:
        """A pass's product array, which ``multiply`` writes with its own record."""
        return Output(self.passes(name), self.storage_options)

    def consolidate(self) -> None:
        """Consolidated metadata, which xarray's ``open_zarr`` reads first."""
        with quiet():
            group = zarr.open_group(**self._store(), mode="r+")
            zarr.consolidate_metadata(group.store)


def _repin(path: str, identity: tuple[int, int] | None) -> None:
    """Worker side of ``pin_on_workers`` (None: let go only)."""
    door.unpin_below(path)
    if identity is not None:
        door.pin(path, identity)


def open_array(url: str, storage_options: dict[str, Any], mode: str = "r") -> Any:
    """Worker side: one of OUT's arrays, through OUT's door when local."""
    return open_output(url, storage_options, mode)


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True)

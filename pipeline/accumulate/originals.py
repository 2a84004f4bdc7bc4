"""C's stored objects of a tile moved aside, and moved home again: the file steps of the
accumulation's protocol (pipeline/accumulate/state.py), each one rename or one removal, each
safe to repeat after a crash at any point.

A local C goes through its door (no link followed, one component at a time); an object store
through fsspec, where a move is a copy and a delete.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pipeline.accumulate import crash
from pipeline.errors import UnsafeOutputError
from pipeline.store.door import Door
from pipeline.store.fs import local_path, read_small, url_to_fs, write_bytes
from pipeline.store.handles import open_output
from pipeline.store.output import Output
from pipeline.store.owned import SIDECAR, record

ORIGINAL = "original"
SAVED = "saved"
STATE = "state.json"
FLAG = "rolling-back"
"""An empty file: a rollback has begun (a later run finishes it before anything else)."""
METADATA = ("zarr.json", ".zarray")  # an array's metadata document, Zarr v3 or v2


def marker_name(index: tuple[int, int]) -> str:
    return f"{SAVED}/tile-{index[0]}-{index[1]}.json"


class Files:
    """C's folder, by names relative to it: a local folder's door, or an object store."""

    def __init__(self, out: Output) -> None:
        local = local_path(out.url)
        self.door = None if local is None else Door(local, "C")
        if self.door is None:
            self.fs, path = url_to_fs(out.url, out.storage_options)
            self.root = path.rstrip("/")

    def exists(self, name: str) -> bool:
        if self.door is not None:
            return self.door.exists(name)
        return bool(self.fs.exists(f"{self.root}/{name}"))

    def move(self, source: str, target: str, *, replace: bool = False) -> bool:
        """``source`` renamed to ``target`` (False: nothing at ``source``). Where both names
        are one file (a move killed between its link and its unlink), only ``source`` goes."""
        if self.door is not None:
            if not self.door.exists(source):
                return False
            if self.door.exists(target) and self.door.same_file(source, target):
                return self.door.remove(source)
            return self.door.rename(source, target, replace=replace)
        src, dst = f"{self.root}/{source}", f"{self.root}/{target}"
        if not self.fs.exists(src):
            return False
        if not replace and self.fs.exists(dst):  # a copy finished and its delete did not
            self.fs.rm_file(src)
            return True
        self.fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)  # a no-op on object stores
        self.fs.mv(src, dst)
        return True

    def remove(self, name: str) -> None:
        if self.door is not None:
            self.door.remove(name)
        elif self.fs.exists(f"{self.root}/{name}"):
            self.fs.rm_file(f"{self.root}/{name}")

    def files(self, folder: str) -> list[str]:
        """The files under ``folder`` (relative to C), sorted; none when it is not there."""
        if self.door is not None:
            try:
                found = [e.path for e in self.door.walk(folder) if e.kind != "dir"]
            except (FileNotFoundError, NotADirectoryError):
                return []
            return sorted(found)
        prefix = f"{self.root}/{folder}"
        if not self.fs.exists(prefix):
            return []
        return sorted(p[len(self.root) + 1 :] for p in self.fs.find(prefix))

    def sync(self, names: list[str]) -> None:
        """The folders holding ``names`` synced: renames into and out of them survive a power
        cut (an object store's puts are durable when they return)."""
        if self.door is None:
            return
        for folder in sorted({name.rpartition("/")[0] for name in names}):
            if not folder or self.door.exists(folder):
                self.door.sync_folder(folder)

    def remove_folder(self, folder: str) -> None:
        """The folder's empty folders (a local C; an object store has none)."""
        if self.door is not None and self.door.exists(folder):
            self.door.remove_empty_below(folder)
            self.door.rmdir(folder)


def object_keys(array: Any, rows: tuple[int, int], cols: tuple[int, int]) -> list[str]:
    """The keys of C's stored objects (chunks, or shards) that make up a tile of whole ones."""
    outer = array.shards or array.chunks
    spans = []
    for (start, stop), size, extent in zip((rows, cols), outer, array.shape, strict=True):
        if start % size or (stop % size and stop != extent):
            raise AssertionError(f"tile {start}..{stop} is not made of whole {size}-objects")
        spans.append(range(start // size, -(-stop // size)))
    return [array.metadata.encode_chunk_key((i, j)) for i in spans[0] for j in spans[1]]


def save_tile(out: Output, index: tuple[int, int], keys: list[str]) -> None:
    """Move the tile's objects into ``original/``, then write its marker, which names the
    objects C did not hold (its fill value there): a rollback removes those from C. Safe to
    repeat: an object moved by an earlier run is in ``original/`` already, and nothing writes
    C's objects of a tile before its marker exists."""
    files, absent = Files(out), []
    for key in keys:
        target = f"{SIDECAR}/{ORIGINAL}/{key}"
        if files.exists(target):  # moved by a run killed before its marker
            if files.exists(key) and not _half_moved(files, key, target):
                raise UnsafeOutputError(
                    f"C ({out.url}): {key} and its saved original differ; the accumulation "
                    "cannot tell which is C's: restore C from a copy"
                )
            files.move(key, target)  # both names one file: only C's goes
        elif not files.move(key, target):
            absent.append(key)
        crash.point("move.object")
    files.sync([*keys, *(f"{SIDECAR}/{ORIGINAL}/{key}" for key in keys)])
    marker = json.dumps({"index": list(index), "absent": absent}).encode()
    if files.door is not None:  # synced: the marker says C's objects of the tile are gone
        files.door.write(f"{SIDECAR}/{marker_name(index)}", marker, durable=True)
    else:
        write_bytes(sidecar_url(out), marker_name(index), marker, out.storage_options)
    crash.point("move.marker")


def is_saved(out: Output, index: tuple[int, int]) -> bool:
    return read_small(sidecar_url(out), marker_name(index), out.storage_options) is not None


def restore(out: Output) -> int:
    """Move every saved original home over C's object, and remove the objects C did not
    hold before (those written by the accumulation where C had its fill value); returns the
    objects put back. Safe to repeat after a crash at any point: a marker goes only once its
    tile's objects are removed, an original only by its move home."""
    files, restored, homes, folders = Files(out), 0, [], set()
    chunk_key = _chunk_keys(out)
    for marker in files.files(f"{SIDECAR}/{SAVED}"):
        data = read_small(out.url, marker, out.storage_options) or b"{}"
        for key in _absent_keys(data, out.url, marker, chunk_key):
            files.remove(key)
            folders.add(key.rpartition("/")[0])
        files.remove(marker)
        crash.point("rollback.tile")
    prefix = f"{SIDECAR}/{ORIGINAL}/"
    for name in files.files(f"{SIDECAR}/{ORIGINAL}"):
        key = name[len(prefix) :]
        if key in METADATA:
            continue  # C's own metadata, copied there: C's stays where it is
        if not chunk_key(key):
            raise _not_ours(out.url, name)
        files.move(name, key, replace=True)
        restored += 1
        crash.point("rollback.object")
        homes.append(key)
    files.sync(homes)  # before the state goes: C's objects are home on disk
    for folder in sorted(folders, key=len, reverse=True):  # the chunk folders it made
        if folder and files.door is not None:
            files.door.rmdir(folder)
    return restored


def _absent_keys(data: bytes, url: str, marker: str, chunk_key: Callable[[str], bool]) -> list[str]:
    """The objects a marker says C did not hold (each one of C's chunk keys)."""
    try:
        found = json.loads(data)
    except ValueError:
        found = None
    if not isinstance(found, dict) or "index" not in found:
        raise _not_ours(url, marker)
    absent = found.get("absent")  # an older version's marker has none: not told, refused
    if not isinstance(absent, list) or not all(isinstance(k, str) and chunk_key(k) for k in absent):
        raise _not_ours(url, marker)
    return absent


def _chunk_keys(out: Output) -> Callable[[str], bool]:
    """Whether a name is one of C's stored objects (its chunk grid, in its key encoding): a
    rollback moves or removes nothing else, whatever a planted file names."""
    found = record(open_output(out.url, out.storage_options).metadata.to_dict())
    if found is None:
        raise UnsafeOutputError(f"C ({out.url}) is not a 2-D array: it cannot be rolled back")
    return found.chunk_key


def _not_ours(url: str, name: str) -> UnsafeOutputError:
    return UnsafeOutputError(
        f"C ({url}): the accumulation's {name} is not a record of ours (it names what is not "
        "one of C's chunks); C cannot be rolled back safely: restore C from a copy"
    )


def clean(out: Output) -> None:
    """Remove the accumulation's folder, ``state.json`` and the rollback's flag last: a crash
    meanwhile leaves them, which tell the next run to finish the cleaning."""
    files = Files(out)
    last = (f"{SIDECAR}/{STATE}", f"{SIDECAR}/{FLAG}")
    for name in files.files(SIDECAR):
        if name not in last:
            files.remove(name)
            crash.point("clean.file")
    for name in last:
        files.remove(name)
        crash.point("clean.state")
    files.remove_folder(SIDECAR)


def _half_moved(files: Files, key: str, target: str) -> bool:
    """Both names are one move killed midway: one file (a link not yet unlinked), or on an
    object store a copy whose delete did not run."""
    return files.door is None or files.door.same_file(key, target)


def sidecar_url(out: Output) -> str:
    return f"{out.url.rstrip('/')}/{SIDECAR}"

"""What inside OUT this tool wrote, by OUT's own record, never by a name's look alone.

OUT's metadata (its shape, its chunk or shard grid, its key encoding, the tile shape in our
record, pipeline/store/record.py) says exactly which names an array of ours holds: its metadata
document, the chunk keys of its grid in its own key encoding, the journal's entries of its tile
grid, its input listings and lock, an accumulation's folder, and the temporary
``NAME.<32 hex>.partial`` files of interrupted writes of those names. Anything else (``2024.06``,
``c/9/9`` outside the grid, ``.zattrs`` in a v3 array, ``zarr.json.bak``, a link, a FIFO, a
child array) is foreign: --overwrite and --resume refuse an OUT holding it, and a folder
holding it is not a new OUT.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipeline.errors import InputError
from pipeline.store.door import Door
from pipeline.store.fs import local_path, read_json, url_to_fs
from pipeline.store.lock import LOCK_NAME
from pipeline.store.record import ATTRS_KEY as ATTRS_KEY
from pipeline.store.record import OutRecord, of_array, of_attributes
from pipeline.store.signature import LISTING_NAME

METADATA_NAMES = ("zarr.json", ".zarray", ".zattrs")
"""An array's metadata documents, Zarr v3 and v2."""
SIDECAR = ".tilegemm-accumulate"
"""An accumulation's folder inside C."""
PARTIAL = re.compile(r"(?P<name>.+)\.[0-9a-f]{32}\.partial")
"""zarr's and our own atomic writes leave ``NAME.<uuid4 hex>.partial`` when killed mid-write."""
NUMBER = r"(0|[1-9][0-9]*)"
SIDECAR_NAMES = re.compile(
    rf"(state\.json|rolling-back|inputs\.json|journal/(tile-{NUMBER}-{NUMBER}|band-{NUMBER}-{NUMBER}-{NUMBER})"
    rf"\.json|saved/tile-{NUMBER}-{NUMBER}\.json|original/.+)"
)
"""An accumulation's files inside C's ``.tilegemm-accumulate/`` (originals keyed as in C)."""


@dataclass(frozen=True)
class Record:
    """What OUT's metadata says an array of ours holds."""

    zarr_format: int
    shape: tuple[int, int]
    outer: tuple[int, int]
    """The stored objects' shape: shards when sharded, else chunks."""
    separator: str
    prefix: str
    """``c`` + separator for v3's default key encoding; empty for v2 and v3's ``v2``."""
    out: OutRecord | None
    """Our record in its attributes (None: only C's own names are known)."""

    @property
    def ours(self) -> bool:
        return self.out is not None

    @property
    def tile_shape(self) -> tuple[int, int] | None:
        return None if self.out is None else self.out.tile_shape

    def grid(self) -> tuple[int, int]:
        return (
            -(-self.shape[0] // max(self.outer[0], 1)),
            -(-self.shape[1] // max(self.outer[1], 1)),
        )

    def chunk_key(self, name: str) -> bool:
        """``name`` is exactly the key of a stored object inside the grid."""
        if not name.startswith(self.prefix):
            return False
        parts = name[len(self.prefix) :].split(self.separator)
        if len(parts) != 2 or not all(re.fullmatch(NUMBER, p) for p in parts):
            return False
        return all(int(p) < g for p, g in zip(parts, self.grid(), strict=True))

    def metadata_names(self) -> set[str]:
        return {"zarr.json"} if self.zarr_format == 3 else {".zarray", ".zattrs"}

    def folder(self, path: str) -> bool:
        """A folder an array of ours has: chunk key prefixes, the journal, an accumulation's."""
        if path in ("journal", SIDECAR) or path.startswith(SIDECAR + "/"):
            return True
        if self.separator != "/":
            return False
        parts = path.split("/")
        head = [] if not self.prefix else ["c"]
        if parts[: len(head)] != head:
            return False
        rest = parts[len(head) :]
        return len(rest) <= 1 and all(
            re.fullmatch(NUMBER, p) and int(p) < self.grid()[0] for p in rest
        )

    def journal_name(self, name: str) -> bool:
        if self.tile_shape is None:
            return False
        rows, cols = (-(-s // max(t, 1)) for s, t in zip(self.shape, self.tile_shape, strict=True))
        tile = re.fullmatch(rf"journal/tile-{NUMBER}-{NUMBER}\.json", name)
        band = re.fullmatch(rf"journal/band-{NUMBER}-{NUMBER}-{NUMBER}\.json", name)
        found = tile or band
        if found is None:
            return False
        i, j = int(found.group(1)), int(found.group(2))
        if not (i < rows and j < cols):
            return False
        return band is None or i * self.tile_shape[0] <= int(band.group(3)) < self.shape[0]

    def owns(self, path: str) -> bool:
        """``path`` (a file, relative to OUT) is a name an array of ours holds."""
        partial = PARTIAL.fullmatch(path)
        name = partial.group("name") if partial else path
        if name in self.metadata_names() or self.chunk_key(name):
            return True
        if name.startswith(SIDECAR + "/"):
            return SIDECAR_NAMES.fullmatch(name[len(SIDECAR) + 1 :]) is not None
        if not self.ours:
            return False
        return name in (LOCK_NAME, LISTING_NAME) or self.journal_name(name)


def record(metadata: dict[str, Any], attributes: dict[str, Any] | None = None) -> Record | None:
    """OUT's record from its metadata document (zarr.json, or .zarray with .zattrs' content
    as ``attributes``); None when it is not a 2-D array's."""
    try:
        shape = tuple(int(x) for x in metadata["shape"])
        if metadata.get("zarr_format") == 3:
            return _v3_record(metadata, shape)  # type: ignore[arg-type]
        if metadata.get("zarr_format") == 2:
            return _v2_record(metadata, attributes or {}, shape)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return None


def _v3_record(meta: dict[str, Any], shape: tuple[int, int]) -> Record | None:
    if len(shape) != 2 or meta.get("node_type") != "array":
        return None
    # With sharding, the grid's chunk shape is the shard's: the stored objects' either way.
    outer = tuple(int(x) for x in meta["chunk_grid"]["configuration"]["chunk_shape"])
    encoding = meta.get("chunk_key_encoding") or {"name": "default"}
    separator = (encoding.get("configuration") or {}).get(
        "separator", "/" if encoding.get("name") == "default" else "."
    )
    prefix = "c" + separator if encoding.get("name") == "default" else ""
    return _with_attrs(3, shape, outer, str(separator), prefix, meta.get("attributes") or {})


def _v2_record(
    meta: dict[str, Any], attrs: dict[str, Any], shape: tuple[int, int]
) -> Record | None:
    if len(shape) != 2:
        return None
    chunks = tuple(int(x) for x in meta["chunks"])
    separator = str(meta.get("dimension_separator") or ".")
    return _with_attrs(2, shape, chunks, separator, "", attrs)


def _with_attrs(
    fmt: int, shape: Any, outer: Any, separator: str, prefix: str, attrs: dict[str, Any]
) -> Record:
    return Record(fmt, shape, outer, separator, prefix, of_attributes(attrs))


@dataclass(frozen=True)
class Found:
    """Everything inside OUT: files (path -> size), folders, and what is neither."""

    files: dict[str, int]
    folders: set[str]
    other: list[str]
    """Links, FIFOs, sockets, devices: never ours."""


def listing(url: str, storage_options: dict[str, Any]) -> Found:
    """OUT's content, links and special files reported (never followed)."""
    local = local_path(url)
    if local is not None:
        files, folders, other = {}, set(), []
        for entry in Door(local).walk():
            if entry.kind == "file":
                files[entry.path] = entry.size
            elif entry.kind == "dir":
                folders.add(entry.path)
            else:
                other.append(entry.path)
        return Found(files, folders, other)
    fs, root = url_to_fs(url, storage_options)
    root = root.rstrip("/")
    found = fs.find(root, detail=True)
    files = {
        str(p)[len(root) + 1 :]: int(info.get("size") or 0)
        for p, info in found.items()
        if str(p).startswith(root + "/")
    }
    return Found(files, set(), [])


def read_record(url: str, storage_options: dict[str, Any], found: Found) -> Record | None:
    """OUT's record from its metadata document, or None (no document, or not an array's)."""
    try:
        if "zarr.json" in found.files:
            return record(read_json(url, "zarr.json", storage_options) or {})
        if ".zarray" in found.files:
            attrs = read_json(url, ".zattrs", storage_options) if ".zattrs" in found.files else {}
            return record(read_json(url, ".zarray", storage_options) or {}, attrs)
    except ValueError:
        return None
    return None


def classify(found: Found, rec: Record | None) -> tuple[list[str], list[str]]:
    """(ours, foreign) files and folders of OUT under its record; with no record, only a
    lock is ours (a job killed before it created the array)."""
    ours: list[str] = []
    foreign = sorted(found.other)
    for path in sorted(found.files):
        owned = rec.owns(path) if rec is not None else _before_any_record(path)
        (ours if owned else foreign).append(path)
    for folder in sorted(found.folders):
        if rec is None or not rec.folder(folder):
            foreign.append(folder + "/")
    return ours, foreign


def _before_any_record(path: str) -> bool:
    """What a job killed before its array's metadata was in place leaves: its lock, and the
    temporary file of that metadata document (renamed into place once written)."""
    partial = PARTIAL.fullmatch(path)
    return path == LOCK_NAME or (partial is not None and partial.group("name") in METADATA_NAMES)


def entries(url: str, storage_options: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(ours, foreign): OUT's files as paths relative to OUT."""
    found = listing(url, storage_options)
    return classify(found, read_record(url, storage_options, found))


def remove_ours(url: str, storage_options: dict[str, Any], keep: tuple[str, ...] = ()) -> int:
    """Delete our files inside OUT (not ``keep``) after checking there is nothing foreign;
    returns how many were deleted."""
    ours, foreign = entries(url, storage_options)
    if foreign:
        raise ValueError(foreign)  # callers check first; this is the last line of defence
    # The metadata goes last: a run killed midway leaves an array of ours, still listable.
    doomed = sorted((n for n in ours if n not in keep), key=_metadata_last)
    local = local_path(url)
    if local is None:
        fs, root = url_to_fs(url, storage_options)
        if doomed:
            fs.rm([f"{root.rstrip('/')}/{n}" for n in doomed])
        return len(doomed)
    door = Door(local)
    for name in doomed:
        door.remove(name)
    door.remove_empty_below()
    return len(doomed)


def remove_partials(url: str | None) -> int:
    """Remove the temporary files of our names a killed writer left in a local OUT (a worker
    SIGKILLed mid-write: its task ran again elsewhere, the file stayed); returns how many.
    Called once the job holding OUT's lock has written every tile."""
    if url is None or local_path(url) is None:
        return 0
    ours, _ = entries(url, {})
    door = Door(url)
    return sum(door.remove(n) for n in ours if PARTIAL.fullmatch(n))


def _metadata_last(name: str) -> tuple[bool, str]:
    return (name in METADATA_NAMES, name)


def describe(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_finished(array: Any, name: str, url: str) -> None:
    """Refuse an input that is an unfinished product of this tool: its unwritten tiles read
    as NaN (or 0), which no product of it would show."""
    ours = of_array(array)
    if ours is not None and ours.complete is False:
        raise InputError(
            f"{name} ({url}) is an unfinished product of this tool (some tiles are not written "
            "yet); finish it first with `multiply ... --resume` (or --overwrite), then use it"
        )

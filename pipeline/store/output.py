"""OUT's one owner: its path checks, creation, lock, journal and completion marks.

Everything that touches the output array goes through ``Output``: the client creates it (or
reopens it for --resume), holds its lock, lists finished tiles and marks it complete; the
workers write whole chunks through ``writable`` and journal each tile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec

from pipeline import settings
from pipeline.errors import (
    OutputExistsError,
    OutputUnreachableError,
    UnsafeOutputError,
    UsageError,
    storage_problem,
)
from pipeline.plan.standardize import Standardize
from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr
from pipeline.store import deputy, door, groups, journal, links, lock, owned, signature
from pipeline.store.chunks.archive_store import archive_path
from pipeline.store.direct import OutStore
from pipeline.store.fs import (
    check_protocol,
    check_writable,
    fsspec_options,
    inside,
    local_path,
    location,
    read_json,
    url_to_fs,
    write_bytes,
)
from pipeline.store.handles import cached_array, open_output
from pipeline.store.inputs import worker_address
from pipeline.store.reach import check_apart
from pipeline.store.record import ATTRS_KEY, OutRecord, alpha_flag, differences, of_array

if TYPE_CHECKING:
    from pipeline.plan.matmul import MatmulPlan

FENCE_WAITS_S = (0.1, 0.3, 1.0)
"""Pauses between reads of OUT's lock when the storage fails one (a transient object-store
error): four reads over 1.4 s before the band fails."""
OVERWRITE = "or pass --overwrite to start over"
"""The way out of every refusal to --resume."""
MAX_CHUNKS = 10_000_000
"""Chunks an array of ours may have: each is a file (or object) and a write; more is a mistake."""


def check_chunk_count(
    shape: tuple[int, int], chunks: tuple[int, int], named: str, fix: str = ""
) -> None:
    """Refuse more than MAX_CHUNKS chunks with the numbers, before anything is created;
    ``named`` says the array's shape as the user gave it (``--shape 4x4``, ``OUT (4x4)``)."""
    grid = [-(-size // chunk) for size, chunk in zip(shape, chunks, strict=True)]
    count = grid[0] * grid[1]
    if count > MAX_CHUNKS:
        raise UsageError(
            f"{named} in --chunks {chunks[0]}x{chunks[1]} makes {count:,} chunks "
            f"({grid[0]:,}x{grid[1]:,}), more than the limit of {MAX_CHUNKS:,}; pass bigger "
            f"--chunks{fix}"
        )


@dataclass(frozen=True)
class Output:
    """OUT at ``url``; pickled to the workers, which open it themselves."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict, metadata=SENSITIVE_FIELD)
    """fsspec options (``endpoint_url``, ``anon``, ...); repr hides secrets."""

    __repr__ = redacted_repr

    def check_path(self, inputs: list[str], readable: bool = False) -> None:
        """Refuse OUT equal to, inside, or containing an input (overwrite could destroy it),
        and stores that can't take concurrent writers; ``readable``: and inputs whose files
        another user's path leads to (pipeline.store.reach.check_readable)."""
        check_protocol(self.url, "OUT")
        check_writable(self.url)
        out_key = location(self.url, self.storage_options)
        for name, url in zip(("A", "B", "C"), inputs, strict=False):
            key = location(archive_path(url) or url, self.storage_options)  # not opened here
            if out_key == key or inside(out_key, key) or inside(key, out_key):
                raise UnsafeOutputError(
                    f"OUT ({self.url}) overlaps input {name} ({url}); inputs are never "
                    "written: choose an OUT path outside every input"
                )
        self.check_apart(list(zip(("A", "B", "C"), inputs, strict=False)), readable)

    def check_apart(self, inputs: list[tuple[str, str]], readable: bool = False) -> None:
        """Refuse a local OUT that reaches a folder or file an input reaches, links followed."""
        check_apart("OUT", self.url, inputs, readable)

    def record(self) -> OutRecord | None:
        """None when OUT does not exist (or is a folder holding nothing but a lock); our
        record when it is one of our arrays; else refuse (something this tool did not write,
        or whose record is malformed, is never replaced)."""
        exists, found = self._listing()
        if not exists:
            return None
        layout = None if found is None else owned.read_record(self.url, self.storage_options, found)
        if found is not None and layout is None and not owned.classify(found, None)[1]:
            return None  # an empty folder, or one holding only a lock: a new OUT
        ours = None if layout is None else layout.out  # the record read once, with the layout
        if ours is not None and not self._opens():
            ours = None
        if ours is None:
            names = [] if found is None else sorted(found.files) + sorted(found.other)
            held = f" (it holds {owned.describe(names)})" if names else ""
            raise UnsafeOutputError(
                f"OUT ({self.url}) exists and is not a Zarr array written by this tool{held}; "
                "it will not be replaced: choose another OUT path or remove it yourself"
            )
        return ours

    def state(self) -> dict[str, Any] | None:
        """``record`` as its stored fields (what planning keeps and ``claim`` compares)."""
        ours = self.record()
        return None if ours is None else ours.to_dict()

    def _opens(self) -> bool:
        try:
            self._open("r")
        except Exception:  # noqa: BLE001 - anything zarr can't open is "not ours"
            return False
        return True

    def _listing(self) -> tuple[bool, owned.Found | None]:
        """Whether OUT exists, and its content (None: it is not a folder)."""
        fs, path = url_to_fs(self.url, self.storage_options)
        local = local_path(self.url)
        try:
            exists = os.path.lexists(local) if local is not None else fs.exists(path)
            return exists, owned.listing(self.url, self.storage_options) if exists else None
        except UnsafeOutputError:  # a file, a link or a special file where OUT should be
            return True, None
        except Exception as e:
            problem = storage_problem(e, self.storage_options)
            if problem is None:
                raise
            raise UsageError(f"OUT ({self.url}) cannot be reached: {problem}") from e

    def _check_flags(self, overwrite: bool, resume: bool) -> None:
        if not (overwrite or resume):
            raise OutputExistsError(
                f"OUT ({self.url}) already exists; pass --overwrite to replace it or --resume "
                "to finish an interrupted run"
            )

    @contextlib.contextmanager
    def claim(
        self,
        seen: dict[str, Any] | None,
        *,
        overwrite: bool,
        resume: bool,
        current: Callable[[], dict[str, Any]] | None = None,
    ) -> Iterator[tuple[lock.HeldLock, dict[str, Any] | None]]:
        """Take OUT for one job: its folder (created if new), then its lock, then, under the
        lock, the check that OUT is still what ``prepare`` saw. Yields (the lock, OUT's state).
        A folder this claim created is removed again if the job leaves it empty.
        ``current``: OUT's state for --accumulate (anyone's C, whose other files stay)."""
        created = self._make_folder()
        group = groups.new_group(self.url, created)
        try:
            with lock.hold_lock(self.url, self.storage_options) as held:
                held.pin_folder()  # every later step here reaches this very folder
                if current is not None:
                    snap = current()
                    if snap != seen:
                        raise UnsafeOutputError(
                            f"C ({self.url}) changed after this job was planned; rerun it"
                        )
                    yield held, snap
                    return
                now = self.state()
                if now != seen:
                    raise UnsafeOutputError(
                        f"OUT ({self.url}) changed after this job was planned "
                        f"({'created' if seen is None else 'rewritten'} by another job?); "
                        "plan the job again (rerun the command)"
                    )
                if now is not None:
                    self._check_flags(overwrite, resume)
                if now is not None:  # before any cluster starts; resume writes through links
                    self._check_nothing_foreign("--resume" if resume else "--overwrite")
                yield held, now
        finally:
            # Folders this claim made (OUT's, its missing parents): removed while empty,
            # OUT's first, then the group document it made, then the rest.
            door.remove_empty_folders(created[-1:])
            if group is not None:
                group.close()
            door.remove_empty_folders(created[:-1])

    def _make_folder(self) -> list[door.Made]:
        """Create a local OUT's folder (and missing parents) exclusively: the folders made."""
        path = local_path(self.url)
        if path is None:
            return []  # object stores have no folders: the lock's conditional write decides
        try:
            made = door.create_folder(path)
        except OSError as e:
            raise UsageError(
                f"OUT ({self.url}) cannot be created ({e.strerror or e}); choose a location "
                "you can write to"
            ) from e
        if not made:
            self._refuse_planted_folder(path)
        return made

    def _refuse_planted_folder(self, path: str) -> None:
        """Another user's empty folder in a folder others can write is not a new OUT for you:
        they made it before you (or as your job started), and keep every right to it."""
        try:
            folder, parent = os.lstat(path), os.stat(os.path.dirname(path))
            empty = not os.listdir(path)
        except OSError:
            return  # the lock's door says what is wrong
        if empty and not deputy.trusted(folder.st_uid) and parent.st_mode & links.OTHERS_WRITE:
            raise UnsafeOutputError(
                f"OUT ({self.url}) is an empty folder {deputy.owner_name(folder.st_uid)} made, "
                f"in {os.path.dirname(path)}, which others can write (mode "
                f"{stat.S_IMODE(parent.st_mode):04o}); another user's folder is not a new OUT: "
                "choose another OUT, or have them remove it"
            )

    def remove_ours(self) -> None:
        """--overwrite: delete what this tool wrote inside OUT, after refusing an OUT that
        holds anything else (the caller holds OUT's lock, which stays)."""
        self._check_nothing_foreign("--overwrite")
        owned.remove_ours(self.url, self.storage_options, keep=(lock.LOCK_NAME,))

    def _check_nothing_foreign(self, flag: str) -> None:
        _, foreign = owned.entries(self.url, self.storage_options)
        if foreign:
            raise UnsafeOutputError(
                f"OUT ({self.url}) holds {len(foreign)} file(s) this tool did not write "
                f"({owned.describe(foreign)}); "
                f"{flag} writes only into our own array: move them out or choose another OUT"
            )

    def create(
        self,
        shape: tuple[int, int],
        chunks: tuple[int, int],
        dtype: str,
        record: OutRecord | Mapping[str, Any],
        *,
        shards: tuple[int, int] | None = None,
        dimension_names: tuple[str, str] | None = None,
        zarr_format: int = 3,
    ) -> Any:
        """Create OUT, never over anything (``claim`` and ``remove_ours`` come first): Zarr v3
        (v2 inside a v2 group, with xarray's ``_ARRAY_DIMENSIONS``). Floats are filled with
        NaN so unwritten tiles show. ``record``: OUT's, or its stored fields."""
        fill = np.nan if np.dtype(dtype).kind in "fc" else 0
        if not isinstance(record, OutRecord):
            record = OutRecord.from_dict(record)
        attrs: dict[str, Any] = record.attributes()
        names: dict[str, Any] = {}
        if dimension_names is not None and zarr_format == 3:
            names["dimension_names"] = dimension_names
        elif dimension_names is not None:
            attrs["_ARRAY_DIMENSIONS"] = list(dimension_names)
        local = local_path(self.url)
        if local is not None:
            # claimed already in a job; here for direct callers
            door.release(door.create_folder(local))
        store, options = self.store()
        array = zarr.create_array(
            store,
            shape=shape,
            chunks=tuple(max(c, 1) for c in chunks),
            shards=shards,
            dtype=dtype,
            fill_value=fill,
            compressors=output_compressors(dtype, zarr_format),
            zarr_format=zarr_format,  # type: ignore[arg-type]
            attributes=attrs,
            overwrite=False,  # replacing is remove_ours' job, under OUT's lock
            **names,
            **options,
        )
        return store.bound(array) if isinstance(store, OutStore) else array

    def zarr_format(self) -> int:
        """The format to write OUT in: 2 inside a Zarr v2 group (which sees only v2 arrays)."""
        return groups.output_format(self.url, self.storage_options)

    def layout(self) -> dict[str, Any]:
        """An existing OUT's dtype, chunks, shards and format (what --resume keeps)."""
        array = self._open("r")
        shards = getattr(array, "shards", None)
        return {
            "zarr_format": int(array.metadata.zarr_format),
            "dtype": str(array.dtype),
            "chunks": tuple(int(c) for c in array.chunks),
            "shards": tuple(int(c) for c in shards) if shards else None,
        }

    def refresh_consolidated(self) -> list[str]:
        """Re-consolidate the groups around OUT that have consolidated metadata."""
        return groups.refresh_consolidated(self.url, self.storage_options)

    def finished_tiles(
        self,
        plan: MatmulPlan,
        fingerprint: str,
        state: dict[str, Any],
        alpha: float | None = None,
        standardize: Standardize | None = None,
    ) -> set[tuple[int, int]]:
        """Tiles journaled under this plan whose bytes still match their checksum; OUT started
        as another product is refused, naming what differs (``alpha``: this run's --alpha,
        None when not known; ``standardize``: this run's)."""
        if state.get("fingerprint") != fingerprint:
            raise UsageError(self._resume_refusal(plan, fingerprint, state, alpha, standardize))
        return journal.finished_tiles(self.url, self.storage_options, plan, fingerprint, state)

    def _resume_refusal(
        self,
        plan: MatmulPlan,
        fingerprint: str,
        state: dict[str, Any],
        alpha: float | None,
        standardize: Standardize | None = None,
    ) -> str:
        """Why --resume cannot go on, in flags: the options that differ from OUT's record;
        else OUT's shape against this product's; else the inputs' fingerprint."""
        started = OutRecord.from_dict(state)
        given = OutRecord(
            transpose_a=plan.transposed[0], transpose_b=plan.transposed[1],
            symmetric=plan.symmetric, precision=plan.precision,
            alpha=started.alpha if alpha is None else None if alpha == 1 else float(alpha),
            standardize=None if standardize is None else standardize.record(),
        )  # fmt: skip
        name = f"--resume: {'G' if plan.symmetric else 'OUT'} ({self.url})"
        if found := differences(started, given):
            then, now = (" and ".join(getattr(d, k) for d in found) for k in ("started", "given"))
            return (
                f"{name} was started {then}{',' if len(found) > 1 else ''} and this run has "
                f"{now}; rerun {' and '.join(d.fix for d in found)}, {OVERWRITE}"
            )
        (m, n), shape = plan.out.shape, tuple(int(s) for s in self._open("r").shape)
        held = (
            f"is a {shape[0]}x{shape[1]} product and this run's is {m}x{n}: A or B is not "
            "the array it was started with"
            if shape != (m, n)
            else "was started with other inputs: A or B is not the array it was started "
            "with, or its metadata (shape, chunks, dtype, codecs or attributes) changed since "
            f"(fingerprint {state.get('fingerprint')}, this run's {fingerprint})"
        )
        if alpha is None:  # this run's --alpha is not known: it may be the difference
            held += f"; or this run's --alpha is another (OUT was started {alpha_flag(started)})"
        return f"{name} {held}; rerun with the inputs it was started with, {OVERWRITE}"

    def input_listings(self) -> dict[str, Any] | None:
        """The inputs' listings saved at the last run's start (None: none, or unreadable)."""
        try:
            found = read_json(self.url, signature.LISTING_NAME, self.storage_options)
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def save_input_listings(self, listings: dict[str, signature.Listing]) -> None:
        write_bytes(
            self.url, signature.LISTING_NAME, signature.encode(listings), self.storage_options
        )

    def forget_tiles(self, tiles: set[tuple[int, int]]) -> None:
        """Drop journal entries: those tiles are computed again."""
        journal.forget(self.url, self.storage_options, tiles)

    def mark(
        self,
        fingerprint: str,
        *,
        complete: bool | None = None,
        verified: bool | None = None,
        standardize: Standardize | None = None,
    ) -> None:
        """Set the fingerprint, ``complete`` and ``verified`` (those given) in OUT's record;
        ``standardize``: the measured standardization it states (and the shifts and scales in
        OUT's ``tilegemm_mean`` and ``tilegemm_scale`` attributes, where there are few
        enough)."""
        array = self._open("r+")
        current = of_array(array)
        if current is None and ATTRS_KEY in dict(array.attrs):
            raise UnsafeOutputError(
                f"OUT ({self.url}): its {ATTRS_KEY} attribute is no record this tool wrote "
                "(changed while the job ran?); OUT is left unmarked: check it, then remove it "
                "or choose another OUT"
            )
        base = current or OutRecord()
        marked = dataclasses.replace(
            base,
            fingerprint=fingerprint,
            complete=base.complete if complete is None else complete,
            verified=base.verified if verified is None else verified,
        )
        attributes = marked.attributes()
        if standardize is not None:
            marked = dataclasses.replace(marked, standardize=standardize.record())
            attributes = marked.attributes()
            attributes |= standardize.stored() or {}
        array.attrs.update(attributes)

    def check_fence(self, lock_token: str) -> None:
        """Worker side, before each write: the job that sent this task still holds OUT's lock
        (its token is the lock's). A task of a stopped job, still running on an external
        cluster, stops here once a newer job has claimed OUT. A storage error reading the
        lock is retried (FENCE_WAITS_S) before the band fails with it."""
        if not lock_token:
            return
        holder = self._lock_holder()
        if holder is None and not self._seen_here():
            raise self._unseen("it does not exist there")
        if (holder or {}).get("token") != lock_token:
            raise UnsafeOutputError(
                f"OUT ({self.url}): the job that started this task no longer holds OUT's lock "
                "(it stopped, or another job took OUT); this task stops without writing"
            )

    def hold(self, folder: tuple[int, int] | None) -> None:
        """Worker side: this process's doors reach OUT only in the folder the job locked."""
        if folder is not None and local_path(self.url) is not None:
            door.pin(self.url, folder)

    def _lock_holder(self) -> dict[str, Any] | None:
        """OUT's lock record (None: there is none), read again after a transient storage
        error or a torn record; the last attempt's error is raised."""
        for wait_s in FENCE_WAITS_S:
            try:
                return self._read_lock()
            except Exception as e:
                if not self._transient(e):
                    raise
            time.sleep(wait_s)
        return self._read_lock()  # the last try: its error fails the band

    def _read_lock(self) -> dict[str, Any] | None:
        try:
            found = read_json(self.url, lock.LOCK_NAME, self.storage_options)
        except UnsafeOutputError:  # larger than a lock record: not one
            return {}
        return found if found is None or isinstance(found, dict) else {}

    def _transient(self, error: Exception) -> bool:
        """A read error worth another try: the storage's (s3fs passes botocore's connection
        errors on as they are) or a torn record, not a missing file or a refusal."""
        if isinstance(error, FileNotFoundError | PermissionError):
            return False
        named = storage_problem(error, self.storage_options) is not None
        return named or isinstance(error, OSError | ValueError)

    def writable(self, token: str) -> Any:
        """Worker side: OUT's array handle, cached per process and job ``token``. A worker
        that cannot see OUT (another machine's files) says so: exit 2, not a failed job."""
        try:
            return cached_array(self.url, self.storage_options, token, writable=True)
        except (FileNotFoundError, NotADirectoryError) as e:
            if self._seen_here():
                raise
            raise self._unseen("it does not exist there") from e
        except PermissionError as e:
            raise self._unseen(f"permission denied on {e.filename or self.url}") from e

    def _seen_here(self) -> bool:
        """Whether this process sees OUT's folder (always true of an object store's)."""
        local = local_path(self.url)
        return local is None or os.path.isdir(local)

    def _unseen(self, reason: str) -> OutputUnreachableError:
        worker = worker_address()
        where = f"a worker ({worker})" if worker else "this process"
        return OutputUnreachableError(
            f"{where} cannot see OUT ({self.url}), which this machine created: {reason}; the "
            "workers must see the same paths as this machine (a shared file system), or write "
            "OUT to storage they reach (e.g. s3://bucket/c.zarr); then rerun with --resume"
        )

    def journal_tile(self, index: tuple[int, int], entry: dict[str, Any]) -> None:
        """Worker side: record a written tile (what --resume trusts)."""
        name = journal.entry_name(index)
        write_bytes(self.url, name, json.dumps(entry).encode(), self.storage_options)

    def journal_band(
        self, index: tuple[int, int], rows: tuple[int, int], entry: dict[str, Any]
    ) -> None:
        """Worker side: record a band of a tile in flight (OUT's ``rows``) just before it is
        written; --resume keeps it only if the stored rows give the entry's chained crc32."""
        name = journal.band_entry_name(index, rows[0])
        entry = {**entry, "index": list(index), "rows": list(rows)}
        write_bytes(self.url, name, json.dumps(entry).encode(), self.storage_options)

    def _open(self, mode: str) -> Any:
        return open_output(self.url, self.storage_options, mode)

    def store(self) -> tuple[Any, dict[str, Any]]:
        """OUT for zarr to create, and the options to pass: a local OUT is a store that writes
        only through OUT's door; an object store is its URL."""
        if local_path(self.url) is not None:
            return OutStore(self.url), {}
        return self.url, {"storage_options": fsspec_options(self.url, self.storage_options)}


def output_compressors(dtype: str, zarr_format: int = 3) -> Any:
    """The output codec: config ``tilegemm.output-compressor`` = auto | none | lz4 | zstd.

    auto: none for float and complex products — their mantissas are noise (Blosc-LZ4 and zstd
    save under a tenth of a float32 product's bytes for several times the write CPU of no
    compression), and writing is on the critical path; Blosc-LZ4 for integers, which compress.
    """
    choice = settings.get("output-compressor")  # "none" also when the environment gave None
    if choice == "auto":
        choice = "none" if np.dtype(dtype).kind in "fc" else "lz4"
    if choice == "none":
        return None
    if choice == "lz4" and zarr_format == 2:
        return [numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)]
    if choice == "lz4":
        return [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]
    if choice == "zstd":
        return "auto"  # zarr's default (zstd)
    raise UsageError(f"tilegemm.output-compressor is {choice!r}; use auto, none, lz4 or zstd")

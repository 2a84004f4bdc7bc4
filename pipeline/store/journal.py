"""The journal inside OUT, read back by --resume: an entry per written tile, and one per
written band of a tile still in flight (so a resumed tile computes only its unwritten rows)."""

from __future__ import annotations

import contextlib
import functools
import logging
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from pipeline.errors import UsageError, storage_problem
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.spec import Tile
from pipeline.store import mirror
from pipeline.store.chunks import unsharded as chunk_read
from pipeline.store.door import Door
from pipeline.store.fs import list_json, local_path, url_to_fs
from pipeline.store.handles import open_output

log = logging.getLogger("pipeline")
JOURNAL_DIR = "journal"
CHECK_THREADS = 8
"""Written tiles read back at once by --resume (reads of a remote store wait mostly)..."""
CHECK_BYTES = 512 << 20
"""...holding at most this much of them at once on the client,"""
BAND_BYTES = 64 << 20
"""...a tile's rows read back in bands of at most this many bytes (whole stored rows)."""
T = TypeVar("T")
R = TypeVar("R")


def entry_name(index: tuple[int, int]) -> str:
    """Where a tile's entry lives inside OUT."""
    return f"{JOURNAL_DIR}/tile-{index[0]}-{index[1]}.json"


def band_entry_name(index: tuple[int, int], start: int) -> str:
    """Where the entry of a tile's band starting at row ``start`` (of OUT) lives inside OUT."""
    return f"{JOURNAL_DIR}/band-{index[0]}-{index[1]}-{start}.json"


def finished_tiles(
    url: str, storage_options: dict[str, Any], plan: MatmulPlan, fp: str, state: dict[str, Any]
) -> set[tuple[int, int]]:
    """Tiles journaled under this plan whose written bytes still match their checksum."""
    if state.get("fingerprint") != fp:
        raise UsageError(
            f"cannot resume {url}: it was written for different inputs or tiling "
            f"(fingerprint {state.get('fingerprint')} != {fp}); use --overwrite to start over"
        )
    done = journaled(url, url, storage_options, plan, fp)
    log.info("resume: %d of %d tile(s) already written", len(done), plan.n_tiles)
    return done


def journaled(
    journal_url: str, data_url: str, storage_options: dict[str, Any], plan: MatmulPlan, fp: str
) -> set[tuple[int, int]]:
    """Tiles with an entry of this fingerprint in ``journal_url``'s journal whose bytes in the
    array at ``data_url`` (OUT, or an accumulation's C) still match its checksum."""
    out = open_output(data_url, storage_options)
    tiles = {t.index: t for t in plan.tiles()}
    claimed = {}
    for entry in list_json(journal_url, JOURNAL_DIR, storage_options):
        index = _index(entry)
        tile = None if index is None else tiles.get(index)
        if tile is not None and entry.get("fingerprint") == fp and "rows" not in entry:
            claimed[tile.index] = (tile, entry.get("checksum"))

    def intact(index: tuple[int, int]) -> bool:
        tile, checksum = claimed[index]
        return _checksum(out, plan, tile) == checksum

    return {i for i, ok in zip(claimed, _each(intact, list(claimed), plan), strict=True) if ok}


def written_rows(
    journal_url: str,
    data_url: str,
    storage_options: dict[str, Any],
    plan: MatmulPlan,
    fp: str,
    skip: set[tuple[int, int]],
) -> dict[tuple[int, int], tuple[int, int]]:
    """For tiles not in ``skip`` that wrote some bands: (the first row still to write, the
    crc32 chained over the tile's rows before it). Only an unbroken run of bands from the
    tile's first row counts, each checked against the bytes in the array at ``data_url``.
    Gram and split-K tiles write whole (no band entries)."""
    bands: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for band in list_json(journal_url, JOURNAL_DIR, storage_options):
        rows, index = band.get("rows"), _index(band)
        if not (isinstance(rows, list) and len(rows) == 2 and all(type(r) is int for r in rows)):
            continue
        if band.get("fingerprint") == fp and index is not None and index not in skip:
            bands.setdefault(index, {})[rows[0]] = band
    if not bands:
        return {}
    out = open_output(data_url, storage_options)

    def kept(tile: Tile) -> tuple[int, int]:
        row, chain = tile.rows[0], 0
        while (entry := bands[tile.index].get(row)) is not None:
            end = entry["rows"][1]
            if not row < end <= tile.rows[1]:
                break
            data = _stored(out, (row, end), tile.cols, plan.out.dtype)
            if data is None or zlib.crc32(data.data, chain) != entry.get("chain"):
                break
            row, chain = end, entry["chain"]
        return row, chain

    in_flight = [t for t in plan.tiles() if t.index in bands]
    return {
        tile.index: (row, chain)
        for tile, (row, chain) in zip(in_flight, _each(kept, in_flight, plan), strict=True)
        if row > tile.rows[0]
    }


def _each(check: Callable[[T], R], items: list[T], plan: MatmulPlan) -> list[R]:
    """``check`` of every item, several at once: reading back written tiles is most of a
    resume's start, and zarr's reads and crc32 let go of the GIL. At most CHECK_BYTES of
    them held at once on the client."""
    tm, tn = plan.tile_shape
    tile_bytes = tm * tn * np.dtype(plan.out.dtype).itemsize
    # one check holds a band of at most BAND_BYTES; a Gram tile, it and its mirror (and copies)
    held = 5 * tile_bytes if plan.symmetric else min(tile_bytes, BAND_BYTES)
    threads = min(CHECK_THREADS, len(items), max(CHECK_BYTES // max(held, 1), 1))
    if threads < 2:
        return [check(x) for x in items]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(check, items))


def _checksum(out: Any, plan: MatmulPlan, tile: Tile) -> int | None:
    """A written tile's crc32 as its task computed it (a Gram product's: see store.mirror),
    read in bands of whole stored rows, at most BAND_BYTES each: the crc32 chained over a
    tile's row bands is the whole tile's."""
    if plan.symmetric:
        read = functools.partial(_stored, out, dtype=plan.out.dtype)
        return mirror.stored_checksum(read, tile, plan.block_shape[0])
    unit = max(plan.out.outer_chunks[0], 1)
    row_bytes = (tile.cols[1] - tile.cols[0]) * np.dtype(plan.out.dtype).itemsize
    step = unit * max(BAND_BYTES // max(unit * row_bytes, 1), 1)
    crc = 0
    for r0 in range(tile.rows[0], tile.rows[1], step):
        data = _stored(out, (r0, min(r0 + step, tile.rows[1])), tile.cols, plan.out.dtype)
        if data is None:
            return None
        crc = zlib.crc32(data.data, crc)
    return crc


def _stored(
    out: Any, rows: tuple[int, int], cols: tuple[int, int], dtype: Any
) -> NDArray[Any] | None:
    """OUT's block as written, C-ordered: chunk by chunk past zarr's machinery where
    pipeline.store.chunks.unsharded covers OUT's layout (several times faster for raw float
    chunks). None when a chunk of it cannot be decoded (truncated, overwritten by something
    else): those rows are computed again. A storage that cannot be reached is an error of its
    own."""
    block = np.empty((rows[1] - rows[0], cols[1] - cols[0]), dtype)
    try:
        if chunk_read.read_into(out, rows, cols, block):
            return block
        return np.ascontiguousarray(out[slice(*rows), slice(*cols)], dtype=dtype)
    except Exception as e:
        # Decoding errors come in every class (gzip's and bz2's are OSErrors): only a storage
        # that refuses or cannot be reached is an error; anything else is computed again.
        refused = isinstance(e, (PermissionError, ConnectionError, TimeoutError))
        if refused or storage_problem(e, None):
            raise
        log.warning(
            "resume: OUT's rows %d:%d, columns %d:%d cannot be read back (%s: %s); "
            "they are computed again", *rows, *cols, type(e).__name__, e,
        )  # fmt: skip
        return None


def stale_tiles(
    plan: MatmulPlan, a_changed: set[tuple[int, int]], b_changed: set[tuple[int, int]]
) -> set[tuple[int, int]]:
    """Tiles that read a changed stored object: every K of their rows of A (an A object's row
    band) and of their columns of B (a B object's column band)."""
    a_rows = plan.a.outer_chunks[0]
    b_cols = plan.b.outer_chunks[1]
    # Changed objects are keyed as stored; an operand read transposed has its axes swapped.
    ta, tb = plan.transposed
    bands_a = {key[1 if ta else 0] for key in a_changed}
    bands_b = {key[0 if tb else 1] for key in b_changed}
    return {
        t.index
        for t in plan.tiles()
        if any(_overlaps(t.rows, i * a_rows, (i + 1) * a_rows) for i in bands_a)
        or any(_overlaps(t.cols, j * b_cols, (j + 1) * b_cols) for j in bands_b)
    }


def forget(url: str, storage_options: dict[str, Any], tiles: set[tuple[int, int]]) -> None:
    """Remove the journal entries of ``tiles``, their bands' too (their bytes are no longer to
    be trusted)."""
    prefixes = tuple(f"{JOURNAL_DIR}/band-{i}-{j}-" for i, j in tiles)
    names = [entry_name(index) for index in tiles]
    names += [n for n in _entries(url, storage_options) if n.startswith(prefixes)]
    _remove(url, storage_options, names)


def forget_bands(url: str, storage_options: dict[str, Any]) -> None:
    """Remove every band entry (the job is complete: each tile has its own entry)."""
    bands = [n for n in _entries(url, storage_options) if n.startswith(f"{JOURNAL_DIR}/band-")]
    _remove(url, storage_options, bands)


def _entries(url: str, storage_options: dict[str, Any]) -> list[str]:
    """The journal's file names, relative to the store (links are never followed)."""
    local = local_path(url)
    if local is not None:
        try:
            return [e.path for e in Door(local).walk(JOURNAL_DIR) if e.path.endswith(".json")]
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs, path = url_to_fs(url, storage_options)
    root = path.rstrip("/")
    return [str(p)[len(root) + 1 :] for p in fs.glob(f"{root}/{JOURNAL_DIR}/*.json")]


def _remove(url: str, storage_options: dict[str, Any], names: list[str]) -> None:
    local = local_path(url)
    if local is not None:
        door = Door(local)
        for name in names:
            door.remove(name)
        return
    fs, path = url_to_fs(url, storage_options)
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(f"{path.rstrip('/')}/{name}")


def _index(entry: dict[str, Any]) -> tuple[int, int] | None:
    """An entry's tile index, or None when it holds no pair of integers."""
    index = entry.get("index")
    if isinstance(index, list) and len(index) == 2 and all(type(i) is int for i in index):
        return (index[0], index[1])
    return None


def _overlaps(span: tuple[int, int], start: int, stop: int) -> bool:
    return span[0] < stop and start < span[1]

"""The per-tile journal inside OUT, read back by --resume."""

from __future__ import annotations

import contextlib
import logging
import zlib
from typing import Any

import numpy as np
import zarr

from pipeline.errors import UsageError
from pipeline.plan import MatmulPlan, Tile
from pipeline.store import mirror
from pipeline.store.fs import fsspec_options, list_json, url_to_fs

log = logging.getLogger("pipeline")
JOURNAL_DIR = "journal"


def entry_name(index: tuple[int, int]) -> str:
    """Where a tile's entry lives inside OUT."""
    return f"{JOURNAL_DIR}/tile-{index[0]}-{index[1]}.json"


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
    options = fsspec_options(data_url, storage_options)
    out = zarr.open_array(data_url, mode="r", storage_options=options)
    tiles = {t.index: t for t in plan.tiles()}
    done: set[tuple[int, int]] = set()
    for entry in list_json(journal_url, JOURNAL_DIR, storage_options):
        tile = tiles.get(tuple(entry.get("index", ())))
        if tile is None or entry.get("fingerprint") != fp:
            continue
        if _checksum(out, plan, tile) == entry.get("checksum"):
            done.add(tile.index)
    return done


def _checksum(out: Any, plan: MatmulPlan, tile: Tile) -> int | None:
    """A written tile's crc32 as its task computed it (a Gram product's: see store.mirror)."""
    if plan.symmetric:
        return mirror.stored_checksum(out, tile, plan.out.dtype, plan.block_shape[0])
    rows, cols = slice(*tile.rows), slice(*tile.cols)
    return zlib.crc32(np.ascontiguousarray(out[rows, cols], dtype=plan.out.dtype).data)


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
    """Remove the journal entries of ``tiles`` (their bytes are no longer to be trusted)."""
    fs, path = url_to_fs(url, storage_options)
    for index in tiles:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(f"{path.rstrip('/')}/{entry_name(index)}")


def _overlaps(span: tuple[int, int], start: int, stop: int) -> bool:
    return span[0] < stop and start < span[1]

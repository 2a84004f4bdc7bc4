"""The per-tile journal inside OUT, read back by --resume."""

from __future__ import annotations

import logging
import zlib
from typing import Any

import numpy as np
import zarr

from pipeline.errors import UsageError
from pipeline.plan import MatmulPlan
from pipeline.store.fs import fsspec_options, list_json

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
    out = zarr.open_array(url, mode="r", storage_options=fsspec_options(url, storage_options))
    tiles = {t.index: t for t in plan.tiles()}
    done: set[tuple[int, int]] = set()
    for entry in list_json(url, JOURNAL_DIR, storage_options):
        index = tuple(entry.get("index", ()))
        tile = tiles.get(index)
        if tile is None or entry.get("fingerprint") != fp:
            continue
        data = np.ascontiguousarray(
            out[tile.rows[0] : tile.rows[1], tile.cols[0] : tile.cols[1]], dtype=plan.out.dtype
        )
        if zlib.crc32(data.data) == entry.get("checksum"):
            done.add(tile.index)
    log.info("resume: %d of %d tile(s) already written", len(done), len(tiles))
    return done

"""The per-tile journal inside OUT, read back by --resume."""

from __future__ import annotations

import logging
import zlib
from typing import Any

import numpy as np
import zarr

from pipeline import io
from pipeline.errors import UsageError
from pipeline.plan import MatmulPlan
from pipeline.spec import StoreSpec

log = logging.getLogger("pipeline")
JOURNAL_DIR = "journal"


def finished_tiles(
    store: StoreSpec, plan: MatmulPlan, fp: str, state: dict[str, Any]
) -> set[tuple[int, int]]:
    """Tiles journaled under this plan whose written bytes still match their checksum."""
    if state.get("fingerprint") != fp:
        raise UsageError(
            f"cannot resume {store.out_url}: it was written for different inputs or tiling "
            f"(fingerprint {state.get('fingerprint')} != {fp}); use --overwrite to start over"
        )
    out = zarr.open_array(
        store.out_url, mode="r", storage_options=io._options(store.out_url, store.storage_options)
    )
    tiles = {t.index: t for t in plan.tiles()}
    done: set[tuple[int, int]] = set()
    for entry in io.list_json(store.out_url, JOURNAL_DIR, store.storage_options):
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

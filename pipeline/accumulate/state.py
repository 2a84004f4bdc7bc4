"""``C ← α·A·B + β·C`` exactly once: the accumulation's state beside C's chunks.

Everything lives in ``C/.tilegemm-accumulate/`` (C may be anyone's array: nothing else of it is
touched but the chunks the tiles rewrite), removed once the accumulation is complete:

- ``state.json``: the fingerprint (inputs, tiling, α, β, C's metadata) and ``complete``;
- ``original/``: C's own metadata, and C's stored objects (chunks, or shards) of every tile a
  task has started, moved there as they are (a rename where the store has one: no byte is
  read, decoded or written), with ``saved/tile-I-J.json`` written once a tile's objects are
  all moved. A task moves them before its first write to C and always reads C_old from
  there, never from C: each product is added to the original values once, however often
  the tile runs;
- ``journal/`` and ``inputs.json``: as in OUT for a plain product (--resume skips journaled
  tiles and recomputes those that read a changed input chunk — from the saved originals).
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.errors import UnsafeOutputError, UsageError
from pipeline.plan.matmul import MatmulPlan
from pipeline.store import journal
from pipeline.store.door import Door
from pipeline.store.fs import (
    local_path,
    read_json,
    read_small,
    url_to_fs,
    write_bytes,
)
from pipeline.store.handles import open_output
from pipeline.store.output import Output
from pipeline.store.owned import SIDECAR
from pipeline.store.resume import forget_stale
from pipeline.store.signature import Listing

STATE = "state.json"
ORIGINAL = "original"
SAVED = "saved"
METADATA = ("zarr.json", ".zarray")  # an array's metadata document, Zarr v3 or v2


def sidecar(out: Output) -> Output:
    """The accumulation's folder inside C, as an Output (its journal and input listings)."""
    return Output(f"{out.url.rstrip('/')}/{SIDECAR}", out.storage_options)


def read_state(out: Output) -> dict[str, Any] | None:
    torn = {"fingerprint": None, "complete": False}  # never taken as finished
    try:
        state = read_json(sidecar(out).url, STATE, out.storage_options)
    except ValueError:
        return torn
    return state if state is None or isinstance(state, dict) else torn


def start(
    out: Output,
    plan: MatmulPlan,
    fp: str,
    now: dict[str, Listing],
    encodings: tuple[tuple[str, str], tuple[str, str]],
    *,
    resume: bool,
) -> set[tuple[int, int]]:
    """Begin an accumulation (its originals array, input listings and state), or for --resume
    return the tiles an unfinished one journaled that read no input changed since (the others
    are computed again, from the saved originals). The caller holds C's lock."""
    state = read_state(out)
    if state is not None and state.get("complete"):
        remove(out)  # a finished one killed while cleaning up
        state = None
    if state is None and resume:
        raise UsageError(
            f"--resume: C ({out.url}) has no unfinished accumulation (the last one finished, "
            "or none started); rerun without --resume to add the product again"
        )
    if state is not None and not resume:
        raise UsageError(
            f"C ({out.url}) holds an unfinished accumulation (some tiles are updated, others "
            "not); rerun it with --resume to finish it: each product is added exactly once"
        )
    if state is not None:
        if state.get("fingerprint") != fp:
            raise UsageError(
                f"cannot resume the accumulation into {out.url}: it was started with other "
                "inputs, tiling, --alpha or --beta; rerun it exactly as it was started"
            )
        done = journal.journaled(sidecar(out).url, out.url, out.storage_options, plan, fp)
        return done - forget_stale(sidecar(out), plan, now, encodings)
    _begin(out, plan, fp, now)
    return set()


def _begin(out: Output, plan: MatmulPlan, fp: str, now: dict[str, Listing]) -> None:
    side = sidecar(out)
    side.save_input_listings(now)  # before the state: a started accumulation always has one
    for name in METADATA:  # C's own: its moved objects decode there as they did in C
        document = read_small(out.url, name, out.storage_options)
        if document is not None:
            write_bytes(side.url, f"{ORIGINAL}/{name}", document, out.storage_options)
    state = {"fingerprint": fp, "complete": False, "tile_shape": list(plan.tile_shape)}
    write_bytes(side.url, STATE, json.dumps(state).encode(), out.storage_options)


def object_keys(array: Any, rows: tuple[int, int], cols: tuple[int, int]) -> list[str]:
    """The keys of C's stored objects (chunks, or shards) that make up a tile of whole ones."""
    outer = array.shards or array.chunks
    spans = []
    for (start, stop), size, extent in zip((rows, cols), outer, array.shape, strict=True):
        if start % size or (stop % size and stop != extent):
            raise AssertionError(f"tile {start}..{stop} is not made of whole {size}-objects")
        spans.append(range(start // size, -(-stop // size)))
    return [array.metadata.encode_chunk_key((i, j)) for i in spans[0] for j in spans[1]]


def move_originals(out: Output, keys: list[str]) -> None:
    """Move C's objects into ``original/`` before the tile's first write. Safe to repeat: an
    object moved by an earlier run is not in C any more (nothing writes C before the tile's
    marker), and one never written is C's fill value in both places."""
    local = local_path(out.url)
    if local is not None:
        door = Door(local, "C")
        for key in keys:
            target = f"{SIDECAR}/{ORIGINAL}/{key}"
            if door.exists(target):  # linked there by a run killed before its unlink
                if door.exists(key) and not door.same_file(key, target):
                    raise UnsafeOutputError(
                        f"C ({out.url}): {key} and its saved original differ; the "
                        "accumulation cannot tell which is C's: restore C from a copy"
                    )
                door.remove(key)
                continue
            door.rename(key, target)
        return
    fs, path = url_to_fs(out.url, out.storage_options)
    root = path.rstrip("/")
    for key in keys:
        source, target = f"{root}/{key}", f"{root}/{SIDECAR}/{ORIGINAL}/{key}"
        if not fs.exists(source):
            continue
        if fs.exists(target):  # an object store's copy finished and its delete did not
            fs.rm_file(source)
            continue
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)  # a no-op on object stores
        fs.mv(source, target)


def mark_complete(out: Output) -> None:
    state = {**(read_state(out) or {}), "complete": True}
    write_bytes(sidecar(out).url, STATE, json.dumps(state).encode(), out.storage_options)


def remove(out: Output) -> None:
    """Delete the accumulation's folder (its originals go with it)."""
    local = local_path(out.url)
    if local is not None:
        door = Door(local, "C")
        if door.exists(SIDECAR):
            door.remove_tree(SIDECAR)
        return
    fs, path = url_to_fs(sidecar(out).url, out.storage_options)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def snapshot(out: Output) -> dict[str, Any]:
    """What ``prepare`` saw of C, compared again under C's lock: its metadata and the state of
    an accumulation into it."""
    array = open_output(out.url, out.storage_options)
    meta = json.dumps(array.metadata.to_dict(), sort_keys=True, default=str)
    state = read_state(out)
    snap: dict[str, Any] = {"metadata": meta, "accumulation": state}
    if state and state.get("tile_shape"):  # a resumed accumulation keeps its tiling
        snap["tile_shape"] = state["tile_shape"]
    return snap

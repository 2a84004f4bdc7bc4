"""``C ← α·A·B + β·C`` exactly once: the accumulation's protocol, its state beside C's chunks.

Everything lives in ``C/.tilegemm-accumulate/`` (C may be anyone's array: nothing else of it is
touched but the chunks the tiles rewrite): ``state.json`` (the fingerprint, the tile shape and
the phase), ``original/`` (C's metadata, and C's stored objects of every tile a task started,
moved there as they are, keyed as in C), ``saved/tile-I-J.json`` (a tile's originals are all
moved), and ``journal/`` and ``inputs.json`` as in OUT for a plain product.

Each step is one atomic act on disk (a rename, a file written under a temporary name, synced
and renamed, or a removal), and what a crash leaves is told from the disk alone:

1. **planned**: the input listings and C's metadata written, then ``state.json`` (phase
   ``running``): that write is the commit point. A folder without ``state.json`` and with no
   saved original is a start killed before it: any run removes it.
2. **originals moved**: a tile's task renames C's objects of the tile into ``original/``, then
   writes the tile's marker (naming the objects C did not hold). From then on C_old of the
   tile is read from ``original/`` only, so each product is added to it once, however often
   the tile runs.
3. **tiles written**: the task writes the tile into C band by band, each journaled.
   ``--resume`` goes on from here: journaled tiles kept, the others computed again.
4. **complete**: ``state.json`` rewritten with phase ``complete`` once every tile is written
   (and verified, with --verify): C holds the new values. Then the folder is removed,
   ``state.json`` last; any later run that finds a complete state finishes the removal.

A failed or refused accumulation rolls back: an empty file ``rolling-back`` created (no data
block: it is written on a full disk too), then every saved original moved home over C's object
(and the objects C did not hold removed), then the folder removed, ``state.json`` and the flag
last. Any later run that finds the flag finishes the rollback first.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pipeline.accumulate import crash
from pipeline.accumulate.originals import (
    FLAG,
    METADATA,
    ORIGINAL,
    SAVED,
    STATE,
    Files,
    clean,
    restore,
)
from pipeline.errors import UnsafeOutputError, UsageError
from pipeline.plan.matmul import MatmulPlan
from pipeline.store import journal
from pipeline.store.door import Door
from pipeline.store.fs import local_path, read_json, read_small, write_bytes
from pipeline.store.handles import open_output
from pipeline.store.output import Output
from pipeline.store.owned import SIDECAR
from pipeline.store.resume import forget_stale
from pipeline.store.signature import Listing

log = logging.getLogger("pipeline")
__all__ = ["ORIGINAL", "SAVED", "SIDECAR", "STATE"]

RUNNING, COMPLETE, ROLLING_BACK = "running", "complete", "rolling-back"
TORN = {"fingerprint": None, "phase": RUNNING, "torn": True}
"""A state file that does not parse: never taken as finished, nor resumed."""


def sidecar(out: Output) -> Output:
    """The accumulation's folder inside C, as an Output (its journal and input listings)."""
    return Output(f"{out.url.rstrip('/')}/{SIDECAR}", out.storage_options)


def read_state(out: Output) -> dict[str, Any] | None:
    """The state (None: no accumulation has started), its ``phase`` always set."""
    if Files(out).exists(f"{SIDECAR}/{FLAG}"):  # a rollback began: it is finished first
        try:
            found = read_json(sidecar(out).url, STATE, out.storage_options)
        except ValueError:
            found = None
        return {**(found if isinstance(found, dict) else {}), "phase": ROLLING_BACK}
    try:
        state = read_json(sidecar(out).url, STATE, out.storage_options)
    except (ValueError, UnsafeOutputError, IsADirectoryError):
        return dict(TORN)
    if state is None:
        return None
    if not isinstance(state, dict):
        return dict(TORN)
    phase = state.get("phase", COMPLETE if state.get("complete") else RUNNING)
    return {**state, "phase": phase if phase in (RUNNING, COMPLETE, ROLLING_BACK) else RUNNING}


def _write_state(out: Output, state: dict[str, Any]) -> None:
    data = json.dumps({**state, "complete": state["phase"] == COMPLETE}).encode()
    local = local_path(out.url)
    if local is not None:  # synced: a state is a commit point
        Door(local, "C").write(f"{SIDECAR}/{STATE}", data, durable=True)
    else:
        write_bytes(sidecar(out).url, STATE, data, out.storage_options)


def start(
    out: Output,
    plan: MatmulPlan,
    fp: str,
    now: dict[str, Listing],
    encodings: tuple[tuple[str, str], tuple[str, str]],
    *,
    resume: bool,
) -> set[tuple[int, int]]:
    """Begin an accumulation, or for --resume return the tiles an unfinished one journaled
    that read no input changed since (the others are computed again, from the saved
    originals). What an earlier run left is finished first: a complete one's folder removed,
    a rollback completed. The caller holds C's lock."""
    found = read_state(out)
    state = settle(out)
    if state is None and resume:
        raise UsageError(_nothing_to_resume(out, found))
    if state is not None and state.get("torn"):
        raise UnsafeOutputError(
            f"C ({out.url}) holds {SIDECAR}/{STATE} that is not an accumulation's state (not "
            "JSON of ours, a folder, or too large): it cannot be told what C holds; if no "
            f"accumulation into C is running or was stopped, remove the folder (rm -r "
            f"{out.url.rstrip('/')}/{SIDECAR}) after checking C, or restore C from a copy"
        )
    if state is not None and not resume:
        raise UsageError(
            f"C ({out.url}) holds an unfinished accumulation (some tiles are updated, others "
            "not); finish it with the same command and --resume (each product is added "
            "exactly once); C reads right only after that"
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


def _nothing_to_resume(out: Output, found: dict[str, Any] | None) -> str:
    if found is not None and found["phase"] == COMPLETE:
        return (
            f"--resume: the last accumulation into C ({out.url}) had finished (its folder is "
            "now removed): C holds its new values, nothing is left to resume; adding the "
            "product again is a new --accumulate, without --resume"
        )
    if found is not None and found["phase"] == ROLLING_BACK:
        return (
            f"--resume: the last accumulation into C ({out.url}) failed and is now rolled "
            "back: C holds its values from before it; rerun without --resume to add the product"
        )
    return (
        f"--resume: C ({out.url}) has no unfinished accumulation (the last one finished "
        "or was rolled back, or none started); rerun without --resume to add the product"
    )


def settle(out: Output) -> dict[str, Any] | None:
    """Finish what an earlier run left (a complete accumulation's folder, a rollback); the
    state of an unfinished accumulation, or None when there is none now."""
    state = read_state(out)
    if state is not None and state["phase"] == COMPLETE:
        log.info("removing the folder of a finished accumulation into C (%s)", out.url)
        clean(out)
        return None
    if state is not None and state["phase"] == ROLLING_BACK:
        log.info("finishing the rollback of a failed accumulation into C (%s)", out.url)
        restore(out)
        clean(out)
        return None
    if state is None:
        _clear_unstarted(out)
    return state


def _clear_unstarted(out: Output) -> None:
    """A folder without a state: a start killed before its commit point (nothing of C's in
    it) is removed; one holding C's saved objects is not ours to judge."""
    files = Files(out)
    left = files.files(SIDECAR)
    if not left:
        files.remove_folder(SIDECAR)
        return
    ours = {f"{SIDECAR}/{ORIGINAL}/{name}" for name in METADATA} | {f"{SIDECAR}/inputs.json"}
    if saved := [name for name in left if name not in ours]:
        raise UnsafeOutputError(
            f"C ({out.url}) holds {SIDECAR}/ with no state.json but {len(saved)} other "
            f"file(s) (e.g. {saved[0]}): an accumulation's saved originals whose run cannot be "
            f"told; if that accumulation finished (exit 0), remove the folder (rm -r "
            f"{out.url.rstrip('/')}/{SIDECAR}); otherwise restore C from a copy"
        )
    clean(out)


def _begin(out: Output, plan: MatmulPlan, fp: str, now: dict[str, Listing]) -> None:
    side = sidecar(out)
    side.save_input_listings(now)  # before the state: a started accumulation always has one
    crash.point("begin.listings")
    for name in METADATA:  # C's own: its moved objects decode there as they did in C
        document = read_small(out.url, name, out.storage_options)
        if document is not None:
            write_bytes(side.url, f"{ORIGINAL}/{name}", document, out.storage_options)
    _write_state(out, {"fingerprint": fp, "phase": RUNNING, "tile_shape": list(plan.tile_shape)})
    crash.point("begin.state")


def finish(out: Output) -> None:
    """Every tile is written (and verified): mark the accumulation complete, then remove its
    folder (the originals are no longer needed)."""
    state = read_state(out) or {}
    _write_state(out, {**state, "phase": COMPLETE})
    crash.point("finish.complete")
    clean(out)


def roll_back(out: Output) -> int:
    """Put C back as it was before the accumulation (no task of it may be running); returns
    the objects moved home."""
    if read_state(out) is None:
        return 0
    files = Files(out)
    if files.door is not None:  # empty: no data block to find on a full disk
        files.door.write(f"{SIDECAR}/{FLAG}", b"", durable=True)
    else:
        write_bytes(sidecar(out).url, FLAG, b"", out.storage_options)
    crash.point("rollback.state")
    restored = restore(out)
    clean(out)
    return restored


def snapshot(out: Output) -> dict[str, Any]:
    """What ``prepare`` saw of C, compared again under C's lock: its metadata and the state of
    an accumulation into it."""
    array = open_output(out.url, out.storage_options)
    meta = json.dumps(array.metadata.to_dict(), sort_keys=True, default=str)
    state = read_state(out)
    snap: dict[str, Any] = {"metadata": meta, "accumulation": state}
    if state and state["phase"] == RUNNING and state.get("tile_shape"):
        snap["tile_shape"] = state["tile_shape"]  # a resumed accumulation keeps its tiling
    return snap

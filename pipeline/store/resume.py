"""What a run knows of its inputs: their listings at its start, saved in OUT; on --resume, the
journaled tiles that read a stored object changed since are computed again; before OUT is
marked complete, a change during the run fails it."""

from __future__ import annotations

import logging

from pipeline.errors import JobError, UsageError
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.spec import StoreSpec
from pipeline.store import journal
from pipeline.store.output import Output
from pipeline.store.signature import Listing, changed_chunks, data_listing

log = logging.getLogger("pipeline")
NAMES = ("A", "B")


def listings(store: StoreSpec) -> dict[str, Listing]:
    """Both inputs as stored now (listings only, no data read)."""
    urls = (store.a_url, store.b_url)
    return {n: data_listing(u, store.storage_options) for n, u in zip(NAMES, urls, strict=True)}


def forget_stale(
    output: Output,
    plan: MatmulPlan,
    now: dict[str, Listing],
    encodings: tuple[tuple[str, str], tuple[str, str]],
    splits: tuple[int | None, int | None] = (None, None),
) -> set[tuple[int, int]]:
    """--resume: drop the journal entries of tiles that read an object changed since the last
    run started, then save today's listings (in this order: a kill in between repeats it).
    ``splits``: the inputs' as read (an N-D field's chunk keys have more parts)."""
    then = output.input_listings()
    if then is None or not all(isinstance(then.get(n), dict) for n in NAMES):
        raise UsageError(
            f"cannot resume {output.url}: it holds no record of its inputs (written by an "
            "older version, or the record is damaged), so a change to A or B could not be "
            "told; use --overwrite to start over"
        )
    a, b = (
        changed_chunks(then[n], now[n], e, s)
        for n, e, s in zip(NAMES, encodings, splits, strict=True)
    )
    stale = journal.stale_tiles(plan, a, b)
    if stale:
        log.info(
            "resume: %d stored object(s) of A and %d of B changed since the last run; "
            "%d tile(s) that read them are computed again", len(a), len(b), len(stale),
        )  # fmt: skip
        output.forget_tiles(stale)
    output.save_input_listings(now)
    return stale


def check_unchanged(store: StoreSpec, at_start: dict[str, Listing]) -> None:
    """Before OUT is marked complete: no input changed while the job ran."""
    now = listings(store)
    for name in NAMES:
        if now[name] != at_start[name]:
            changed = sum(now[name].get(k) != v for k, v in at_start[name].items())
            changed += len(now[name].keys() - at_start[name].keys())
            raise JobError(
                f"input {name} changed while the job ran ({changed} stored object(s) added, "
                "removed or rewritten); OUT is not marked complete: rerun with --resume once "
                "the inputs are final (the tiles that read them are computed again)"
            )

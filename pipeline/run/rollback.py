"""A failed or refused accumulation puts C back as it was: only once no task of the job runs
on the workers (one still running could write C after its rollback), else C is left for
--resume, saying so."""

from __future__ import annotations

import logging
from typing import Any

from distributed import Client

from pipeline.accumulate.state import roll_back
from pipeline.run.stopping import RUN_TIMEOUT, running
from pipeline.store.output import Output

log = logging.getLogger("pipeline")


def roll_back_after_failure(client: Client, keys: list[Any], out: Output) -> None:
    """Roll the accumulation into ``out`` back when none of ``keys`` runs any more."""
    if keys and running(client, set(keys), RUN_TIMEOUT) != 0:
        log.error(
            "some tile tasks may still be running, so C (%s) is not put back now: its "
            "accumulation is left unfinished; finish it with the same command and --resume",
            out.url,
        )
        return
    try:
        restored = roll_back(out)
    except Exception as e:  # the job's own error is the one to raise; this one is told
        log.error(
            "could not put C (%s) back as it was (%s: %s); the next --accumulate into it "
            "finishes putting it back",
            out.url,
            type(e).__name__,
            e,
        )
        return
    log.info("C (%s) is put back as it was (%d stored object(s) moved home)", out.url, restored)

"""A failed or refused accumulation puts C back as it was: only once no task of the job runs
on the workers (one still running could write C after its rollback), else C is left for
--resume, saying so."""

from __future__ import annotations

import logging
from typing import Any

from distributed import Client

from pipeline.accumulate.state import ROLLING_BACK, read_state, roll_back
from pipeline.errors import JobError
from pipeline.run.client import KEPT_FOR_RESUME
from pipeline.run.stopping import RUN_TIMEOUT, running
from pipeline.store.output import Output

log = logging.getLogger("pipeline")


def roll_back_after_failure(client: Client, keys: list[Any], out: Output) -> bool:
    """Roll the accumulation into ``out`` back when none of ``keys`` runs any more; True
    when C is back as it was."""
    if keys and running(client, set(keys), RUN_TIMEOUT) != 0:
        log.error(
            "some tile tasks may still be running, so C (%s) is not put back now: its "
            "accumulation is left unfinished; finish it with the same command and --resume",
            out.url,
        )
        return False
    try:
        restored = roll_back(out)
    except Exception as e:  # the job's own error is the one to raise; this one is told
        pending = (read_state(out) or {}).get("phase") == ROLLING_BACK
        log.error(
            "could not put C (%s) back as it was (%s: %s); %s",
            out.url,
            type(e).__name__,
            e,
            "the next --accumulate into it finishes putting it back"
            if pending
            else "its accumulation is left unfinished: finish it with --resume",
        )
        return False
    log.info("C (%s) is put back as it was (%d stored object(s) moved home)", out.url, restored)
    return True


def rolled_back(error: Exception) -> Exception:
    """The job's error, its way on saying that C was put back (not kept for --resume)."""
    if isinstance(error, JobError) and KEPT_FOR_RESUME in str(error):
        fixed = str(error).replace(
            KEPT_FOR_RESUME,
            "C is put back as it was (nothing of this accumulation is kept): rerun the same "
            "command, without --resume, once the cause is fixed",
        )
        return JobError(fixed)
    return error

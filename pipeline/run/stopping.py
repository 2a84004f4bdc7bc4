"""Stopping a job's tasks: cancelling a future does not stop a task already running, so a
job that ends early (a failed tile, Ctrl-C) waits until the workers run none of its tasks
before it lets go of OUT's lock; otherwise a tile would go on writing OUT beside whatever
took the lock next (a --resume, or an --overwrite with other inputs)."""

from __future__ import annotations

import logging
import time
from typing import Any

from distributed import Client, Future

from pipeline.run.progress import TRANSIENT, ProgressLine

log = logging.getLogger("pipeline")


def stop_running(
    client: Client,
    futures: dict[tuple[int, int], Future[Any]],
    pending: set[Future[Any]],
    line: ProgressLine,
    timeout: float,
    why: str,
    way_out: str,
) -> None:
    """Cancel the tasks not started and wait for the running ones (drain), saying so."""
    client.cancel(list(pending))
    keys = [f.key for f in futures.values()]
    if running(client, set(keys), RUN_TIMEOUT) != 0:
        line.close()
        log.warning(
            "%s: waiting for the tile tasks already running to stop (OUT stays locked until "
            "then); %s",
            why,
            way_out,
            extra=TRANSIENT,
        )
        drain(client, keys, timeout)


def drain(client: Client, keys: list[Any], timeout: float) -> None:
    """Wait until no worker thread still runs one of ``keys``. Cancelling a future does not stop
    a task already running: it would go on writing OUT after the job let go of its lock (and a
    --resume, or another job, took it). Its tile is kept, journaled as usual. A worker that
    does not answer may still be running some: waited for too, up to ``timeout``."""
    deadline, ours = time.monotonic() + timeout, set(keys)
    while (left := running(client, ours, RUN_TIMEOUT)) != 0:
        if time.monotonic() > deadline:
            log.warning(
                "%s tile task(s) may still be running on the workers after %.0f s; "
                "wait for them before --resume",
                "some" if left is None else left,
                timeout,
            )
            return
        time.sleep(0.5)


RUN_TIMEOUT = 5.0
"""Seconds to wait for the workers' answer to one poll (a stopped worker never answers)."""


def running(client: Client, ours: set[Any], timeout: float) -> int | None:
    """How many of ``ours`` run in a worker thread now; None when a live worker did not
    answer in ``timeout`` s. A worker that is gone runs nothing."""

    def active(dask_worker: Any) -> list[Any]:
        return list(dask_worker.active_keys)  # at most one per thread: cheap to send

    try:
        answers = client.run(active, on_error="return", callback_timeout=timeout)
    except TimeoutError:
        return None
    except Exception:  # the cluster closing: nothing left to run our tasks
        return 0
    found = [a for a in answers.values() if isinstance(a, list)]
    return sum(len(ours.intersection(a)) for a in found)

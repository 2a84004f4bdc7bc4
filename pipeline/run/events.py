"""Progress below tile level: tasks report their K panels to the client as they go.

Worker side, ``PanelReporter`` logs a small event per task (``Worker.log_event``: the worker's
batched stream to the scheduler) at most every REPORT_SECONDS and after the task's last panel;
client side, ``subscribe`` hands the job's events (``Client.subscribe_topic``) to the progress
line. Each event carries the task's running totals, so a lost or late one costs nothing but a
stale figure, and a finished tile's own stats replace them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("pipeline")

REPORT_SECONDS = 0.25
"""Least time between two events of one task (a few per second at most)."""
TOPIC = "tilegemm-progress"
"""One topic for every job, each event naming its job: the scheduler keeps a bounded log per
topic and never drops a topic, so a topic per job would grow a long-lived scheduler."""


def panel_flops(a_panel: Any, b_panel: Any) -> int:
    """Flops of one panel's product: 2·rows·width·columns."""
    return 2 * int(a_panel.shape[0]) * int(a_panel.shape[1]) * int(b_panel.shape[1])


class PanelReporter:
    """One task's running totals: K panels done, flops done, bytes decoded."""

    def __init__(self, run_id: str, tile: tuple[int, int], k0: int, panels: int) -> None:
        """``run_id``: the job's, or empty to send nothing; ``k0``: where the task's K range
        starts (with the tile, it names a split-K group); ``panels``: how many it has."""
        self.panels = panels
        self.state: dict[str, Any] = {"run": run_id, "tile": list(tile), "k0": k0}
        self.state.update(panels=0, flops=0, bytes=0)
        self.sent = time.monotonic()
        self.worker = current_worker() if run_id else None
        self._lock = threading.Lock()  # the GPU path reports from its decode threads

    def panel_done(self, flops: int, bytes_read: int) -> None:
        self.add(1, flops, bytes_read)

    def add(self, panels: int, flops: int, bytes_read: int) -> None:
        with self._lock:
            self.state["panels"] += panels
            self.state["flops"] += flops
            self.state["bytes"] += bytes_read
            now = time.monotonic()
            last = self.state["panels"] == self.panels
            if self.worker is None or not (last or now - self.sent >= REPORT_SECONDS):
                return
            self.sent = now
            message = dict(self.state)
        self.worker.log_event(TOPIC, message)  # thread-safe: distributed hops to its loop


def current_worker() -> Any:
    """The worker running this task; None outside one (a task function called directly)."""
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


_lock = threading.Lock()
_handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
"""The running jobs' handlers, by run id."""
_subscribed: dict[str, int] = {}
"""Jobs listening through each client (by client id): it subscribes once, for the first."""


@contextlib.contextmanager
def subscribe(
    client: Any, run_id: str, handler: Callable[[dict[str, Any]], None]
) -> Iterator[None]:
    """Call ``handler(event)`` for every event of job ``run_id`` until the block ends (an
    empty ``run_id``: nothing). Jobs sharing a client share its subscription."""
    if not run_id:
        yield
        return
    with _lock:
        _handlers[run_id] = handler
        _subscribed[client.id] = _subscribed.get(client.id, 0) + 1
        if _subscribed[client.id] == 1:
            client.subscribe_topic(TOPIC, _dispatch)
    try:
        yield
    finally:
        with _lock:
            del _handlers[run_id]
            _subscribed[client.id] -= 1
            if not _subscribed[client.id]:
                del _subscribed[client.id]
                with contextlib.suppress(Exception):
                    client.unsubscribe_topic(TOPIC)


def _dispatch(event: tuple[float, Any]) -> None:
    """On the client's event loop: hand an event to its job's handler (other jobs' and late
    ones are dropped)."""
    message = event[1]
    handler = _handlers.get(message.get("run", "")) if isinstance(message, dict) else None
    if handler is None:
        return
    try:
        handler(message)
    except Exception as e:  # noqa: BLE001 - a bad event must not break the job
        log.debug("ignored a progress event: %s", e)

"""Decoded input panels shared by the tasks of one worker process.

Concurrent tiles of one tile column need the same B panels (of one tile row, the same A panels),
and they walk K in the same order: the first task to ask decodes a panel, the others wait for it
and reuse it. On a few cores decoding is a real share of the BLAS time, so decoding once
matters.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from numpy.typing import NDArray


class PanelCache:
    """A byte-bounded LRU of decoded panels; a panel being decoded is waited for, not re-read."""

    def __init__(self, budget_bytes: int = 0) -> None:
        self.budget_bytes = budget_bytes
        self.run_id = ""
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Future[NDArray[Any]]] = OrderedDict()
        self._uses: dict[Hashable, int] = {}  # gets left before a panel is dropped
        self._bytes = 0

    def get(
        self, key: Hashable, load: Callable[[], NDArray[Any]], uses: int | None = None
    ) -> tuple[NDArray[Any], bool]:
        """(panel, decoded_here): decoded_here is False when another task's decode was reused.

        ``uses``: how many tasks of the job read this panel; after that many gets it leaves
        the cache, so its buffer goes back to the pool once its last reader drops it.
        """
        with self._lock:
            if self.budget_bytes <= 0:
                entry, mine = None, True
            elif key in self._entries:
                entry, mine = self._entries[key], False
                self._entries.move_to_end(key)
            else:
                entry, mine = Future(), True
                self._entries[key] = entry
                if uses is not None:
                    self._uses[key] = uses
            if entry is not None and key in self._uses:
                self._uses[key] -= 1
        if entry is None:  # caching is off
            return load(), True
        if not mine:
            panel = entry.result()
            self._drop_if_used(key)
            return panel, False
        try:
            panel = load()
        except BaseException as e:
            with self._lock:
                self._entries.pop(key, None)
                self._uses.pop(key, None)
            entry.set_exception(e)
            raise
        entry.set_result(panel)
        with self._lock:
            self._bytes += panel.nbytes
            self._evict()
        self._drop_if_used(key)
        return panel, True

    def _drop_if_used(self, key: Hashable) -> None:
        """Forget a finished panel every planned reader has had."""
        with self._lock:
            if self._uses.get(key, 1) > 0:
                return
            entry = self._entries.pop(key, None)
            del self._uses[key]
            if entry is not None and entry.done() and entry.exception() is None:
                self._bytes -= entry.result().nbytes

    def _evict(self) -> None:
        """Drop least recently used finished panels until under budget (never the newest)."""
        for key in list(self._entries)[:-1]:
            if self._bytes <= self.budget_bytes:
                return
            entry = self._entries[key]
            if entry.done() and entry.exception() is None:
                self._bytes -= entry.result().nbytes
                del self._entries[key]
                self._uses.pop(key, None)

    def use(self, run_id: str, budget_bytes: int) -> None:
        """Switch to a job: a new job's first task drops the panels of the previous one."""
        with self._lock:
            if run_id != self.run_id:
                self._entries.clear()
                self._uses.clear()
                self._bytes = 0
                self.run_id = run_id
            self.budget_bytes = budget_bytes

    def release(self, run_id: str) -> int:
        """Drop a finished job's panels (a long-lived worker would otherwise hold them until
        the next job); returns the bytes freed."""
        with self._lock:
            if run_id != self.run_id:
                return 0
            freed = self._bytes
            self._entries.clear()
            self._uses.clear()
            self._bytes = 0
            return freed

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._uses.clear()
            self._bytes = 0


CACHE = PanelCache()
"""The worker process's cache; each task sets its job and budget (``use``)."""


def release_panels(run_id: str) -> int:
    """Run on every worker after a job (``client.run``): the bytes of panels freed."""
    return CACHE.release(run_id)

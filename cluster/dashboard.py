"""The local cluster's dashboard, loaded when someone first asks for a page of it.

Importing bokeh and building the dashboard's applications costs a measurable share of a small
job's CPU time, which a job nobody watches would pay while it runs: on few cores, time taken
from the product.
Until a first request, a placeholder answers every dashboard path with a page that reloads
itself; that request starts the import in a thread and the dashboard is connected on the event
loop, in the placeholder's stead, a second or so later.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import dask
from tornado import web

from cluster.security import ORIGIN_KEY

PAGE = (
    "<!DOCTYPE html><html><head><meta http-equiv='refresh' content='1'>"
    "<title>Dask dashboard</title></head><body><p>Starting the dashboard&hellip; "
    "this page reloads itself.</p></body></html>"
)


def has_dashboard() -> bool:
    """bokeh is installed (the dashboard's one extra dependency)."""
    return importlib.util.find_spec("bokeh") is not None


@contextlib.contextmanager
def quiet_port_change() -> Iterator[None]:
    """While a local cluster starts: no warning when the dashboard's port is taken (another
    cluster, a notebook's own): distributed binds a free one and the logged link shows it. A
    scoped filter, so the caller's own filters are as they were after."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"Port \d+ is already in use", category=UserWarning
        )
        yield


def serve_when_asked(scheduler: Any, origins: list[str]) -> None:
    """On the scheduler's event loop: answer the dashboard's paths with the placeholder, and
    load the dashboard at the first request (its websockets take ``origins`` only)."""
    application = scheduler.http_application
    loop = scheduler.loop
    started = threading.Event()

    def connect(dashboard: Any) -> None:  # on the loop: nothing answers between the two steps
        with dask.config.set({ORIGIN_KEY: origins}):  # bokeh reads them from dask config
            dashboard.connect(application, scheduler.http_server, scheduler, "/")
        application.applications.remove(placeholder)

    def load() -> None:
        try:
            import distributed.dashboard.scheduler as dashboard
        except Exception:  # noqa: BLE001 - a broken bokeh: the paths answer 404, not forever 503
            loop.add_callback(application.applications.remove, placeholder)
            return
        loop.add_callback(connect, dashboard)

    def start() -> None:
        if not started.is_set():
            started.set()
            threading.Thread(target=load, name="dashboard-load", daemon=True).start()

    placeholder = web.Application([(r".*", _Starting, {"start": start})])
    application.add_application(placeholder)  # asked after the scheduler's own routes


class _Starting(web.RequestHandler):
    def initialize(self, start: Any) -> None:
        self._start = start

    def get(self, *args: Any) -> None:
        self._start()
        self.set_status(503)
        self.set_header("Retry-After", "1")
        self.set_header("Cache-Control", "no-store")
        self.write(PAGE)

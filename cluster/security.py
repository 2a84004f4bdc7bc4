"""Who can reach a cluster: a local one listens on loopback only, its processes talk TLS with
credentials made for it, its dashboard takes websockets from its own origin only; joining a
TLS cluster checks dask's TLS settings first, so a mistake is one line naming the keys."""

from __future__ import annotations

import os
import re
import ssl
from typing import Any

import dask
from distributed import Security, Worker
from tornado import web
from tornado.routing import HostMatches, Rule

from cluster.spec import LOOPBACK
from pipeline.errors import ClusterError

ORIGIN_KEY = "distributed.scheduler.dashboard.bokeh-application.allow_websocket_origin"
"""dask config that bokeh reads when the dashboard is attached (distributed's default: "*")."""
CA_KEY = "distributed.comm.tls.ca-file"
CERT_KEY = "distributed.comm.tls.client.cert"
KEY_KEY = "distributed.comm.tls.client.key"
TLS_FIX = (
    f"set {CA_KEY}, {CERT_KEY} and {KEY_KEY} to PEM files (the cluster's CA certificate, a "
    "certificate it signed, that certificate's key) in a dask config file or as "
    "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, ..._CLIENT__CERT and ..._CLIENT__KEY "
    "(docs/cluster.md, 'Joining a TLS cluster')"
)


class LoopbackWorker(Worker):
    """The in-process worker: given no dashboard address, distributed binds a worker's HTTP
    server (health, metrics) on every interface; this one binds it on loopback (and, as every
    worker of a local cluster, refuses foreign Host headers there: cluster.worker_hosts)."""

    def __init__(self, *args: Any, dashboard_address: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, dashboard_address=dashboard_address or f"{LOOPBACK}:0", **kwargs)


def dashboard_origins(host: str, port: int, configured: list[str]) -> list[str]:
    """The Origin values (host:port) of the dashboard's own pages under each loopback name,
    and those the user added to ``ORIGIN_KEY`` (a proxy's); its default "*" (any) is dropped."""
    names = dict.fromkeys([host or LOOPBACK, LOOPBACK, "localhost"])
    own = [f"{name}:{port}" for name in names]
    return own + [origin for origin in configured if origin != "*" and origin not in own]


def refuse_foreign_hosts(application: Any, origins: list[str]) -> None:
    """Answer 403 to any request to ``application`` whose Host header names a host none of
    ``origins`` has. A page served under a name that resolves to 127.0.0.1 (DNS rebinding)
    is same-origin to the browser and to tornado's websocket check; its Host header is not."""
    names = dict.fromkeys(origin.rsplit(":", 1)[0] for origin in origins)
    pattern = "(?!(?:" + "|".join(re.escape(name) for name in names) + ")$).*"
    router = application.default_router
    rule = router.process_rule(Rule(HostMatches(pattern), [(r".*", _ForeignHost)]))
    router.rules.insert(0, rule)  # before every route, bokeh's included


class _ForeignHost(web.RequestHandler):
    def prepare(self) -> None:
        raise web.HTTPError(403, "Host %s is not this server's", self.request.host)


def check_tls_config(address: str) -> None:
    """Refuse, before connecting, a TLS setup that cannot work: a tls:// address without
    dask's TLS settings, a file they name that can't be read or loaded, or encryption
    required of a tcp:// address. ClusterError (exit 2) naming the keys and the fix."""
    from distributed.comm.addressing import parse_address

    if dask.config.get("distributed.client.security-loader", None):
        return  # a loader configured by the user supplies the credentials
    scheme = parse_address(address)[0]
    if scheme != "tls":
        if dask.config.get("distributed.comm.require-encryption", False):
            raise ClusterError(
                f"distributed.comm.require-encryption is true but the scheduler address "
                f"{address} is {scheme}://; give its tls:// address, or unset the key"
            )
        return
    missing = [key for key in (CA_KEY, CERT_KEY) if not dask.config.get(key, None)]
    if missing:
        raise ClusterError(
            f"{address} is a TLS scheduler but dask config has no {' and no '.join(missing)}; "
            + TLS_FIX
        )
    for key in (CA_KEY, CERT_KEY, KEY_KEY):
        _check_readable(key, dask.config.get(key, None))
    try:
        Security().get_connection_args("client")
    except (ssl.SSLError, ValueError, OSError) as e:
        raise ClusterError(
            f"the TLS files in dask config do not load ({e}); {CA_KEY}, {CERT_KEY} and "
            f"{KEY_KEY} must be PEM files, the key the certificate's own"
        ) from e


def connect_hint(address: str) -> str:
    """What to check when connecting to ``address`` failed."""
    if address.startswith("tls://"):
        return (
            "check the address, that `dask scheduler` is running there, and that "
            f"{CA_KEY} is the cluster's CA and {CERT_KEY} a certificate it signed"
        )
    return (
        "check the address and that `dask scheduler` is running there (a scheduler that "
        "uses TLS has a tls:// address)"
    )


PEM_MAX_BYTES = 1 << 20
"""A certificate chain or key holds a few KiB; more is not one."""


def _check_readable(key: str, value: str | None) -> None:
    if not value or "\n" in value:  # unset (the key may sit in the cert file), or PEM text
        return
    from pipeline.store.options_file import read_small_file

    try:  # opened non-blocking, regular files only: a FIFO there would hang ssl's own open
        read_small_file(value, PEM_MAX_BYTES)
    except OSError as e:
        raise ClusterError(
            f"{key} is {value}, which cannot be read ({e.strerror}); " + TLS_FIX
        ) from e
    except ValueError as e:  # a FIFO, a device, a folder, or more than a PEM file holds
        problem = "cannot be read (Is a directory)" if os.path.isdir(value) else str(e)
        raise ClusterError(f"{key} is {value}, which {problem}; " + TLS_FIX) from e

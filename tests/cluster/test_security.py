"""Nothing exposed: a local cluster's listeners are on loopback (real sockets),
its processes refuse peers without its temporary TLS credentials, its dashboard takes
websockets from its own origin and requests for its own host names only."""

from __future__ import annotations

import contextlib
import operator
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from distributed import Client, Security

from cluster.lifecycle import start
from cluster.security import dashboard_origins
from cluster.spec import ClusterSpec

GiB = 2**30
LOOPBACK = {"127.0.0.1", "::1"}


def listening() -> set[tuple[int, str, int]]:
    """(pid, ip, port) of every listening inet socket of this process and its children."""
    me = psutil.Process()
    found: set[tuple[int, str, int]] = set()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a child may be gone already
            found |= {
                (process.pid, c.laddr.ip, c.laddr.port)
                for c in process.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
    return found


@dataclass
class Local:
    client: Client
    workers: int
    opened: set[tuple[int, str, int]]
    """The listeners that appeared while the cluster started."""
    dashboard_port: int


def status_page(port: int, host: str = "127.0.0.1") -> tuple[int, str]:
    """(HTTP status, body) of /status, asked for under ``host`` (the Host header)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/status", headers={"Host": f"{host}:{port}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def wait_for_dashboard(port: int) -> str:
    """The /status page, once bokeh is attached (in a thread, after the cluster started)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, page = status_page(port)
        if status == 200:
            return page
        time.sleep(0.1)
    raise TimeoutError(f"the dashboard on port {port} never answered /status")


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "two-processes"])
def local(request: pytest.FixtureRequest) -> Iterator[Local]:
    """The cluster `multiply` starts: one worker in this process, or two worker processes."""
    before = listening()
    spec = ClusterSpec(workers=request.param, threads_per_worker=1, dashboard_address=":0")
    with start(spec, 2 * GiB) as client:
        client.wait_for_workers(request.param, timeout=60)
        assert client.submit(operator.add, 1, 1).result() == 2
        port = client.scheduler_info()["services"]["dashboard"]
        wait_for_dashboard(port)
        yield Local(client, request.param, listening() - before, port)


def test_every_listener_is_on_loopback(local: Local) -> None:
    assert {ip for _, ip, _ in local.opened} <= LOOPBACK, sorted(local.opened)
    # the listing holds the known servers: the dashboard and each worker's HTTP server
    # (distributed binds the in-process worker's on every interface unless told)
    ports = {port for _, _, port in local.opened}
    workers = local.client.scheduler_info()["workers"].values()
    http = {worker["services"]["dashboard"] for worker in workers}
    assert len(http) == local.workers
    assert {local.dashboard_port, *http} <= ports, (sorted(local.opened), http)
    address = local.client.scheduler.address
    if local.workers == 1:  # the in-process transport: no scheduler or worker socket
        assert address.startswith("inproc://")
        assert len(local.opened) == 2, sorted(local.opened)
    else:
        assert address.startswith("tls://127.0.0.1:")
        assert int(address.rsplit(":", 1)[1]) in ports


@pytest.mark.parametrize(
    ("scheme", "security"),
    [
        # plain TCP, as any client on the host would try first
        ("tcp", None),
        # TLS with credentials of its own, not the cluster's
        ("tls", "foreign"),
    ],
)
def test_processes_refuse_peers_without_the_credentials(
    local: Local, scheme: str, security: str | None
) -> None:
    if local.workers == 1:
        pytest.skip("one worker: in-process transport, no port to connect to")
    address = local.client.scheduler.address.replace("tls://", f"{scheme}://")
    credentials = Security.temporary() if security else None
    with pytest.raises((OSError, TimeoutError)):
        Client(address, security=credentials, timeout=3)
    # the cluster's own credentials still get in (the fixture's client holds them)
    with Client(local.client.scheduler.address, security=local.client.security) as own:
        assert own.submit(operator.mul, 6, 7).result() == 42


def upgrade(port: int, path: str, origin: str, host: str, protocol: str | None) -> str:
    """The status line a websocket upgrade request gets, sent as a browser would."""
    headers = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        f"Origin: {origin}",
        *([f"Sec-WebSocket-Protocol: {protocol}"] if protocol else []),
    ]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        return sock.recv(4096).split(b"\r\n", 1)[0].decode()


@pytest.mark.parametrize(
    ("origin", "host", "accepted"),
    [
        # the dashboard's own page, under either loopback name
        ("http://127.0.0.1:{port}", "127.0.0.1:{port}", True),
        ("http://localhost:{port}", "localhost:{port}", True),
        # a page from elsewhere open in the browser during the job
        ("http://evil.example", "127.0.0.1:{port}", False),
        ("https://evil.example:{port}", "127.0.0.1:{port}", False),
        # another server on this host (another user's, or a local app)
        ("http://127.0.0.1:{other}", "127.0.0.1:{port}", False),
        # DNS rebinding: evil.example resolves to 127.0.0.1, so Origin and Host agree
        ("http://evil.example:{port}", "evil.example:{port}", False),
    ],
)
def test_dashboard_websocket_takes_its_own_origin_only(
    local: Local, origin: str, host: str, accepted: bool
) -> None:
    port = local.dashboard_port
    names = {"port": port, "other": port + 1}
    # bokeh's websocket wants the session token of the page it serves, as a browser sends it
    token = re.search(r'\\?"token\\?": ?\\?"([\w.-]+)', wait_for_dashboard(port))
    assert token, "no session token in /status"
    status = upgrade(
        port, "/status/ws", origin.format(**names), host.format(**names), f"bokeh, {token[1]}"
    )
    assert status.split(" ")[1] == ("101" if accepted else "403"), status


def test_dashboard_refuses_other_host_names(local: Local) -> None:
    # a page served under another name that resolves here reads nothing (DNS rebinding)
    assert status_page(local.dashboard_port, host="evil.example")[0] == 403
    assert status_page(local.dashboard_port, host="localhost")[0] == 200
    eventstream = upgrade(
        local.dashboard_port, "/eventstream", "http://evil.example", "127.0.0.1", None
    )
    assert eventstream.split(" ")[1] == "403", eventstream


@pytest.mark.parametrize(
    ("host", "configured", "want"),
    [
        # distributed's default, any origin, is not kept
        ("127.0.0.1", ["*"], ["127.0.0.1:8787", "localhost:8787"]),
        # another loopback address the dashboard was given
        ("127.0.0.2", ["*"], ["127.0.0.2:8787", "127.0.0.1:8787", "localhost:8787"]),
        # an origin the user added in dask config (a proxy in front of the dashboard)
        ("localhost", ["hub.example:443"], ["localhost:8787", "127.0.0.1:8787", "hub.example:443"]),
    ],
)
def test_dashboard_origins(host: str, configured: list[str], want: list[str]) -> None:
    assert dashboard_origins(host, 8787, configured) == want

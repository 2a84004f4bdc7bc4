"""The workers' HTTP servers of a local cluster we start (/health, /metrics, ...) answer only
requests naming a loopback host, as the dashboard does: DNS rebinding can't read them."""

from __future__ import annotations

import operator
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import dask
import pytest
from distributed import Client

from cluster.lifecycle import local_config, start
from cluster.spec import ClusterSpec
from cluster.worker_hosts import PRELOAD

GiB = 2**30


def get(port: int, path: str, host: str) -> int:
    """The HTTP status of ``path`` on 127.0.0.1:``port``, asked for under ``host``."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "two-processes"])
def local(request: pytest.FixtureRequest) -> Iterator[Client]:
    """The cluster `multiply` starts: one worker in this process, or two worker processes."""
    spec = ClusterSpec(workers=request.param, threads_per_worker=1, dashboard_address=":0")
    with start(spec, 2 * GiB) as client:
        client.wait_for_workers(request.param, timeout=60)
        assert client.submit(operator.add, 1, 1).result() == 2
        yield client


def http_ports(client: Client) -> list[int]:
    workers = client.scheduler_info()["workers"].values()
    return [int(worker["services"]["dashboard"]) for worker in workers]


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:{port}", 200),  # as bound
        ("localhost:{port}", 200),  # the other loopback name
        ("localhost", 200),  # no port
        ("evil.example:{port}", 403),  # a rebound name: refused
        ("evil.example", 403),
        ("127.0.0.1.evil.example:{port}", 403),  # a name that only starts like ours
    ],
)
@pytest.mark.parametrize("path", ["/health", "/metrics", "/sitemap.json", "/nothing-here"])
def test_worker_http_servers_refuse_foreign_hosts(
    local: Client, host: str, status: int, path: str
) -> None:
    ports = http_ports(local)
    assert ports
    for port in ports:
        expected = 404 if status == 200 and path == "/nothing-here" else status
        assert get(port, path, host.format(port=port)) == expected, (port, path, host)


def test_a_restarted_worker_is_guarded_too(local: Client) -> None:
    if len(local.scheduler_info()["workers"]) == 1:
        pytest.skip("the in-process worker has no nanny to restart it")
    local.restart(timeout=60)
    local.wait_for_workers(2, timeout=60)
    for port in http_ports(local):
        assert get(port, "/health", "evil.example") == 403
        assert get(port, "/health", f"127.0.0.1:{port}") == 200


@pytest.mark.parametrize(
    ("preload", "argv", "want_preload", "want_argv"),
    [
        ([], [], [PRELOAD], None),  # distributed's defaults
        (["mine"], ["--x"], ["mine", PRELOAD], None),  # one argv for all: ours ignores it
        ("mine", [["--x"]], ["mine", PRELOAD], [["--x"], []]),  # one argv list per preload
        ([PRELOAD], [], None, None),  # already there: unchanged
    ],
)
def test_the_guard_is_added_to_the_users_preloads(
    preload: Any, argv: Any, want_preload: Any, want_argv: Any
) -> None:
    given = {"distributed.worker.preload": preload, "distributed.worker.preload-argv": argv}
    with dask.config.set(given):
        config = local_config()
    assert config.get("distributed.worker.preload") == want_preload
    assert config.get("distributed.worker.preload-argv") == want_argv
    assert config["distributed.worker.memory.spill"] is False  # the rest is kept

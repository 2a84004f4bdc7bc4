"""cluster.spec.local_cluster_options: the pure mapping of a ClusterSpec onto cluster kwargs."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.spec import ClusterSpec, local_cluster_options, split_dashboard_address
from pipeline.errors import UsageError

GiB = 2**30


@pytest.mark.parametrize(
    ("workers", "threads", "gpus", "cpus", "want"),
    [
        # GPUs visible: one worker per GPU, one thread each
        (None, None, 1, 8, ("cuda", 1, 1)),
        (None, None, 4, 32, ("cuda", 4, 1)),
        # fewer workers than GPUs asked for: honoured
        (2, None, 4, 32, ("cuda", 2, 1)),
        # more workers than GPUs asked for: capped at one per GPU
        (8, None, 2, 32, ("cuda", 2, 1)),
        (3, None, 1, 2, ("cuda", 1, 1)),
        # threads per GPU worker passed through
        (None, 4, 2, 32, ("cuda", 2, 4)),
        # no GPU: one CPU worker gets every core
        (None, None, 0, 8, ("cpu", 1, 8)),
        (None, None, 0, 1, ("cpu", 1, 1)),
        # CPU workers split the cores between them (floor division)
        (2, None, 0, 8, ("cpu", 2, 4)),
        (3, None, 0, 8, ("cpu", 3, 2)),
        # more workers than cores: still at least one thread each
        (4, None, 0, 2, ("cpu", 4, 1)),
        # explicit threads win over the split
        (2, 3, 0, 8, ("cpu", 2, 3)),
        # a negative GPU count (no driver) is treated as no GPU
        (None, None, -1, 4, ("cpu", 1, 4)),
    ],
)
def test_workers_and_threads(
    workers: int | None, threads: int | None, gpus: int, cpus: int, want: tuple[str, int, int]
) -> None:
    spec = ClusterSpec(workers=workers, threads_per_worker=threads)
    kind, options = local_cluster_options(spec, gpus, cpus)
    assert (kind, options["n_workers"], options["threads_per_worker"]) == want
    if kind == "cuda":
        assert options["n_workers"] <= gpus
    # GPU workers and several CPU workers: a process each (own GIL, own CUDA context);
    # a lone CPU worker runs in-process (no spawn, no pickling of tiles)
    in_process = kind == "cpu" and options["n_workers"] == 1
    assert options.get("processes", True) is not in_process


@pytest.mark.parametrize(
    ("limit", "gpus", "want"),
    [
        # default: let distributed split the host's memory
        (None, 0, "auto"),
        (None, 2, "auto"),
        # bytes passed through unchanged, CPU and GPU
        (4 * GiB, 0, 4 * GiB),
        (123_456_789, 2, 123_456_789),
    ],
)
def test_memory_limit_passthrough(limit: int | None, gpus: int, want: Any) -> None:
    _, options = local_cluster_options(ClusterSpec(), gpus, 8, limit)
    assert options["memory_limit"] == want


@pytest.mark.parametrize(("gpus", "workers"), [(0, 1), (0, 2), (1, 1), (4, None)])
@pytest.mark.parametrize(
    ("dashboard", "bound"),
    [
        # the CLI's default (test_the_cli_default_dashboard_is_loopback_8787 ties the two)
        ("127.0.0.1:8787", "127.0.0.1:8787"),
        # a random free port, as tests pass
        ("127.0.0.1:0", "127.0.0.1:0"),
        # no host: loopback, not distributed's every interface
        (":0", "127.0.0.1:0"),
        ("localhost:8787", "localhost:8787"),
    ],
)
def test_listens_on_loopback_only(
    gpus: int, workers: int | None, dashboard: str, bound: str
) -> None:
    spec = ClusterSpec(workers=workers, dashboard_address=dashboard)
    _, options = local_cluster_options(spec, gpus, 4)
    assert options["dashboard_address"] == bound
    assert options["worker_dashboard_address"] is None  # no bokeh pages on the workers
    assert options["scheduler_kwargs"] == {"dashboard": False}  # attached for its own origin
    if options.get("processes", True):
        # several processes: loopback, and TLS with credentials made for this cluster
        assert (options["host"], options["protocol"]) == ("127.0.0.1", "tls://")
        assert options["security"] is True
    else:  # in-process transport: no scheduler or worker socket, and no TLS to need
        assert "host" not in options and "security" not in options


def test_default_spec_starts_a_local_cluster_on_loopback() -> None:
    spec = ClusterSpec()
    assert spec.scheduler is None
    assert spec.dashboard_address.startswith("127.0.0.1:")


@pytest.mark.parametrize(
    ("address", "message"),
    [
        # not HOST:PORT
        ("nonsense", r"'nonsense' is not HOST:PORT"),
        ("8787", r"'8787' is not HOST:PORT"),
        ("127.0.0.1:", r"is not HOST:PORT"),
        ("127.0.0.1:http", r"is not HOST:PORT"),
        # a port out of range
        ("127.0.0.1:65536", r"a port from 0 to 65535"),
        # IPv6 (distributed's dashboard takes none) and lists
        ("[::1]:8787", r"an IPv4 address or a name"),
        ("127.0.0.1:0,127.0.0.1:1", r"is not HOST:PORT"),
        # off loopback: every interface, a LAN address, a name
        ("0.0.0.0:8787", r"not on loopback: .* ssh -L 8787:127.0.0.1:8787 HOST"),
        ("10.0.0.1:0", r"not on loopback"),
        ("node1.example:8787", r"not on loopback"),
    ],
)
def test_bad_dashboard_addresses_are_refused(address: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ClusterSpec(dashboard_address=address)


@pytest.mark.parametrize(
    ("address", "want"),
    [
        ("127.0.0.1:8787", ("127.0.0.1", 8787)),
        (":0", ("", 0)),
        ("localhost:65535", ("localhost", 65535)),
        ("127.1.2.3:80", ("127.1.2.3", 80)),
    ],
)
def test_good_dashboard_addresses(address: str, want: tuple[str, int]) -> None:
    assert split_dashboard_address(address) == want
    ClusterSpec(dashboard_address=address)  # accepted


def test_a_joined_cluster_takes_any_dashboard_host() -> None:
    # --dashboard-address shapes only a local cluster: with --scheduler only its form counts
    ClusterSpec(scheduler="tcp://10.0.0.1:8786", dashboard_address="0.0.0.0:8787")
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        ClusterSpec(scheduler="tcp://10.0.0.1:8786", dashboard_address="nonsense")


@pytest.mark.parametrize("command", ["multiply", "gram"])
def test_the_cli_default_dashboard_is_loopback_8787(command: str) -> None:
    """What a local cluster binds when the user names no --dashboard-address: the CLI's
    default, through the spec, not a literal of the test's own."""
    from pipeline.cli.parser import build_parser, parse_args

    operands = ["x.zarr", "g.zarr"] if command == "gram" else ["a.zarr", "b.zarr", "c.zarr"]
    args = parse_args(build_parser(), [command, *operands])
    assert args.dashboard_address == ClusterSpec().dashboard_address
    _, options = local_cluster_options(ClusterSpec(dashboard_address=args.dashboard_address), 0, 4)
    assert options["dashboard_address"] == "127.0.0.1:8787"

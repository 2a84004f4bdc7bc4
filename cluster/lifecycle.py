"""Cluster lifecycles: a local cluster we own and close, or a scheduler we only connect to."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import dask
from dask.system import CPU_COUNT
from distributed import Client

from cluster.dashboard import has_dashboard, quiet_port_change, serve_when_asked
from cluster.handshake import CONNECT_TIMEOUT_S, connect_timeout_s
from cluster.handshake import check_scheduler as probe_scheduler
from cluster.memory import MemoryLimit
from cluster.security import (
    ORIGIN_KEY,
    LoopbackWorker,
    check_tls_config,
    connect_hint,
    dashboard_origins,
    refuse_foreign_hosts,
)
from cluster.spec import (
    WORKER_MEMORY,
    ClusterSpec,
    local_cluster_options,
    split_dashboard_address,
)
from cluster.tuning import keep_freed_memory, nanny_environ, worker_config
from cluster.worker_hosts import PRELOAD
from kernels.backends import driver_gpus
from kernels.constants import CUDA_INSTALL

log = logging.getLogger("pipeline")


def count_gpus() -> int:
    """GPUs this host can give workers, as dask-cuda counts them (CUDA_VISIBLE_DEVICES if set,
    else NVML's count); 0 without dask-cuda, a driver or a device."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return 0  # set but empty hides every GPU (dask-cuda would count one empty name)
    try:
        from dask_cuda.utils import get_n_gpus
    except ImportError:  # a plain install: CPU workers, and a word when GPUs are here
        if seen := driver_gpus():
            log.warning(
                "%d GPU(s) here, but dask-cuda is not installed: the local workers use the CPU "
                "(%s to use the GPUs)",
                seen,
                CUDA_INSTALL,
            )
        return 0
    try:
        return int(get_n_gpus())
    except Exception:  # noqa: BLE001 - no driver, library or device: no GPU
        return 0


@contextlib.contextmanager
def start(spec: ClusterSpec, memory_limit: MemoryLimit | None = None) -> Iterator[Client]:
    """A Client on the cluster the spec asks for; a cluster we started is closed after.

    ``memory_limit`` caps each local worker, read by distributed as ``dask worker
    --memory-limit`` reads it (an existing cluster keeps its own limits).
    """
    if spec.existing:
        with connect(_address(spec)) as client:
            yield client
        return
    kind, options = local_cluster_options(spec, count_gpus(), CPU_COUNT, memory_limit)
    # A failed task reaches the user once, as the job's `error:` line; the workers' own
    # "Compute Failed" log (with a traceback) shows only with --debug.
    debug = log.isEnabledFor(logging.DEBUG)
    options = {**options, "silence_logs": logging.WARNING if debug else logging.CRITICAL}
    if not options.get("processes", True):
        keep_freed_memory()  # the worker is this process
        options["worker_class"] = LoopbackWorker
    if kind == "cuda":
        from dask_cuda import LocalCUDACluster

        with dask.config.set(local_config()), quiet_port_change():
            cluster = LocalCUDACluster(**options)
    else:
        from distributed import LocalCluster

        with dask.config.set(local_config()), quiet_port_change():
            cluster = LocalCluster(**options)
    attach_dashboard(cluster, split_dashboard_address(options["dashboard_address"])[0])
    # The client takes the cluster's TLS credentials (cluster.security) with the cluster.
    with cluster, Client(cluster) as client:
        log.info(
            "started %s with %d worker(s); dashboard: %s",
            type(cluster).__name__,
            len(cluster.workers),
            dashboard_link(client, options["dashboard_address"]),
        )
        yield client


def local_config() -> dict[str, Any]:
    """dask config while a local cluster starts (its nannies and workers keep it): no pause or
    spill, malloc settings, the tick, and every worker's HTTP server refusing foreign Host
    headers (cluster.worker_hosts, preloaded after the user's own preloads)."""
    return {**WORKER_MEMORY, **nanny_environ(), **worker_config(), **_guard_preload()}


def _guard_preload() -> dict[str, Any]:
    """The user's worker preloads with cluster.worker_hosts added (and an empty argument list
    for it when the user gives one list per preload)."""
    preloads = dask.config.get("distributed.worker.preload", None) or []
    preloads = [preloads] if isinstance(preloads, str) else list(preloads)
    if PRELOAD in preloads:
        return {}
    config: dict[str, Any] = {"distributed.worker.preload": [*preloads, PRELOAD]}
    argv = dask.config.get("distributed.worker.preload-argv", None) or []
    if argv and isinstance(argv[0], list | tuple):  # one list per preload
        config["distributed.worker.preload-argv"] = [*argv, []]
    return config


def attach_dashboard(cluster: Any, host: str) -> None:
    """Serve the scheduler's dashboard, loaded at its first request (cluster.dashboard): a job
    nobody watches never imports bokeh. Its websockets take only the dashboard's own origin
    (``host`` or another loopback name, and its port): a page from elsewhere open in the user's
    browser can't drive it; requests naming another host (DNS rebinding) are refused."""
    scheduler = cluster.scheduler
    configured = list(dask.config.get(ORIGIN_KEY, []))
    origins = dashboard_origins(host, scheduler.http_server.port, configured)
    cluster.loop.add_callback(refuse_foreign_hosts, scheduler.http_application, origins)
    if has_dashboard():  # else the link says so
        cluster.loop.add_callback(serve_when_asked, scheduler, origins)


def dashboard_link(client: Client, address: str) -> str:
    """The link on the host the dashboard was bound to (distributed guesses a LAN address)."""
    port = client.scheduler_info().get("services", {}).get("dashboard")
    host = address.rsplit(":", 1)[0] or "127.0.0.1"
    if port is None:
        return "(no dashboard: install bokeh>=3.1)"
    return f"http://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}/status"


def check_scheduler(spec: ClusterSpec) -> None:
    """The scheduler the spec names (if any) answers as a Dask scheduler, within the connect
    timeout: asked before OUT is created, so a wrong address leaves nothing behind."""
    if spec.existing:
        _check_address(_address(spec))


def _address(spec: ClusterSpec) -> str:
    return spec.scheduler or scheduler_address(spec.scheduler_file or "", connect_timeout_s())


def _check_address(address: str) -> None:
    """Refuse an address that does not resolve, TLS settings that cannot work, and a peer
    that does not answer as a Dask scheduler (ClusterError, exit 2)."""
    from distributed.security import Security

    from pipeline.errors import ClusterError

    try:
        _resolve(address)
    except (OSError, ValueError) as e:
        raise ClusterError(
            f"cannot reach the scheduler at {address} ({e}); check the address, "
            "e.g. tcp://HOST:8786"
        ) from e
    check_tls_config(address)
    connection_args = Security().get_connection_args("client")
    probe_scheduler(address, connect_timeout_s(), connection_args)


@contextlib.contextmanager
def connect(address: str) -> Iterator[Client]:
    """Join an existing scheduler; closing the client never shuts the cluster down."""
    from pipeline.errors import ClusterError

    _check_address(address)  # distributed's handshake has no deadline of its own
    timeout_s = connect_timeout_s()
    try:
        client = Client(address, timeout=timeout_s)
    except (OSError, TimeoutError, ValueError) as e:
        raise ClusterError(
            f"cannot reach the scheduler at {address} within {timeout_s:g} s ({e}); "
            + connect_hint(address)
        ) from e
    try:
        log.info("connected to %s; dashboard: %s", address, client.dashboard_link)
        yield client
    finally:
        client.close()


SCHEDULER_FILE_MAX_BYTES = 1 << 16
"""A scheduler file holds a few hundred bytes of JSON; more is not one."""


def scheduler_address(path: str, wait_s: float = CONNECT_TIMEOUT_S) -> str:
    """The address in the scheduler file at ``path`` (``dask scheduler --scheduler-file``),
    waiting up to ``wait_s`` for a scheduler being started beside us to write it."""
    from pipeline.errors import ClusterError
    from pipeline.store.options_file import read_small_file

    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = json.loads(read_small_file(path, SCHEDULER_FILE_MAX_BYTES)[0])
            address = info["address"]
            if isinstance(address, str) and address:
                return address
            raise ValueError("its address is not text")
        except FileNotFoundError:
            problem = "does not exist"
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            problem = f"holds no scheduler address ({type(e).__name__}: {e})"
        if time.monotonic() >= deadline:
            raise ClusterError(
                f"scheduler file {path} {problem} after {wait_s:g} s; start the scheduler with "
                f"`dask scheduler --scheduler-file {path}` (or give --scheduler ADDRESS)"
            )
        time.sleep(0.1)


def _resolve(address: str) -> None:
    """A tcp/tls address without a port or with a host that does not resolve fails now,
    not after the connect timeout."""
    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, location = parse_address(address)
    if scheme in ("tcp", "tls"):
        host, port = parse_host_port(location)
        socket.getaddrinfo(host, port)

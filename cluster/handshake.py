"""Is there a Dask scheduler at an address? Asked with a deadline, before anything is created.

distributed's own connect bounds the TCP connect but not the handshake after it: a service
that accepts the connection and never answers hangs it, and one that answers in another
protocol (HTTP) has its first 8 bytes read as a frame length (``Unable to allocate 3.07
EiB``). Here each step has what is left of one deadline, and whatever answers is told apart
from a Dask scheduler before a Client is made.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import time
from typing import Any

import dask
from dask.utils import parse_timedelta

from cluster.security import connect_hint
from pipeline.errors import ClusterError, NotASchedulerError, UsageError

CONNECT_TIMEOUT_S = 10.0
"""Seconds to reach a scheduler and hear its handshake, unless the user set distributed's
``distributed.comm.timeouts.connect`` (whose default, 30 s, is long to wait for a typo)."""
TIMEOUT_KEY = "distributed.comm.timeouts.connect"
RETRY_S = 0.1
"""Pause between refused connects (a scheduler may be starting beside us)."""


def connect_timeout_s() -> float:
    """CONNECT_TIMEOUT_S, or ``distributed.comm.timeouts.connect`` where the user set it."""
    given = dask.config.get(TIMEOUT_KEY, None)
    shipped = dask.config.get(TIMEOUT_KEY, None, config=dask.config.merge(*dask.config.defaults))
    if given is None or given == shipped:
        return CONNECT_TIMEOUT_S
    try:
        seconds = float(parse_timedelta(given, default="seconds"))
    except (TypeError, ValueError) as e:
        raise UsageError(f"{TIMEOUT_KEY} is {given!r}, not a duration; give one such as 10s") from e
    if seconds <= 0:
        raise UsageError(f"{TIMEOUT_KEY} is {given!r}; give a positive duration such as 10s")
    return seconds


def check_scheduler(address: str, timeout_s: float, connection_args: dict[str, Any]) -> None:
    """Return once a Dask scheduler at ``address`` answered its handshake and an identity
    request within ``timeout_s``; else ClusterError (unreachable) or NotASchedulerError."""
    # A thread of its own: the caller may be running an event loop (a notebook's).
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="scheduler-probe") as pool:
        probe = pool.submit(asyncio.run, _probe(address, timeout_s, connection_args))
        kind = probe.result()
    if kind != "Scheduler":
        raise NotASchedulerError(
            f"{address} is not a Dask scheduler (it is a Dask {kind.lower()}); give the "
            "scheduler's address, the one `dask worker` was started with"
        )


async def _probe(address: str, timeout_s: float, connection_args: dict[str, Any]) -> str:
    """The ``type`` the peer's identity reply names ("Scheduler", "Worker", ...)."""
    deadline = time.monotonic() + timeout_s
    comm = await _reach(address, deadline, timeout_s, connection_args)
    try:
        return await asyncio.wait_for(_identity(comm), max(deadline - time.monotonic(), 0.01))
    except TimeoutError:
        found = f"it took the connection but did not answer Dask's handshake in {timeout_s:g} s"
    except Exception as e:  # noqa: BLE001 - whatever it sent is not Dask's protocol
        # TLS 1.3: a scheduler refuses our certificate after the handshake, by an alert or
        # by closing the stream, seen at the first read
        if _refused_tls(e) or (address.startswith("tls://") and isinstance(e, OSError)):
            raise _unreachable(address, timeout_s, e) from e
        found = f"it answered in another protocol: {_what(e)}"
    finally:
        comm.abort()
    raise NotASchedulerError(
        f"{address} is not a Dask scheduler ({found}); check the address and port: "
        "`dask scheduler` prints it as `Scheduler at: tcp://HOST:8786`"
    )


async def _reach(
    address: str, deadline: float, timeout_s: float, connection_args: dict[str, Any]
) -> Any:
    """A comm to ``address`` before any handshake, connects refused retried to the deadline."""
    from distributed.comm import registry
    from distributed.comm.addressing import parse_address

    scheme, location = parse_address(address)
    connector = registry.get_backend(scheme).get_connector()
    while True:
        left = deadline - time.monotonic()
        try:
            return await asyncio.wait_for(
                connector.connect(location, deserialize=True, **connection_args),
                max(left, 0.01),
            )
        except (OSError, TimeoutError) as e:
            if deadline - time.monotonic() <= RETRY_S or _refused_tls(e):
                raise _unreachable(address, timeout_s, e) from e
        await asyncio.sleep(RETRY_S)


def _unreachable(address: str, timeout_s: float, error: BaseException) -> ClusterError:
    return ClusterError(
        f"cannot reach the scheduler at {address} within {timeout_s:g} s ({_what(error)}); "
        + connect_hint(address)
    )


def _refused_tls(error: BaseException) -> bool:
    """A TLS handshake that failed (an unknown CA, a certificate refused): no retry fixes it.
    distributed keeps the SSLError as a closed stream's ``real_error`` or in the chain."""
    from distributed.comm.core import FatalCommClosedError

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError | FatalCommClosedError):
            return True
        seen = getattr(seen, "real_error", None) or seen.__cause__ or seen.__context__
    return False


async def _identity(comm: Any) -> str:
    """distributed's handshake (as ``distributed.comm.connect`` does it), then ``identity``."""
    from distributed.core import send_recv

    local = comm.handshake_info()
    await comm.write(local)
    remote = await comm.read()
    if not isinstance(remote, dict) or "pickle-protocol" not in remote:
        raise ValueError(f"its handshake is {type(remote).__name__}, not Dask's")
    comm.remote_info, comm.local_info = remote, local
    comm.handshake_options = comm.handshake_configuration(local, remote)
    reply = await send_recv(comm, op="identity")
    kind = reply.get("type") if isinstance(reply, dict) else None
    if not isinstance(kind, str):
        raise ValueError("its identity reply names no type")
    return kind


def _what(error: BaseException) -> str:
    """An error in a few words (a MemoryError's numbers come from the bytes it read)."""
    if isinstance(error, MemoryError):
        return "its reply does not parse as Dask's frames"
    while error.__cause__ is not None:  # distributed wraps the socket's own error
        error = error.__cause__
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

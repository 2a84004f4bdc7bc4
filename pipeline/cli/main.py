"""``python -m pipeline``: a thin layer over the Python API. Errors become one ``error:`` line.
The parser lives in pipeline/cli/parser.py."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any

from cluster.spec import ClusterSpec
from pipeline.cli import stdout
from pipeline.cli.parser import (
    Parser,
    build_parser,
    parse_args,
    parse_storage_options,
    positive_int,
    storage_options,
)
from pipeline.errors import PipelineError
from pipeline.options.declaration import GRAM, MULTIPLY
from pipeline.options.product import options_for
from pipeline.options.spelling import cli_spelling
from pipeline.plan.units import format_bytes
from pipeline.run.progress import StatusHandler
from pipeline.sensitive.text import redact_url, url_secrets
from pipeline.sensitive.values import ScrubLogs, scrub, secret_values, warn_if_exposed

log = logging.getLogger("pipeline")


INTERRUPTED = {
    "multiply": "the tiles written so far are kept: rerun the same command with --resume to "
    "finish OUT",
    "gram": "the tiles written so far are kept: rerun the same command with --resume to finish G",
    "pca": "the finished passes are kept: rerun the same command with --resume to finish OUT",
    "svd": "the finished passes are kept: rerun the same command with --resume to finish OUT",
    "verify": "nothing was changed: rerun the same command to check C",
    "random": "OUT is incomplete: rerun the same command with --overwrite",
    "doctor": "nothing was changed: rerun the same command",
}
"""After ``error: interrupted;``: what a Ctrl-C left behind and what to do, per command."""
LOCATIONS = ("a", "b", "c", "out", "x", "g", "report")
"""The arguments that name arrays or files (paths or URLs, which may hold secrets)."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.command not in ("random", "doctor"):
        # distributed sets its loggers' levels when imported: import it first so ours stick.
        import distributed  # noqa: F401
    # Transient lines ("waiting for the running tasks") give way to the next line: a job that
    # stops early ends with its one error line.
    status = StatusHandler(sys.stderr, show_all=args.debug)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO, format="%(message)s", handlers=[status]
    )
    for noisy in ("distributed", "numba", "asyncio", "fsspec", "bokeh", "tornado"):
        logging.getLogger(noisy).setLevel(logging.WARNING if args.debug else logging.ERROR)
    # A dashboard port taken after dashboard_address() looked: the printed link shows the one used.
    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
    # Passwords and signatures in the URLs given, wherever a message may quote them.
    secrets = {s for name in LOCATIONS for s in url_secrets(str(getattr(args, name, "") or ""))}
    try:
        # Messages keep their flags: the API's doors would name keywords (Python callers').
        with interrupt_once(INTERRUPTED[args.command], status), cli_spelling():
            args.storage_options = storage_options(args)
            secrets |= secret_values(args.storage_options)
            with scrubbed_logs(secrets), stdout.forgiving():  # `--dry-run | head -1`
                return int(COMMANDS[args.command](args))
    except PipelineError as e:
        return _fail(f"error: {e}", e.exit_code, args.debug, secrets, status)
    except KeyboardInterrupt:
        line = f"error: interrupted; {INTERRUPTED[args.command]}"
        return _fail(line, 1, args.debug, secrets, status)
    except Exception as e:  # noqa: BLE001 - unexpected: still one line unless --debug
        line = f"error: {type(e).__name__}: {e}"
        if not args.debug:
            line += " (rerun with --debug for the traceback)"
        return _fail(line, 1, args.debug, secrets, status)


def _fail(line: str, exit_code: int, debug: bool, secrets: set[str], status: StatusHandler) -> int:
    """The ``error:`` line (after the traceback under --debug), secrets hidden, in place of a
    transient line; --debug never changes the exit code."""
    status.clear()
    if debug:
        print(scrub(traceback.format_exc(), secrets), file=sys.stderr, end="")
    print(scrub(line, secrets), file=sys.stderr)
    return exit_code


@contextlib.contextmanager
def scrubbed_logs(secrets: set[str]) -> Iterator[None]:
    """Hide ``secrets`` in whatever the root and distributed's handlers print meanwhile."""
    handlers = [*logging.getLogger().handlers, *logging.getLogger("distributed").handlers]
    scrubber = ScrubLogs(secrets)
    for handler in handlers:
        handler.addFilter(scrubber)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(scrubber)


@contextlib.contextmanager
def interrupt_once(advice: str, status: StatusHandler | None = None) -> Iterator[None]:
    """Ctrl-C ends the command quietly: the first raises KeyboardInterrupt in the main thread
    (the job cleans up and the caller prints one line), a second exits at once.

    Only the main thread takes SIGINT: threads started from now on block it, and so do the
    processes they spawn (Dask's worker processes), which a terminal's Ctrl-C would otherwise
    reach too and make print tracebacks of their own; the client stops them when it closes.
    """
    if threading.current_thread() is not threading.main_thread() or os.name != "posix":
        yield
        return
    seen = False

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal seen
        if seen:
            if status is not None:
                status.clear()
            print(f"error: interrupted again; stopped at once: {advice}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        seen = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    threading.setprofile(_block_sigint)
    try:
        yield
    finally:
        threading.setprofile(None)
        signal.signal(signal.SIGINT, previous)


def _block_sigint(frame: FrameType, event: str, arg: Any) -> None:
    """Profile hook run once at the start of each new thread: block SIGINT there, then go."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    sys.setprofile(None)


def run_multiply(args: argparse.Namespace) -> int:
    from pipeline.api import prepare

    return _run_job(prepare(args.a, args.b, args.out, **_product_options(args, MULTIPLY)), args)


def run_gram(args: argparse.Namespace) -> int:
    from pipeline.gramian import prepare_gram

    job = prepare_gram(args.x, args.g, rows=args.rows, **_product_options(args, GRAM))
    return _run_job(job, args)


def _product_options(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """A product's keyword options from the command line: each declared option's own flag, and
    those built from the command line's own arguments (storage, progress, cluster)."""
    given = {o.name: getattr(args, o.name) for o in options_for(command) if o.cli}
    return given | {
        "storage_options": args.storage_options,
        "progress": not args.no_progress and sys.stderr.isatty(),
        "cluster": _spec(args, probe_dashboard=not args.dry_run),
    }


def _run_job(job: Any, args: argparse.Namespace) -> int:
    """A product's job: print its plan (--dry-run), or run it and print what it did."""
    from pipeline.summary import format_accounting, format_summary

    if args.dry_run:
        if job.options.cluster.existing:  # plan for the cluster at hand
            from cluster.lifecycle import start

            with start(job.options.cluster) as client:
                job = job.for_cluster(client)
        print(redact_url(job.describe()))
        return 0
    result = job.execute()
    print(redact_url(format_accounting(result)))
    print(redact_url(format_summary(result)))
    if result.verified is False:
        what = (
            "G differs from its Gram product" if job.store.symmetric else "OUT differs from A @ B"
        )
        print(
            f"error: verification failed: {what} beyond the tolerance; see "
            "`python -m pipeline verify` for the failing rows",
            file=sys.stderr,
        )
        return 1
    return 0


def run_decomposition(args: argparse.Namespace) -> int:
    """pca and svd: the plan (--dry-run), or the run and a done line."""
    from pipeline.decompose import prepare_decomposition
    from pipeline.summary import format_decomposition

    job = prepare_decomposition(
        args.command, args.x, args.out, components=args.components,
        oversample=args.oversample, power_iterations=args.power_iterations, seed=args.seed,
        scale=getattr(args, "scale", False), rows=args.rows, over=args.over,
        overwrite=args.overwrite, resume=args.resume, storage_options=args.storage_options,
        passes_from=args.passes_from,
        cluster=_spec(args, probe_dashboard=not args.dry_run),
        backend=args.backend, memory_limit=args.memory_limit,
        device_memory_limit=args.device_memory_limit, device_class=args.device_class,
        storage_gbps=args.storage_gbps,
        progress=not args.no_progress and sys.stderr.isatty(),
    )  # fmt: skip
    if args.dry_run:
        print(redact_url(job.describe()))
        return 0
    print(redact_url(format_decomposition(job.execute())))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from cluster.lifecycle import start
    from cluster.scratch_dirs import check_scratch_dirs
    from pipeline.summary import format_verify, format_verify_error
    from pipeline.verify.check import check_shapes, verify_product
    from pipeline.verify.decomposition import is_decomposition
    from pipeline.verify.symmetry import gram_operands

    options = args.storage_options
    if args.c is None and is_decomposition(args.b, options):  # `verify X OUT` of pca or svd
        return _verify_decomposition(args)
    if args.c is None:  # `verify X G`: a Gram product's, as G records it
        args.a, args.b, args.c = gram_operands(args.a, args.b, options)
    given = (args.transpose_a, args.transpose_b)
    check_shapes(args.a, args.b, args.c, options, given)  # refuse before starting a cluster
    spec = _spec(args)
    check_scratch_dirs((args.a, args.b, args.c), spec, ("A", "B", "C"))
    with start(spec, args.memory_limit) as client:
        warn_if_exposed(client, options)
        result = verify_product(
            client,
            args.a,
            args.b,
            args.c,
            options,
            rounds=args.rounds,
            seed=args.seed,
            progress=not args.no_progress and sys.stderr.isatty(),
            transpose_a=args.transpose_a,
            transpose_b=args.transpose_b,
            precision=args.precision,
        )
    print(redact_url(format_verify(result)))
    if not result.passed:
        print(f"error: {redact_url(format_verify_error(result))}", file=sys.stderr)
        return 1
    return 0


def _verify_decomposition(args: argparse.Namespace) -> int:
    from cluster.lifecycle import start
    from pipeline.summary import format_decomposition_check
    from pipeline.verify.decomposition import verify_decomposition

    with start(_spec(args), args.memory_limit) as client:
        warn_if_exposed(client, args.storage_options)
        result = verify_decomposition(client, args.a, args.b, args.storage_options, args.seed)
    print(redact_url(format_decomposition_check(result)))
    if not result.passed:
        print(
            f"error: verification failed: OUT is not a {result.kind} of X within the tolerances "
            "above; recompute it with --overwrite",
            file=sys.stderr,
        )
        return 1
    return 0


def run_random(args: argparse.Namespace) -> int:
    from pipeline.generate import write_random

    options = args.storage_options
    write_random(args.out, args.shape, args.chunks, args.dtype, args.seed, options, args.overwrite)
    return 0


def run_doctor(args: argparse.Namespace) -> int:
    from pipeline.doctor.checks import run_doctor as doctor

    return doctor(args.json, args.require_gpu)


COMMANDS = {
    "multiply": run_multiply,
    "gram": run_gram,
    "pca": run_decomposition,
    "svd": run_decomposition,
    "verify": run_verify,
    "random": run_random,
    "doctor": run_doctor,
}


def _spec(args: argparse.Namespace, probe_dashboard: bool = True) -> ClusterSpec:
    spec = ClusterSpec(  # a bad --dashboard-address is refused here, before any work
        scheduler=args.scheduler,
        scheduler_file=args.scheduler_file,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        dashboard_address=args.dashboard_address,
    )
    if probe_dashboard and not spec.existing:
        probed = dashboard_address(spec.dashboard_address)
        spec = dataclasses.replace(spec, dashboard_address=probed)
    return spec


def dashboard_address(address: str) -> str:
    """HOST:PORT as given, or HOST:0 (any free port) when something listens on PORT already:
    the link printed when the cluster starts shows the port used, without distributed's
    multi-line warning (checked before the inputs, so said only with --debug)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return address
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tornado binds
            probe.bind(where)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return address  # not ours to judge: distributed reports it
        log.debug("dashboard: port %s is in use; using a free port", port)
        return f"{host}:0"
    return address


__all__ = [
    "Parser",
    "build_parser",
    "dashboard_address",
    "format_bytes",
    "main",
    "parse_args",
    "parse_storage_options",
    "positive_int",
]

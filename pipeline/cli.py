"""``python -m pipeline``: a thin layer over the Python API. Errors become one ``error:`` line."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import logging
import os
import re
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

from cluster.spec import ClusterSpec
from kernels.backends import CHOICES
from pipeline.errors import PipelineError, UsageError
from pipeline.plan.units import format_bytes, parse_size

log = logging.getLogger("pipeline")


INTERRUPTED = {
    "multiply": "the tiles written so far are kept: rerun the same command with --resume to "
    "finish OUT",
    "verify": "nothing was changed: rerun the same command to check C",
    "random": "OUT is incomplete: rerun the same command with --overwrite",
}
"""After ``error: interrupted;``: what a Ctrl-C left behind and what to do, per command."""


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit code 2, with a
    suggestion for a misspelled choice."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}{_suggest_choice(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m pipeline",
        description="Multiply Zarr matrices on a Dask cluster (GPU kernels or CPU BLAS).",
    )
    parser.add_argument("-v", "--debug", action="store_true", help="tracebacks and debug logs")
    # Also accepted after the subcommand (`multiply A B OUT --debug`), as error lines suggest;
    # SUPPRESS keeps a subcommand from resetting a -v given before it.
    common = Parser(add_help=False)
    common.add_argument(
        "-v",
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="tracebacks and debug logs (also accepted before the command)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    mul = sub.add_parser("multiply", help="OUT = A @ B", parents=[common])
    mul.add_argument("a", metavar="A", help="path or fsspec URL of a 2-D Zarr array")
    mul.add_argument("b", metavar="B", help="path or fsspec URL of a 2-D Zarr array")
    mul.add_argument("out", metavar="OUT", help="where to write the product (Zarr v3)")
    mul.add_argument(
        "--backend",
        choices=CHOICES,
        default="auto",
        help="auto: cuda where every worker sees a GPU, else cpu; cublas: cuBLAS through CuPy",
    )
    _cluster_args(mul)
    mul.add_argument(
        "--device-memory-limit",
        type=_size,
        metavar="SIZE",
        help="GPU memory per worker for cuda/cublas plans, e.g. 40GiB (default: the device's)",
    )
    write = mul.add_mutually_exclusive_group()
    write.add_argument("--overwrite", action="store_true", help="replace an OUT this tool wrote")
    write.add_argument("--resume", action="store_true", help="finish an interrupted OUT")
    mul.add_argument("--verify", action="store_true", help="check the product (Freivalds)")
    mul.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    mul.add_argument("--report", metavar="FILE.html", help="save distributed's performance report")
    mul.add_argument("--no-progress", action="store_true", help="no progress bar")

    ver = sub.add_parser(
        "verify", help="exit 0 if C == A @ B within floating-point tolerance", parents=[common]
    )
    for name in ("A", "B", "C"):
        ver.add_argument(name.lower(), metavar=name, help="path or fsspec URL of a Zarr array")
    ver.add_argument("--rounds", type=positive_int, default=2, help="random vectors (default 2)")
    ver.add_argument("--seed", type=int, default=0, help="seed of the random vectors")
    _cluster_args(ver)
    ver.add_argument("--no-progress", action="store_true", help="no progress bar")

    rnd = sub.add_parser(
        "random", help="write a random matrix as a Zarr v3 array", parents=[common]
    )
    rnd.add_argument("out", metavar="OUT", help="where to write the array (Zarr v3)")
    rnd.add_argument("--shape", required=True, type=_pair, help="MxN, e.g. 4096x4096")
    rnd.add_argument("--chunks", required=True, type=_pair, help="RxC, e.g. 1024x1024")
    rnd.add_argument("--dtype", default="float32", help="numpy dtype (default float32)")
    rnd.add_argument("--seed", type=int, default=0, help="seed (same seed, same array)")
    rnd.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    rnd.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// and other URLs (repeatable)",
    )
    return parser


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS", help="use this running cluster")
    p.add_argument("--workers", type=positive_int, help="local worker processes")
    p.add_argument("--threads-per-worker", type=positive_int, help="threads per local worker")
    p.add_argument("--memory-limit", type=_size, metavar="SIZE", help="per worker, e.g. 8GiB")
    p.add_argument(
        "--dashboard-address",
        default="127.0.0.1:8787",
        metavar="HOST:PORT",
        help="where the Dask dashboard listens (default 127.0.0.1:8787)",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// and other URLs (repeatable)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.command != "random":
        # distributed sets its loggers' levels when imported: import it first so ours stick.
        import distributed  # noqa: F401
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO, format="%(message)s", stream=sys.stderr
    )
    for noisy in ("distributed", "numba", "asyncio", "fsspec", "bokeh", "tornado"):
        logging.getLogger(noisy).setLevel(logging.WARNING if args.debug else logging.ERROR)
    # A dashboard port taken after dashboard_address() looked: the printed link shows the one used.
    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
    try:
        with interrupt_once(INTERRUPTED[args.command]):
            return int(COMMANDS[args.command](args))
    except PipelineError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"error: interrupted; {INTERRUPTED[args.command]}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - unexpected: still one line unless --debug
        if args.debug:
            raise
        print(
            f"error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, with a suggestion for a misspelled option."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = _subcommands(parser)[args.command]
        options = [o for action in sub._actions for o in action.option_strings]
        sub.error(f"unrecognized arguments: {' '.join(extras)}{_suggest(extras, options)}")
    args.debug = getattr(args, "debug", False)
    return args


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _suggest(tokens: list[str], options: list[str]) -> str:
    """``; did you mean --x?`` for the first option-like token close to one of ``options``."""
    for token in tokens:
        if token.startswith("-"):
            close = difflib.get_close_matches(token.split("=", 1)[0], options, n=1, cutoff=0.6)
            if close:
                return f"; did you mean {close[0]}?"
    return ""


def _suggest_choice(message: str) -> str:
    """``; did you mean 'x'?`` for argparse's "invalid choice: 'y' (choose from ...)"."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if not found:
        return ""
    choices = [c.strip().strip("'") for c in found.group(2).split(",")]
    close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


@contextlib.contextmanager
def interrupt_once(advice: str) -> Iterator[None]:
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
    from pipeline.report import format_accounting, format_summary

    job = prepare(
        args.a,
        args.b,
        args.out,
        backend=args.backend,
        memory_limit=args.memory_limit,
        device_memory_limit=args.device_memory_limit,
        overwrite=args.overwrite,
        resume=args.resume,
        verify=args.verify,
        storage_options=parse_storage_options(args.storage_option),
        progress=not args.no_progress and sys.stderr.isatty(),
        cluster=_spec(args, probe_dashboard=not args.dry_run),
        report=args.report,
    )
    if args.dry_run:
        if args.scheduler:  # plan for the cluster at hand
            from cluster import start

            with start(job.options.cluster) as client:
                job = job.for_cluster(client)
        print(job.describe())
        return 0
    result = job.execute()
    print(format_accounting(result))
    print(format_summary(result))
    if result.verified is False:
        print(
            "error: verification failed: OUT differs from A @ B beyond the tolerance; "
            "see `python -m pipeline verify` for the failing rows",
            file=sys.stderr,
        )
        return 1
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from cluster import start
    from pipeline.report import format_verify, format_verify_error
    from pipeline.verify import check_shapes, verify_product

    options = parse_storage_options(args.storage_option)
    check_shapes(args.a, args.b, args.c, options)  # refuse before starting a cluster
    with start(_spec(args), args.memory_limit) as client:
        result = verify_product(
            client,
            args.a,
            args.b,
            args.c,
            options,
            rounds=args.rounds,
            seed=args.seed,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    print(format_verify(result))
    if not result.passed:
        print(f"error: {format_verify_error(result)}", file=sys.stderr)
        return 1
    return 0


def run_random(args: argparse.Namespace) -> int:
    from pipeline.generate import write_random

    options = parse_storage_options(args.storage_option)
    write_random(args.out, args.shape, args.chunks, args.dtype, args.seed, options, args.overwrite)
    return 0


COMMANDS = {"multiply": run_multiply, "verify": run_verify, "random": run_random}


def parse_storage_options(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings to a dict; true/false/none and numbers become Python values."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option {item!r} is not KEY=VALUE, e.g. anon=true")
        if key == "region":  # s3fs takes the region inside client_kwargs
            out.setdefault("client_kwargs", {})["region_name"] = value
            continue
        out[key] = _scalar(value)
    return out


def _scalar(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _spec(args: argparse.Namespace, probe_dashboard: bool = True) -> ClusterSpec:
    address = args.dashboard_address
    if probe_dashboard and not args.scheduler:
        address = dashboard_address(address)
    return ClusterSpec(
        scheduler=args.scheduler,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        dashboard_address=address,
    )


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


def _pair(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    try:
        m, n = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MxN with two integers") from None
    if m < 0 or n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} has a negative size")
    return m, n


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


__all__ = ["build_parser", "format_bytes", "main"]

"""``python -m pipeline``: a thin layer over the Python API. Errors become one ``error:`` line."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn

from cluster import ClusterSpec
from pipeline.errors import PipelineError, UsageError
from pipeline.units import format_bytes, parse_size

log = logging.getLogger("pipeline")


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m pipeline",
        description="Multiply Zarr matrices on a Dask cluster (GPU kernels or CPU BLAS).",
    )
    parser.add_argument("-v", "--debug", action="store_true", help="tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True)

    mul = sub.add_parser("multiply", help="OUT = A @ B")
    mul.add_argument("a", metavar="A", help="path or fsspec URL of a 2-D Zarr array")
    mul.add_argument("b", metavar="B", help="path or fsspec URL of a 2-D Zarr array")
    mul.add_argument("out", metavar="OUT", help="where to write the product (Zarr v3)")
    mul.add_argument(
        "--backend",
        choices=("auto", "cuda", "cpu", "cublas"),
        default="auto",
        help="auto: cuda where every worker sees a GPU, else cpu; cublas: cuBLAS through CuPy",
    )
    _cluster_args(mul)
    write = mul.add_mutually_exclusive_group()
    write.add_argument("--overwrite", action="store_true", help="replace an OUT this tool wrote")
    write.add_argument("--resume", action="store_true", help="finish an interrupted OUT")
    mul.add_argument("--verify", action="store_true", help="check the product (Freivalds)")
    mul.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    mul.add_argument("--report", metavar="FILE.html", help="save distributed's performance report")
    mul.add_argument("--no-progress", action="store_true", help="no progress bar")

    ver = sub.add_parser("verify", help="exit 0 if C == A @ B within floating-point tolerance")
    for name in ("A", "B", "C"):
        ver.add_argument(name.lower(), metavar=name, help="path or fsspec URL of a Zarr array")
    ver.add_argument("--rounds", type=positive_int, default=2, help="random vectors (default 2)")
    ver.add_argument("--seed", type=int, default=0, help="seed of the random vectors")
    _cluster_args(ver)
    ver.add_argument("--no-progress", action="store_true", help="no progress bar")

    rnd = sub.add_parser("random", help="write a random matrix as a Zarr v3 array")
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
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO, format="%(message)s", stream=sys.stderr
    )
    for noisy in ("distributed", "numba", "asyncio", "fsspec", "bokeh", "tornado"):
        logging.getLogger(noisy).setLevel(logging.WARNING if args.debug else logging.ERROR)
    try:
        return int(COMMANDS[args.command](args))
    except PipelineError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(
            "error: interrupted; rerun with --resume to finish the tiles not yet written",
            file=sys.stderr,
        )
        return 1
    except Exception as e:  # noqa: BLE001 - unexpected: still one line unless --debug
        if args.debug:
            raise
        print(
            f"error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def run_multiply(args: argparse.Namespace) -> int:
    from pipeline.api import multiply
    from pipeline.report import format_plan, format_summary

    options = parse_storage_options(args.storage_option)
    common: dict[str, Any] = {
        "backend": args.backend,
        "memory_limit": args.memory_limit,
        "overwrite": args.overwrite,
        "resume": args.resume,
        "verify": args.verify,
        "storage_options": options,
        "progress": not args.no_progress and sys.stderr.isatty(),
        "cluster": _spec(args),
    }
    if args.dry_run:
        result = multiply(args.a, args.b, args.out, dry_run=True, **common)
        print(format_plan(result.plan))
        return 0
    result = multiply(args.a, args.b, args.out, report=args.report, **common)
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
    with start(_spec(args)) as client:
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


def _spec(args: argparse.Namespace) -> ClusterSpec:
    return ClusterSpec(
        scheduler=args.scheduler,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit_bytes=args.memory_limit,
        dashboard_address=args.dashboard_address,
    )


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

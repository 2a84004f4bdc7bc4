"""The command line's parser: subcommands and options, argparse types (sizes, MxN pairs,
positive integers, KEY=VALUE storage options), and one ``error:`` line with a suggestion for a
misspelled option or choice."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

from kernels.backends import CHOICES, PRECISIONS
from pipeline.errors import UsageError
from pipeline.plan.units import parse_size
from pipeline.sensitive.text import is_sensitive, redact_url
from pipeline.store.options_file import ENV, merged, options_from_env, options_from_file


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit code 2, with a
    suggestion for a misspelled choice."""

    def error(self, message: str) -> NoReturn:
        line = f"error: {message}{_suggest_choice(message)} (see `{self.prog} --help`)"
        self.exit(2, redact_url(line) + "\n")


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
    _product_args(mul, multiply=True)
    gram = sub.add_parser(
        "gram", help="G = Xᵀ X (--rows: X Xᵀ), half the work of a general product", parents=[common]
    )
    gram.add_argument("x", metavar="X", help="path or fsspec URL of a 2-D Zarr array")
    gram.add_argument("g", metavar="G", help="where to write the Gram matrix (Zarr v3)")
    gram.add_argument("--rows", action="store_true", help="G = X Xᵀ (rows by rows)")
    _product_args(gram, multiply=False)

    ver = sub.add_parser(
        "verify", help="exit 0 if C == A @ B within floating-point tolerance", parents=[common]
    )
    for name in ("A", "B", "C"):
        ver.add_argument(name.lower(), metavar=name, help="path or fsspec URL of a Zarr array")
    ver.add_argument("--rounds", type=positive_int, default=2, help="random vectors (default 2)")
    ver.add_argument("--seed", type=seed, default=0, help="seed of the random vectors")
    ver.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the precision C was computed at, for the tolerance (default: as C's attributes "
        "record it; fp32 for a C this tool did not write)",
    )
    _transpose_args(ver, verify=True)
    _cluster_args(ver)
    ver.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (blocks checked, bytes read, ETA)",
    )

    doc = sub.add_parser(
        "doctor", help="what works here (CPU, driver, toolkit, GPUs), what does not, and the fix",
        parents=[common],
    )  # fmt: skip
    doc.add_argument("--json", action="store_true", help="a JSON list of the checks")
    doc.add_argument(
        "--require-gpu", action="store_true", help="exit 1 unless a GPU passes every check"
    )
    doc.set_defaults(storage_option=[], storage_options_file=None)

    rnd = sub.add_parser(
        "random", help="write a random matrix as a Zarr v3 array", parents=[common]
    )
    rnd.add_argument("out", metavar="OUT", help="where to write the array (Zarr v3)")
    rnd.add_argument("--shape", required=True, type=_pair, help="MxN, e.g. 4096x4096")
    rnd.add_argument("--chunks", required=True, type=_pair, help="RxC, e.g. 1024x1024")
    rnd.add_argument("--dtype", default="float32", help="numpy dtype (default float32)")
    rnd.add_argument("--seed", type=seed, default=0, help="seed (same seed, same array)")
    rnd.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    _storage_args(rnd)
    return parser


def _product_args(p: argparse.ArgumentParser, multiply: bool) -> None:
    """A product's options: multiply's, or gram's (no transposes, no accumulation)."""
    p.add_argument(
        "--backend",
        choices=CHOICES,
        default="auto",
        help="auto: cuda where every worker sees a GPU, else cpu; cublas: cuBLAS through CuPy; "
        "emulated: a modelled GPU that does no math (OUT is NaN), for measuring the feed",
    )
    _cluster_args(p)
    p.add_argument(
        "--device-memory-limit",
        type=_size,
        metavar="SIZE",
        help="GPU memory per worker for cuda/cublas plans, e.g. 40GiB (default: the device's)",
    )
    p.add_argument(
        "--gpu-decode",
        action="store_true",
        help="cuda/emulated: copy zstd chunks compressed and decode them on the GPU (nvCOMP on "
        "the workers), not on the host",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32: the dtype's own arithmetic (default); tf32: tensor cores, ~2^-10 relative "
        "per product (cuda, cublas); 3xtf32: three TF32 products per step, float32-class "
        "accuracy (cuda). Tensor precisions take float32 data; the cpu backend refuses them",
    )
    p.add_argument(
        "--dtype",
        metavar="DTYPE",
        help="OUT's dtype, e.g. int64 (default: numpy.result_type of A and B); integer "
        "products that could overflow it are refused",
    )
    p.add_argument(
        "--chunks",
        metavar="RxC",
        help=(
            "OUT's chunks (default: A's row chunk x B's column chunk, grown to 512 per axis "
            "when that makes over 1,024 chunks)"
        ),
    )
    p.add_argument(
        "--shards",
        metavar="RxC",
        help="OUT's Zarr v3 shards, whole chunks each (default: the inputs' shards, if any)",
    )
    if multiply:
        _transpose_args(p)
    write = p.add_mutually_exclusive_group()
    write.add_argument("--overwrite", action="store_true", help="replace an OUT this tool wrote")
    write.add_argument("--resume", action="store_true", help="finish an interrupted OUT")
    if multiply:
        _accumulate_args(p)
    p.add_argument("--verify", action="store_true", help="check the product (Freivalds)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--report", metavar="FILE.html", help="save distributed's performance report")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (tiles, K panels, GFLOP/s, bytes read, ETA)",
    )


def _transpose_args(p: argparse.ArgumentParser, verify: bool = False) -> None:
    for which in ("a", "b"):
        name = which.upper()
        p.add_argument(
            f"--transpose-{which}",
            action="store_true",
            default=None if verify else False,  # verify: None reads C's record
            help=f"C was computed with {name}ᵀ (default: as C's attributes record it)"
            if verify
            else f"multiply by {name}ᵀ, read in place (no transposed copy is written)",
        )


def _accumulate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--accumulate",
        action="store_true",
        help="OUT is an existing C (anyone's Zarr array): C = alpha*A@B + beta*C, each "
        "product added exactly once (retries, kill -9 and --resume included)",
    )
    p.add_argument(
        "--alpha", type=_number, default=1.0, metavar="X", help="OUT = X*A@B (default 1)"
    )
    p.add_argument(
        "--beta",
        type=_number,
        metavar="Y",
        help="with --accumulate: the factor of C's old values (default 1)",
    )


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, e.g. 2 or -0.5") from None


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS", help="use this running cluster")
    p.add_argument("--workers", type=positive_int, help="local worker processes")
    p.add_argument("--threads-per-worker", type=positive_int, help="threads per local worker")
    p.add_argument("--memory-limit", type=_size, metavar="SIZE", help="per worker, e.g. 8GiB")
    p.add_argument(
        "--dashboard-address",
        default="127.0.0.1:8787",
        metavar="HOST:PORT",
        help="where the Dask dashboard listens: a loopback HOST (127.x or localhost) for a "
        "local cluster; PORT 0 picks a free one (default 127.0.0.1:8787)",
    )
    _storage_args(p)


def _storage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// and other URLs (repeatable; overrides the file's and "
        f"${ENV}'s)",
    )
    p.add_argument(
        "--storage-options-file",
        metavar="FILE.json",
        help="fsspec options as a JSON object, to keep keys and secrets off the command line "
        f"(also read from ${ENV}, which the file overrides); values shown anywhere are hidden",
    )


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


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The command's fsspec options: ``$TILEGEMM_STORAGE_OPTIONS``, then
    ``--storage-options-file``, then ``--storage-option``, each overriding the one before."""
    from_file = options_from_file(args.storage_options_file) if args.storage_options_file else {}
    return merged(options_from_env(), from_file, parse_storage_options(args.storage_option))


def parse_storage_options(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings to a dict; true/false/none and numbers become Python values (a
    secret's digits stay a string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            shown = f"'{key}=...'" if sep else repr(item)  # no value: it may be a secret
            raise UsageError(f"--storage-option {shown} is not KEY=VALUE, e.g. anon=true")
        if key == "region":  # s3fs takes the region inside client_kwargs
            out.setdefault("client_kwargs", {})["region_name"] = value
            continue
        out[key] = _scalar(value, numbers=not is_sensitive(key))
    return out


def _scalar(value: str, numbers: bool = True) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    if not numbers:
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


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


def seed(text: str) -> int:
    """argparse type: a random seed, an integer >= 0 (numpy takes no negative seed)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seed: seeds are integers >= 0, e.g. --seed 0"
        )
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None

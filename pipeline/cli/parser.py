"""The command line's parser: subcommands and options (a product's from their declarations in
pipeline.options.product), argparse types (MxN pairs, positive integers, seeds, KEY=VALUE storage
options), and one ``error:`` line with a suggestion for a misspelled option or choice."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from kernels.backends import PRECISIONS
from pipeline.errors import UsageError
from pipeline.options.declaration import GRAM, MULTIPLY, Option
from pipeline.options.product import DECLARED, declared, options_for
from pipeline.plan.layout import parse_pair
from pipeline.sensitive.text import is_sensitive, redact_url
from pipeline.store.options_file import ENV, merged, options_from_env, options_from_file

SCRIPT = "tilegemm"
"""The console command pyproject.toml installs; ``python -m pipeline`` runs the same."""


def program_name() -> str:
    """The command as the user started it, for usage lines and ``--help`` hints."""
    started = os.path.basename(sys.argv[0]) if sys.argv else ""
    return SCRIPT if started == SCRIPT else "python -m pipeline"


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit code 2, with a
    suggestion for a misspelled choice."""

    def error(self, message: str) -> NoReturn:
        line = f"error: {message}{_suggest_choice(message)} (see `{self.prog} --help`)"
        self.exit(2, redact_url(line) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=program_name(),
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
    _product_args(mul, MULTIPLY)
    gram = sub.add_parser(
        "gram", help="G = Xᵀ X (--rows: X Xᵀ), half the work of a general product", parents=[common]
    )
    gram.add_argument("x", metavar="X", help="path or fsspec URL of a 2-D Zarr array")
    gram.add_argument("g", metavar="G", help="where to write the Gram matrix (Zarr v3)")
    gram.add_argument("--rows", action="store_true", help="G = X Xᵀ (rows by rows)")
    _product_args(gram, GRAM)

    for kind, what in (
        ("pca", "principal components of X (randomized, centred; --scale: correlation PCA)"),
        ("svd", "truncated SVD of X as it is (randomized, uncentred)"),
    ):
        _decomposition_args(sub.add_parser(kind, help=what, parents=[common]), kind)

    ver = sub.add_parser(
        "verify",
        help="exit 0 if C == A @ B within floating-point tolerance (`verify X G`: G a Gram "
        "product of X that `gram` wrote)",
        parents=[common],
    )
    for name in ("A", "B"):
        ver.add_argument(name.lower(), metavar=name, help="path or fsspec URL of a Zarr array")
    ver.add_argument(
        "c",
        metavar="C",
        nargs="?",
        help="path or fsspec URL of a Zarr array; left out, B is a Gram product G of A = X "
        "(`verify X G` checks it as `verify X X G`, transposed as G records)",
    )
    ver.add_argument("--rounds", type=positive_int, default=2, help="random vectors (default 2)")
    ver.add_argument("--seed", type=seed, default=0, help="seed of the random vectors")
    ver.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the precision C was computed at, for the tolerance (default: as C's attributes "
        "record it; fp32 for a C this tool did not write)",
    )
    _transpose_args(ver)
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


def _product_args(p: argparse.ArgumentParser, command: str) -> None:
    """A product's options: those pipeline.options.product declares for ``command``, with the
    command line's own (cluster, storage, --dry-run, --no-progress) where --help has always listed
    them."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}  # by the option to add to it
    for option in options_for(command):
        if option.cli:
            group = groups.get(option.name)
            if option.excludes:
                group = group or p.add_mutually_exclusive_group()
                groups[option.excludes] = group
            _add_option(group or p, option)
        for add in _FOLLOWING.get(option.name, ()):
            add(p)
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress line (tiles, K panels, GFLOP/s, bytes read, ETA)",
    )


def _decomposition_args(p: argparse.ArgumentParser, kind: str) -> None:
    """pca's and svd's arguments: the decomposition's own, then the product passes' cluster,
    memory and storage options."""
    p.add_argument("x", metavar="X", help="path or fsspec URL of a 2-D Zarr array")
    p.add_argument("out", metavar="OUT", help="where to write the result (a Zarr group)")
    p.add_argument(
        "--components", "-k", required=True, type=positive_int, metavar="K",
        help="how many components (at most the smaller side of X)",
    )  # fmt: skip
    p.add_argument(
        "--oversample", type=nonnegative_int, metavar="P",
        help="extra sketch columns for accuracy (default 10, as scikit-learn)",
    )  # fmt: skip
    p.add_argument(
        "--power-iterations", type=nonnegative_int, metavar="Q",
        help="power iterations, two passes over X each (default as scikit-learn: 7 when K is "
        "under a tenth of X's smaller side, else 4)",
    )  # fmt: skip
    p.add_argument("--seed", type=seed, default=0, help="seed of the random sketch (default 0)")
    if kind == "pca":
        p.add_argument(
            "--scale", action="store_true",
            help="each variable to unit variance (scikit-learn's StandardScaler) before the PCA",
        )  # fmt: skip
    p.add_argument(
        "--rows", action="store_true",
        help="X's rows are the variables (X is variables x observations, e.g. variants x samples)",
    )  # fmt: skip
    p.add_argument(
        "--over", metavar="DIM",
        help="the observations' dimension by name (the one a covariance sums over): the "
        "other one's entries are the variables",
    )  # fmt: skip
    p.add_argument(
        "--passes-from", choices=("auto", "memory", "storage"), default="auto",
        help="where the passes read X: auto (read once and held in the workers' memory when "
        "it fits half of it, on the CPU backend), memory, or storage (every pass reads X)",
    )  # fmt: skip
    exclusive = p.add_mutually_exclusive_group()
    exclusive.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    exclusive.add_argument(
        "--resume", action="store_true", help="finish an interrupted run (finished passes kept)"
    )
    for name in ("backend", "device_class", "storage_gbps"):
        _add_option(p, declared(name))
    _local_cluster_args(p)
    for name in ("memory_limit", "device_memory_limit"):
        _add_option(p, declared(name))
    _dashboard_arg(p)
    _storage_args(p)
    _dry_run_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress lines")


def _add_option(p: argparse._ActionsContainer, option: Option) -> None:
    """A declared option as an argument: a switch for a bool (off unless given), else a value
    (read by the option's ``parse``, whose UsageError argparse reports as its error line)."""
    if option.const is not None:
        p.add_argument(
            option.flag,
            nargs="?",
            const=option.const,
            default=option.default,
            choices=option.choices,
            metavar=option.metavar,
            help=option.help,
        )
        return
    if isinstance(option.default, bool):
        p.add_argument(option.flag, action="store_true", help=option.help)
        return
    typed: dict[str, Any] = {"type": _argparse_type(option.parse)} if option.parse else {}
    p.add_argument(
        option.flag,
        choices=option.choices,
        default=option.default,
        metavar=option.metavar,
        help=option.help,
        **typed,
    )


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__  # argparse names it in an unexpected error
    return convert


def _transpose_args(p: argparse.ArgumentParser) -> None:
    """verify's: None (not given) reads C's record."""
    for which in ("a", "b"):
        p.add_argument(
            f"--transpose-{which}",
            action="store_true",
            default=None,
            help=f"C was computed with {which.upper()}ᵀ (default: as C's attributes record it)",
        )


def _cluster_args(p: argparse.ArgumentParser) -> None:
    """verify's cluster and storage arguments (a product's come in --help's order)."""
    _local_cluster_args(p)
    _add_option(p, declared("memory_limit"))
    _dashboard_arg(p)
    _storage_args(p)


def _local_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS", help="use this running cluster")
    p.add_argument(
        "--scheduler-file",
        metavar="PATH",
        help="use the running cluster whose scheduler wrote PATH (dask scheduler "
        "--scheduler-file, dask-jobqueue, dask-mpi)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="local worker processes (a dry run without a cluster: the workers to plan for)",
    )
    p.add_argument("--threads-per-worker", type=positive_int, help="threads per local worker")


def _dashboard_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dashboard-address",
        default="127.0.0.1:8787",
        metavar="HOST:PORT",
        help="where the Dask dashboard listens: a loopback HOST (127.x or localhost) for a "
        "local cluster; PORT 0 picks a free one (default 127.0.0.1:8787)",
    )


def _dry_run_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")


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


_FOLLOWING: dict[str, tuple[Callable[[argparse.ArgumentParser], None], ...]] = {
    "backend": (_local_cluster_args,),
    "memory_limit": (_dashboard_arg, _storage_args),
    "verify": (_dry_run_arg,),
}
"""The command line's own arguments of a product, after the declared option each follows."""


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, with a suggestion for a misspelled option."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = _subcommands(parser)[args.command]
        if args.command == GRAM:
            _refuse_for_gram(sub, extras, args.rows)
        if args.command == MULTIPLY:
            _refuse_for_multiply(sub, extras)
        options = [o for action in sub._actions for o in action.option_strings]
        sub.error(f"unrecognized arguments: {' '.join(extras)}{_suggest(extras, options)}")
    args.debug = getattr(args, "debug", False)
    return args


def _refuse_for_gram(sub: argparse.ArgumentParser, extras: list[str], rows: bool) -> None:
    """multiply's options given to gram: what to do instead, not a near-named flag."""
    from pipeline.gramian import NOT_FOR_GRAM, refusal

    given = {token.split("=", 1)[0] for token in extras}
    refused = [name for name in NOT_FOR_GRAM if declared(name).flag in given]
    if refused:
        sub.exit(2, f"error: {refusal(refused, rows)}\n")


def _refuse_for_multiply(sub: argparse.ArgumentParser, extras: list[str]) -> None:
    """gram's own options given to multiply: whose they are, not a near-named flag."""
    given = {token.split("=", 1)[0] for token in extras}
    theirs = [o.flag for o in DECLARED if o.commands == (GRAM,) and o.flag in given]
    if theirs:
        flags = " ".join(theirs)
        over = "; multiply names the summed dimensions with --over" if "--stack" in theirs else ""
        sub.exit(
            2,
            f"error: {flags}: gram's option(s), for G = XᵀX of one X: run `gram X G {flags}`"
            f"{over}\n",
        )


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
    """argparse type: MxN, two integers >= 0 (pipeline.plan.layout's parser, our messages)."""
    try:
        pair = parse_pair(text, "")
    except UsageError:
        pair = None
    if pair is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not MxN with two integers")
    if min(pair) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} has a negative size")
    return pair


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
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

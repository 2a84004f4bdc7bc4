"""Each product option declared once (``ProductOptions``), what a job was asked
(``JobOptions``) and what it did (``MultiplyResult``).

A product option is a field of ``ProductOptions`` whose type is ``Annotated`` with an
``Option``: its default, help, the products that take it and its check. From these come the
command line's arguments of ``multiply`` and ``gram`` and their keywords
(pipeline/cli/parser.py, main.py), the keywords and signatures of ``prepare``, ``multiply``,
``gram`` and ``prepare_gram`` (``takes_options``), ``prepare``'s checks (``checked``) and the
docs (docs/make_cli_reference.py). A new option is its field here, the ``JobOptions`` field
that carries it, and the code that uses it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ForwardRef, TypedDict, TypeVar, cast, get_args, get_type_hints

from numpy.typing import DTypeLike

from cluster.memory import MemoryLimit, parse_limit
from cluster.spec import ClusterSpec
from kernels.backends import CHOICES, PRECISIONS
from pipeline.errors import UsageError
from pipeline.plan.dtypes import parse_dtype
from pipeline.plan.layout import parse_pair
from pipeline.plan.matmul import MatmulPlan
from pipeline.plan.spec import OutputSpec
from pipeline.sensitive.values import SENSITIVE_FIELD, redacted_repr

MULTIPLY = "multiply"
GRAM = "gram"
PREPARE = "prepare"
"""Takes every declared option (``gram`` is ``prepare`` with some of them fixed)."""

Pair = str | Sequence[int]
"""``"RxC"`` or ``(rows, columns)``."""


@dataclass(frozen=True)
class Option:
    """One product option's declaration: the metadata of its ``ProductOptions`` field."""

    default: Any
    help: str
    """The command line's help, and the API's."""
    commands: tuple[str, ...] = (MULTIPLY, GRAM)
    """The products that take it, on the command line and in the API (``prepare``: all)."""
    cli: bool = True
    """A flag of its own (``flag``); False: the API's only, or built by the command line from
    arguments of its own (cluster, storage, progress)."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    """The values taken: argparse's choices, and ``unknown ...; choose ...`` in the API."""
    parse: Callable[[str], Any] | None = None
    """The command line's text to a value as argparse reads it (UsageError: its message)."""
    check: Callable[[Any, str], Any] | None = None
    """``prepare``'s check of a value (and the flag to name): the value used, or UsageError."""
    excludes: str | None = None
    """The option this one can't be given with."""
    carried_by: str | None = None
    """The ``JobOptions`` field that takes the checked value (default: its namesake, if any)."""
    name: str = ""
    """The keyword (the field's name)."""
    annotation: str = ""
    """The keyword's type as written, for signatures."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def parse_number(text: str) -> float:
    """A number from the command line, e.g. 2 or -0.5."""
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number, e.g. 2 or -0.5") from None


def _limit(value: int | float | str | None, flag: str) -> MemoryLimit | None:
    return parse_limit(value, flag)


def _device_limit(value: int | float | str | None, flag: str) -> int | float | None:
    limit = parse_limit(value, flag)
    return None if isinstance(limit, str) else limit  # "auto": the device's own memory


def memory_limit(text: str) -> MemoryLimit | None:
    """--memory-limit's text: a size, a fraction or auto (cluster.memory.parse_limit)."""
    return parse_limit(text, "--memory-limit")


def device_memory_limit(text: str) -> int | float | None:
    """--device-memory-limit's text: a size or a fraction of the device's memory."""
    return _device_limit(text, "--device-memory-limit")


def _dtype(value: DTypeLike | None, flag: str) -> str | None:
    return None if value is None else parse_dtype(value)


def _float(value: float, flag: str) -> float:
    return float(value)


def _cluster(value: ClusterSpec | None, flag: str) -> ClusterSpec:
    return value or ClusterSpec()


class ProductOptions(TypedDict, total=False):
    """``multiply``'s keyword options, in the order --help lists them; ``gram`` takes those
    whose ``commands`` name it."""

    backend: Annotated[
        str,
        Option(
            "auto",
            help="auto: cuda where every worker sees a GPU, else cpu; cublas: cuBLAS through CuPy; "
            "emulated: a modelled GPU that does no math (OUT is NaN), for measuring the feed",
            choices=CHOICES,
        ),
    ]
    memory_limit: Annotated[
        int | float | str | None,
        Option(
            None,
            help="per worker, as dask worker takes it: a size (8GiB), a fraction of the memory "
            "(0.5) or auto (the worker's share by its threads)",
            metavar="LIMIT",
            parse=memory_limit,
            check=_limit,
        ),
    ]
    device_memory_limit: Annotated[
        int | float | str | None,
        Option(
            None,
            help="GPU memory per worker for cuda/cublas plans: a size (40GiB) or a fraction of "
            "the device's (0.8) (default: the device's)",
            metavar="LIMIT",
            parse=device_memory_limit,
            check=_device_limit,
        ),
    ]
    gpu_decode: Annotated[
        bool,
        Option(
            False,
            help="cuda/emulated: copy zstd chunks compressed and decode them on the GPU (nvCOMP on "
            "the workers), not on the host",
        ),
    ]
    precision: Annotated[
        str,
        Option(
            "fp32",
            help="fp32: the dtype's own arithmetic (default); tf32: tensor cores, ~2^-10 relative "
            "per product (cuda, cublas); 3xtf32: three TF32 products per step, float32-class "
            "accuracy (cuda). Tensor precisions take float32 data; the cpu backend refuses them",
            choices=PRECISIONS,
        ),
    ]
    dtype: Annotated[
        DTypeLike | None,
        Option(
            None,
            help="OUT's dtype, e.g. int64 (default: numpy.result_type of A and B); integer "
            "products that could overflow it are refused",
            metavar="DTYPE",
            check=_dtype,
        ),
    ]
    chunks: Annotated[
        Pair | None,
        Option(
            None,
            help="OUT's chunks (default: A's row chunk x B's column chunk, grown to 512 per axis "
            "when that makes over 1,024 chunks)",
            metavar="RxC",
            check=parse_pair,
        ),
    ]
    shards: Annotated[
        Pair | None,
        Option(
            None,
            help="OUT's Zarr v3 shards, whole chunks each (default: the inputs' shards, if any)",
            metavar="RxC",
            check=parse_pair,
        ),
    ]
    transpose_a: Annotated[
        bool,
        Option(
            False,
            help="multiply by Aᵀ, read in place (no transposed copy is written)",
            commands=(MULTIPLY,),
        ),
    ]
    transpose_b: Annotated[
        bool,
        Option(
            False,
            help="multiply by Bᵀ, read in place (no transposed copy is written)",
            commands=(MULTIPLY,),
        ),
    ]
    overwrite: Annotated[
        bool, Option(False, help="replace an OUT this tool wrote", excludes="resume")
    ]
    resume: Annotated[bool, Option(False, help="finish an interrupted OUT")]
    accumulate: Annotated[
        bool,
        Option(
            False,
            help="OUT is an existing C (anyone's Zarr array): C = alpha*A@B + beta*C, each "
            "product added exactly once (retries, kill -9 and --resume included)",
            commands=(MULTIPLY,),
        ),
    ]
    alpha: Annotated[
        float,
        Option(
            1.0,
            help="OUT = X*A@B (default 1)",
            metavar="X",
            parse=parse_number,
            check=_float,
            commands=(MULTIPLY,),
        ),
    ]
    beta: Annotated[
        float | None,
        Option(
            None,
            help="with --accumulate: the factor of C's old values (default 1)",
            metavar="Y",
            parse=parse_number,
            commands=(MULTIPLY,),
        ),
    ]
    verify: Annotated[bool, Option(False, help="check the product (Freivalds)")]
    report: Annotated[
        str | None, Option(None, help="save distributed's performance report", metavar="FILE.html")
    ]
    storage_options: Annotated[
        dict[str, Any] | None,
        Option(
            None, help="fsspec options for A, B and OUT (merged with a zarr.Array's own)", cli=False
        ),
    ]
    progress: Annotated[
        bool,
        Option(
            False,
            help="a progress line on stderr (tiles, K panels, GFLOP/s, bytes read, ETA)",
            cli=False,
        ),
    ]
    cluster: Annotated[
        ClusterSpec | None,
        Option(
            None,
            help="the cluster to start or join when execute() is given no client",
            cli=False,
            check=_cluster,
        ),
    ]


class PrepareOptions(ProductOptions, total=False):
    """``prepare``'s: multiply's, and those set by ``prepare_gram`` only."""

    symmetric: Annotated[
        bool, Option(False, help="op(B) = op(A)ᵀ: set by pipeline.gram", commands=(), cli=False)
    ]


def declarations(options: type) -> tuple[Option, ...]:
    """The ``Option`` of each field of a TypedDict like ``PrepareOptions``, named, in order."""
    hints = get_type_hints(options, include_extras=True)
    found = []
    for name, hint in hints.items():
        option = next(m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Option))
        shown = _written(options.__annotations__[name], get_args(hint)[0])
        found.append(dataclasses.replace(option, name=name, annotation=shown))
    return tuple(found)


def _written(raw: object, kind: object) -> str:
    """A field's type as its source writes it (``DTypeLike | None``, not numpy's long union)."""
    text = raw.__forward_arg__ if isinstance(raw, ForwardRef) else raw
    if isinstance(text, str):
        tree = ast.parse(text, mode="eval").body
        if isinstance(tree, ast.Subscript) and isinstance(tree.slice, ast.Tuple):
            return ast.unparse(tree.slice.elts[0])
    return inspect.formatannotation(kind)


DECLARED = declarations(PrepareOptions)
"""Every product option, in --help's order."""


def options_for(command: str) -> tuple[Option, ...]:
    """The options ``command`` takes: ``MULTIPLY``, ``GRAM`` or ``PREPARE`` (all)."""
    return tuple(o for o in DECLARED if command == PREPARE or command in o.commands)


def declared(name: str) -> Option:
    return next(o for o in DECLARED if o.name == name)


def not_for(command: str) -> tuple[str, ...]:
    """The declared options ``command`` does not take, in order."""
    taken = {o.name for o in options_for(command)}
    return tuple(o.name for o in DECLARED if o.name not in taken)


def checked(given: Mapping[str, object]) -> dict[str, Any]:
    """Every declared option's value as used: as given or its default, in its choices, through
    its check, and not with the option it excludes; UsageError otherwise."""
    values = {o.name: given.get(o.name, o.default) for o in DECLARED}
    for o in DECLARED:
        value = values[o.name]
        if o.choices is not None and value not in o.choices:
            raise UsageError(f"unknown {o.name} {value!r}; choose {', '.join(o.choices)}")
        if o.check is not None:
            values[o.name] = o.check(value, o.flag)
    for o in DECLARED:
        if o.excludes and values[o.name] and values[o.excludes]:
            other = declared(o.excludes).flag
            raise UsageError(f"{o.flag} and {other} exclude each other; pick one")
    return values


def carried(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``JobOptions`` fields that take checked values as they are."""
    fields = {f.name for f in dataclasses.fields(JobOptions)}
    out = {}
    for o in DECLARED:
        target = o.carried_by or (o.name if o.name in fields else None)
        if target is not None:
            out[target] = values[o.name]
    return out


F = TypeVar("F", bound=Callable[..., Any])


def takes_options(command: str, refuses: Iterable[str] = ()) -> Callable[[F], F]:
    """``func(..., **options)`` taking the options ``command`` takes: listed in its signature
    (``help()``, ``inspect.signature``) with their defaults and in its docstring with their
    help, and any other keyword refused with a plain function's TypeError. ``refuses``:
    declared options ``func`` refuses itself, with a message of its own."""

    def decorate(func: F) -> F:
        own = [
            p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD
        ]
        taken = options_for(command)
        known = {p.name for p in own} | {o.name for o in taken} | set(refuses)

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for name in kwargs:
                if name not in known:
                    raise TypeError(
                        f"{func.__name__}() got an unexpected keyword argument {name!r}"
                    )
            return func(*args, **kwargs)

        keywords = [
            inspect.Parameter(
                o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=o.annotation
            )
            for o in taken
        ]
        signature = inspect.signature(func).replace(parameters=[*own, *keywords])
        setattr(call, "__signature__", signature)  # noqa: B010 - not an attribute mypy knows
        listed = (
            textwrap.fill(f"{o.name}={o.default!r}: {o.help}", 100, initial_indent=" " * 8,
                          subsequent_indent=" " * 12)
            for o in taken
        )  # fmt: skip
        # indented as a docstring's lines, which help() dedents
        call.__doc__ = "\n".join([func.__doc__ or "", "", "    Keyword options:", *listed])
        return cast(F, call)

    return decorate


@dataclass(frozen=True)
class JobOptions:
    """What the caller asked for; the one carrier of every option from the CLI or API."""

    backend: str = "auto"
    """A name in kernels.backends, or "auto"."""
    memory_limit: MemoryLimit | None = None
    """Per worker as asked (bytes, a fraction or "auto"): the plan resolves it for its workers
    (cluster.memory), and local workers get it as ``dask worker --memory-limit`` would."""
    device_memory_limit: int | float | None = None
    """Per worker's GPU, bytes or a fraction of the device's memory: GPU plans fit it (None:
    the device's own memory)."""
    gpu_decode: bool = False
    """Stage zstd chunks compressed and decode them on the GPU (staged GPU backends only)."""
    precision: str = "fp32"
    """A name in kernels.backends.PRECISIONS: fp32 (the dtype's own arithmetic), or TF32 /
    3xTF32 tensor cores (float32 data on a GPU backend that lists it)."""
    overwrite: bool = False
    resume: bool = False
    accumulate: bool = False
    """OUT is an existing C: ``C ← α·A·B + β·C``, each product added exactly once."""
    alpha: float = 1.0
    """OUT gets α·A·B (+ β·C with ``accumulate``)."""
    beta: float = 1.0
    """C's old values' factor (``accumulate`` only)."""
    verify: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict, metadata=SENSITIVE_FIELD)
    """fsspec options for A, B and OUT; repr hides secrets."""
    output: OutputSpec = field(default_factory=OutputSpec)
    """OUT's dtype, chunks and shards as asked (None: follow the inputs) and Zarr format."""
    progress: bool = False
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    """The cluster to start or join when ``execute`` is given no client."""
    report: str | None = None
    """Where to save distributed's performance report (HTML), if anywhere."""

    __repr__ = redacted_repr


@dataclass(frozen=True)
class MultiplyResult:
    shape: tuple[int, int]
    dtype: str
    seconds: float
    """Wall time of ``execute``, cluster start-up included."""
    tiles_computed: int
    tiles_skipped: int
    """Tiles a --resume found already written."""
    bytes_read: int
    """Bytes of input elements the tasks read from storage."""
    backend: str
    plan: MatmulPlan
    verified: bool | None = None
    """None when not asked to verify."""
    phases: dict[str, float] = field(default_factory=dict)
    """Thread-seconds the tile tasks spent per phase (product, decode, copy, write, wait)."""
    usage: dict[str, float] = field(default_factory=dict)
    """The worker processes' user and system seconds and page faults during the tiles."""

"""Each product option declared once (``ProductOptions``), and what is built from the
declarations: the keywords and signatures of ``prepare``, ``multiply``, ``gram`` and
``prepare_gram`` (``takes_options``), ``prepare``'s checks (``checked``) and the values
``JobOptions`` carries (``carried``); the command line (pipeline/cli/) and the docs
(docs/make_cli_reference.py) read the same declarations. A new option is its field here, the
``JobOptions`` field that carries it, and the code that uses it."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, TypedDict, TypeVar, cast

from numpy.typing import DTypeLike

from cluster.memory import MemoryLimit, parse_limit
from cluster.spec import ClusterSpec
from kernels.backends import CHOICES, PRECISIONS
from pipeline.errors import UsageError
from pipeline.options import spelling
from pipeline.options.declaration import GRAM, MULTIPLY, PREPARE, Option, Pair, declarations
from pipeline.options.job_options import JobOptions
from pipeline.plan.device_model import DEVICE_CLASSES
from pipeline.plan.dtypes import parse_dtype
from pipeline.plan.layout import parse_pair
from pipeline.plan.standardize import FORMS, MISSING, kinship_form, parse_code, parse_ddof


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


MAX_GBPS = 1e6
"""The most GB/s a storage rate may be (a petabyte a second: anything more is a typo)."""


def gigabytes_per_second(text: str) -> float:
    """A rate in GB/s from the command line, above zero, e.g. 2 or 0.5."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_GBPS:
        raise UsageError(f"{text!r} is not a rate in GB/s above zero and at most {MAX_GBPS:g}")
    return value


def _gbps(value: float | None, flag: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_GBPS:
        raise UsageError(
            f"{flag} takes a rate in GB/s above zero and at most {MAX_GBPS:g}, e.g. 2 or 0.5; "
            f"got {value!r}"
        )
    return float(value)


def _dtype(value: DTypeLike | None, flag: str) -> str | None:
    return None if value is None else parse_dtype(value)


def _kinship(value: bool | str | None, flag: str) -> str | None:
    return kinship_form(value)


def _float(value: float, flag: str) -> float:
    return float(value)


def _dimension_names(value: object, flag: str) -> str | None:
    """``--over``/``--stack``: dimension names as text (``time``, ``lat,lon``)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{flag} takes dimension names, e.g. time or lat,lon; got {value!r}")
    return value


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
    device_class: Annotated[
        str | None,
        Option(
            None,
            help="plan cuda/cublas for this GPU by its vendor figures where the workers' own is "
            "not measured: with --dry-run, size a cluster you don't have (default: the GPU "
            "`doctor` measured and saved here, else the tilegemm.device-class setting); with "
            "--backend auto it plans for cuda",
            choices=tuple(DEVICE_CLASSES),
        ),
    ]
    storage_gbps: Annotated[
        float | None,
        Option(
            None,
            help="GB/s of array data each worker reads from storage (a shared file system or an "
            "object store), and writes unless --write-gbps says, for the plan's time (default: "
            "this host's calibrated local reads and writes)",
            metavar="X",
            parse=gigabytes_per_second,
            check=_gbps,
        ),
    ]
    write_gbps: Annotated[
        float | None,
        Option(
            None,
            help="GB/s of OUT's data each worker writes to storage, for the plan's time "
            "(default: --storage-gbps, else this host's calibrated local writes)",
            metavar="X",
            parse=gigabytes_per_second,
            check=_gbps,
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
    over: Annotated[
        str | None,
        Option(
            None,
            help="the dimension summed over, by name (or names: lat,lon): chooses --transpose-a/-b "
            "(gram: --rows) so each operand's NAME is the one contracted; an N-D field is read in "
            "place as a matrix, NAME one side and its other dimensions, stacked, the other",
            metavar="NAME",
            check=_dimension_names,
        ),
    ]
    stack: Annotated[
        str | None,
        Option(
            None,
            help="the dimensions G is indexed by, by name (lat,lon: stacked in stored order); X's "
            "other dimensions are summed over (as --over names them)",
            metavar="NAMES",
            check=_dimension_names,
            commands=(GRAM,),
        ),
    ]
    ignore_coordinates: Annotated[
        bool,
        Option(
            False,
            help="contract op(A) and op(B) even where the coordinate arrays beside them (xarray's) "
            "differ along the shared dimension (default: refused, naming the first difference)",
            commands=(MULTIPLY,),
        ),
    ]
    center: Annotated[
        bool,
        Option(
            False,
            help="the covariance (np.cov): each variable G is indexed by centred by its mean "
            "over the summed axis, from one pass over X, and G divided by n - ddof",
            commands=(GRAM,),
        ),
    ]
    scale: Annotated[
        bool,
        Option(
            False,
            help="the correlation (np.corrcoef): --center, and each variable scaled to unit "
            "variance (a constant one gives NaN, as in numpy)",
            commands=(GRAM,),
        ),
    ]
    ddof: Annotated[
        int | None,
        Option(
            None,
            help="with --center: G is divided by n - ddof (default 1, as np.cov)",
            metavar="N",
            parse=parse_ddof,
            commands=(GRAM,),
        ),
    ]
    kinship: Annotated[
        bool | str,
        Option(
            False,
            help="a genomic relationship matrix of genotype dosages (0/1/2), each variant (the "
            "summed axis) centred by 2p: standardized (the default; GCTA's): scaled by "
            "1/sqrt(2p(1-p)), G divided by the variants that vary; vanraden (VanRaden's first "
            "method): G = ZZᵀ / (2 sum p(1-p)). X is samples x variants with --rows, else "
            "variants x samples; missing calls are imputed (see --missing)",
            metavar="FORM",
            choices=FORMS,
            const=FORMS[0],
            check=_kinship,
            commands=(GRAM,),
        ),
    ]
    missing: Annotated[
        str | None,
        Option(
            None,
            help="what missing values (NaN, and --missing-code) become in --center, --scale or "
            "--kinship: impute: each its variable's mean over the present values (0 once "
            "standardized; --kinship's default, as plink and sgkit); drop-columns: every "
            "variable holding one is left out (its row and column of G are NaN; a variant is "
            "left out of a kinship) (default: refused)",
            choices=MISSING,
            commands=(GRAM,),
        ),
    ]
    missing_code: Annotated[
        float | None,
        Option(
            None,
            help="a stored value that means missing besides NaN, e.g. -1 for a missing call "
            "(default: NaN only, or X's CF _FillValue when it has one)",
            metavar="V",
            parse=parse_code,
            commands=(GRAM,),
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
        unset = value is None and o.default is None  # an option's default is always taken
        unset |= o.const is not None and isinstance(value, bool)  # --kinship: True, False
        if o.choices is not None and value not in o.choices and not unset:
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


def for_python(func: F) -> F:
    """``func`` as the API's door: its PipelineErrors name keywords (``overwrite=True``), not
    the command line's flags (pipeline.options.spelling)."""
    return spelling.door(func, lambda: DECLARED)


def takes_options(command: str, refuses: Iterable[str] = ()) -> Callable[[F], F]:
    """``func(..., **options)`` taking the options ``command`` takes: listed in its signature
    (``help()``, ``inspect.signature``) with their defaults and in its docstring with their
    help, and any other keyword refused with a plain function's TypeError. ``refuses``:
    declared options ``func`` refuses itself, with a message of its own. Its errors name
    keywords, not flags (``for_python``)."""

    def decorate(func: F) -> F:
        own = [
            p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD
        ]
        taken = options_for(command)
        known = {p.name for p in own} | {o.name for o in taken} | set(refuses)
        python = for_python(func)

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for name in kwargs:
                if name not in known:
                    raise TypeError(
                        f"{func.__name__}() got an unexpected keyword argument {name!r}"
                    )
            return python(*args, **kwargs)

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

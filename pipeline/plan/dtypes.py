"""OUT's dtype and the accumulator's, and the refusal of integer products that could wrap.

Integer sums wrap silently in numpy and in BLAS-less kernels, so an integer (or bool) product is
refused before any work when the worst case the dtypes allow does not fit: every term of
``sum_k a_ik * b_kj`` lies between the smallest and largest product of the two dtypes' extreme
values, so the sum lies between K times those (Python ints: exact). No data is read; the bound
is the dtypes', not the values'. Pure: numpy only.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import InputError, IntegerOverflowError, UsageError

OUT_DTYPES = (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)  # fmt: skip
"""What ``--dtype`` accepts for OUT (Zarr v3 core dtypes; bool only arises as a default)."""
SAFE_INTEGERS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
"""Integer dtypes suggested by a refusal, smallest first."""
FLOAT_EXACT_BITS = 53
"""float64 sums of integers are exact while they stay below 2**53."""


def result_dtype(a_dtype: str, b_dtype: str) -> tuple[str, str]:
    """Default output dtype (``numpy.result_type``) and its accumulator; refuses non-numeric
    dtypes. Does not check integer ranges: ``output_dtypes`` does."""
    for name, dt in (("A", np.dtype(a_dtype)), ("B", np.dtype(b_dtype))):
        if dt.kind not in "biufc":
            raise InputError(
                f"{name} has dtype {dt}, which is not numeric; "
                "convert it to a float, integer or complex dtype"
            )
    out = np.result_type(a_dtype, b_dtype)
    return str(out), accumulator_dtype(str(out))


def accumulator_dtype(out_dtype: str) -> str:
    """The accumulator follows OUT: float16 sums in float32, every other dtype in itself."""
    return "float32" if np.dtype(out_dtype) == np.float16 else str(np.dtype(out_dtype))


def output_dtypes(
    a_dtype: str, b_dtype: str, k: int, requested: str | None = None, check_range: bool = True
) -> tuple[str, str]:
    """(OUT's dtype, the accumulator's) for ``A (.., k) @ B (k, ..)``: ``requested`` (``--dtype``)
    or ``numpy.result_type``; refuses a dtype that drops the inputs' kind (complex to real,
    float to integer) and integer products whose worst case does not fit (``check_range``)."""
    default, _ = result_dtype(a_dtype, b_dtype)
    out = default if requested is None else parse_dtype(requested)
    _check_kind(a_dtype, b_dtype, out)
    if check_range:
        _check_range(a_dtype, b_dtype, k, out, requested is None)
    return out, accumulator_dtype(out)


def parse_dtype(text: object) -> str:
    """``--dtype`` (or anything numpy takes as a dtype) to a name in OUT_DTYPES (native byte
    order)."""
    try:
        name = str(np.dtype(text).name)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        name = ""
    if name not in OUT_DTYPES:
        raise UsageError(
            f"--dtype {text!r} is not an output dtype; choose one of {', '.join(OUT_DTYPES)}"
        )
    return name


def sum_range(a_dtype: str, b_dtype: str, k: int) -> tuple[int, int]:
    """Smallest and largest ``sum_k a_ik * b_kj`` the integer (or bool) dtypes allow."""
    a_lo, a_hi = _int_range(a_dtype)
    b_lo, b_hi = _int_range(b_dtype)
    corners = [a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi]
    return k * min(corners), k * max(corners)


def _int_range(dtype: str) -> tuple[int, int]:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return 0, 1
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _check_kind(a_dtype: str, b_dtype: str, out: str, into_c: bool = False) -> None:
    """OUT (``into_c``: an existing C, whose dtype --accumulate keeps) must hold the product's
    kind: a complex product stays complex, a float one never becomes integer."""
    kinds = {np.dtype(a_dtype).kind, np.dtype(b_dtype).kind}
    kind = np.dtype(out).kind
    what = f"C ({out})" if into_c else f"--dtype {out}"
    if "c" in kinds and kind != "c":
        fix = "accumulate into a complex C" if into_c else "choose complex64 or complex128"
        raise UsageError(
            f"{what} would drop the imaginary part of a {a_dtype} @ {b_dtype} product; {fix}"
        )
    if "f" in kinds and kind in "biu":
        fix = "accumulate into a float C" if into_c else "choose a float dtype (float32 or float64)"
        raise UsageError(
            f"{what} would truncate a {a_dtype} @ {b_dtype} product to integers; {fix}"
        )


def _check_range(a_dtype: str, b_dtype: str, k: int, out: str, default: bool) -> None:
    """Integer and bool inputs: the worst-case sum must fit OUT (and so its accumulator)."""
    if not {np.dtype(a_dtype).kind, np.dtype(b_dtype).kind} <= set("biu"):
        return  # a float or complex input: floats round, they don't wrap
    lo, hi = sum_range(a_dtype, b_dtype, k)
    out_lo, out_hi = _out_range(out)
    if out_lo <= lo and hi <= out_hi:
        return
    asked = f"the default output dtype {out} (numpy.result_type)" if default else f"--dtype {out}"
    holds = f"{_num(out_lo)}..{_num(out_hi)}" if np.dtype(out).kind in "biu" else f"±{out_hi:.4g}"
    raise IntegerOverflowError(
        f"integer overflow: {a_dtype} @ {b_dtype} over K={k:,} can sum to "
        f"{_num(lo)}..{_num(hi)} (K x the extreme products of the dtypes' ranges; no data is "
        f"read), but {asked} holds {holds}; "
        f"{_fix(lo, hi)}"
    )


def _num(x: float) -> str:
    """Exact up to ten digits (int32's range reads whole), then three significant ones."""
    return f"{x:,}" if abs(x) < 10**10 else f"{x:.3g}"


def _out_range(out: str) -> tuple[float, float]:
    dt = np.dtype(out)
    if dt.kind in "biu":
        return _int_range(out)
    top = float(np.finfo(dt).max)
    return -top, top


def _fix(lo: int, hi: int) -> str:
    fits = [d for d in SAFE_INTEGERS if _int_range(d)[0] <= lo and hi <= _int_range(d)[1]]
    exact = f"exact while sums stay below 2**{FLOAT_EXACT_BITS}"
    if fits:
        return f"pass --dtype {fits[0]} (the smallest integer dtype that holds it) or float64"
    return (
        f"no integer dtype holds it: pass --dtype float64 ({exact}), or store the inputs in "
        "narrower integer dtypes when their values allow"
    )


def check_accumulation(
    a_dtype: str, b_dtype: str, k: int, c_dtype: str, alpha: float, beta: float
) -> None:
    """``C ← α·A·B + β·C`` in C's dtype: C must hold the product's kind; an integer C takes
    integral α and β, and α·(the product's worst case) must fit it, as the plain product's
    guard (no data read). C's own values are unknown before they are read: each task checks
    α·P + β·C_old against C's range before writing (pipeline/accumulate/tasks.py)."""
    _check_kind(a_dtype, b_dtype, c_dtype, into_c=True)
    if np.dtype(c_dtype).kind not in "biu":
        return
    for name, x in (("--alpha", alpha), ("--beta", beta)):
        if float(x) != int(x):
            raise UsageError(
                f"{name} {x:g} is not a whole number, and C is {c_dtype}: an integer C takes "
                f"a whole {name} only (or accumulate into a float64 C)"
            )
    lo, hi = sum_range(a_dtype, b_dtype, k)
    scaled = sorted(int(alpha) * x for x in (lo, hi))
    c_lo, c_hi = _int_range(c_dtype)
    if c_lo <= scaled[0] and scaled[1] <= c_hi:
        return
    raise IntegerOverflowError(
        f"integer overflow: {int(alpha)}·({a_dtype} @ {b_dtype} over K={k:,}) can reach "
        f"{_num(scaled[0])}..{_num(scaled[1])} (no data read), but C ({c_dtype}) holds "
        f"{_num(c_lo)}..{_num(c_hi)}; accumulate into a wider C (e.g. int64 or float64)"
    )

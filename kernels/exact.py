"""Exact integer products through float BLAS.

A float sum of integers is exact while every partial sum stays below 2**(significand bits):
whatever order BLAS adds in, with or without FMA, each step is an integer a float holds. So
integer and bool panels are multiplied as floats in K blocks short enough that no partial sum
can reach 2**24 (float32) or 2**53 (float64), and each block's result is added into the
integer accumulator, where it converts exactly. The products are bit for bit numpy's integer
products (whose range the planner has checked). Pure: numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

SIGNIFICAND_BITS = {"float32": 24, "float64": 53}
"""Integers of magnitude up to 2**bits are exact in the float; sums below it too."""
UNLIMITED = 2**62
"""The K block of an all-zero panel: no partial sum ever grows."""
MIN_FLOAT32_BLOCK = 256
"""Shorter float32 K blocks spend more on converting their results than on the product: the
block runs in float64 instead (half the speed, but one pass)."""


def is_integer(dtype: Any) -> bool:
    return np.dtype(dtype).kind in "biu"


def magnitude(dtype: Any) -> int:
    """The largest |x| of an integer or bool dtype."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return 1
    info = np.iinfo(dt)
    return max(-int(info.min), int(info.max))


def panel_dtype(a_dtype: Any, b_dtype: Any, acc_dtype: Any) -> str:
    """The dtype panels are read in: for integer (or bool) inputs into an integer (or bool)
    accumulator, the narrowest float that holds every input value exactly (float32 up to
    16-bit integers, float64 up to 32-bit ones); otherwise the accumulator's own dtype (floats;
    64-bit integers, which no float holds, take numpy's integer product)."""
    acc = np.dtype(acc_dtype)
    if not (is_integer(a_dtype) and is_integer(b_dtype) and is_integer(acc)):
        return str(acc)
    top = max(magnitude(a_dtype), magnitude(b_dtype))
    for name, bits in SIGNIFICAND_BITS.items():
        if top <= 2**bits:
            return name
    return str(acc)


def product_dtype(a_dtype: Any, b_dtype: Any, acc_dtype: Any) -> str:
    """The dtype the product runs in at worst, from the dtypes alone (the planner's view):
    the panels' float, float64 where float32 blocks would be too short for values spanning the
    dtypes, or the accumulator's integer dtype (numpy's integer product, no BLAS)."""
    panels = panel_dtype(a_dtype, b_dtype, acc_dtype)
    exact = panels == "float32" and is_integer(acc_dtype)
    if exact and k_block(panels, magnitude(a_dtype), magnitude(b_dtype)) < MIN_FLOAT32_BLOCK:
        return "float64"
    return panels


def k_block(float_dtype: Any, a_max: int, b_max: int) -> int:
    """The longest K block whose partial sums of ``a·b`` (|a| <= a_max, |b| <= b_max) stay
    below 2**bits of ``float_dtype``: 0 when even one product may not."""
    top = int(a_max) * int(b_max)
    if top == 0:
        return UNLIMITED
    return (2 ** SIGNIFICAND_BITS[np.dtype(float_dtype).name] - 1) // top


def largest(x: NDArray[Any]) -> int:
    """max |x| of an integer-valued panel, as a Python int (0 when empty)."""
    if x.size == 0:
        return 0
    return int(max(abs(float(x.max())), abs(float(x.min()))))


def blocks(panel: Any, a_max: int, b_max: int, k: int) -> tuple[str, int]:
    """(float dtype, K block) for the exact product of panels of the float ``panel`` holding
    integers of at most ``a_max`` and ``b_max`` over ``k``: float32 where blocks of at least
    MIN_FLOAT32_BLOCK stay exact, else float64; ("", 0) where not even float64 holds one
    product (then only an integer product is exact)."""
    if np.dtype(panel) == np.float32:
        k32 = k_block("float32", a_max, b_max)
        if k32 >= min(MIN_FLOAT32_BLOCK, k):
            return "float32", k32
    k64 = k_block("float64", a_max, b_max)
    return ("float64", k64) if k64 >= 1 else ("", 0)


def plan_blocks(a: NDArray[Any], b: NDArray[Any]) -> tuple[str, int] | None:
    """``blocks`` for integer-valued float panels ``a @ b``; None for ("", 0)."""
    panel = "float32" if np.float32 in (a.dtype, b.dtype) else "float64"
    found = blocks(panel, largest(a), largest(b), a.shape[1])
    return found if found[0] else None


def operands(
    a: NDArray[Any], b: NDArray[Any], acc_dtype: Any
) -> tuple[NDArray[Any], NDArray[Any], tuple[str, int]]:
    """Panels into an integer accumulator as the float their exact blocks multiply in, and the
    blocks (``blocks``); integer panels are read as ``panel_dtype`` says (64-bit ones tried in
    float64: their values may be small), float ones are taken to hold integers. Where no
    float holds a product: the panels in ``acc_dtype`` and ("", 0)."""
    if is_integer(a.dtype) and is_integer(b.dtype):
        dtype = panel_dtype(a.dtype, b.dtype, acc_dtype)
        dtype = "float64" if is_integer(dtype) else dtype
    else:
        dtype = np.result_type(*(x.dtype for x in (a, b) if not is_integer(x.dtype))).name
    found = blocks(dtype, largest(a), largest(b), a.shape[1])
    into = found[0] or np.dtype(acc_dtype)
    return a.astype(into, copy=False), b.astype(into, copy=False), found

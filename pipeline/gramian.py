"""Gram matrices: ``G = Xᵀ X`` (``rows=True``: ``X Xᵀ``) at about half the work of a general
product. op(A) = Xᵀ and op(B) = X (or X and Xᵀ), read in place from the one array; only tiles on
and above the diagonal are tasks, each written with its mirror (pipeline.store.mirror), so G
is exactly symmetric."""

from __future__ import annotations

from typing import Any, Unpack

from distributed import Client

from pipeline.api import prepare
from pipeline.errors import UsageError
from pipeline.job import MatmulJob
from pipeline.options.declaration import GRAM
from pipeline.options.job_options import MultiplyResult
from pipeline.options.product import (
    PrepareOptions,
    ProductOptions,
    declared,
    not_for,
    takes_options,
)

NOT_FOR_GRAM = not_for(GRAM)
"""multiply's options that a Gram product does not take: its operands are fixed."""


@takes_options(GRAM, refuses=NOT_FOR_GRAM)
def gram(
    x: Any,
    out: Any,
    *,
    rows: bool = False,
    client: Client | None = None,
    **options: Unpack[ProductOptions],
) -> MultiplyResult:
    """Compute ``out = xᵀ @ x`` (``rows=True``: ``x @ xᵀ``) for a 2-D Zarr array; the options
    are ``multiply``'s that apply."""
    return prepare_gram(x, out, rows=rows, **options).execute(client)


@takes_options(GRAM, refuses=NOT_FOR_GRAM)
def prepare_gram(
    x: Any, out: Any, *, rows: bool = False, **options: Unpack[ProductOptions]
) -> MatmulJob:
    """Validate and plan ``gram`` (no side effects); see ``pipeline.prepare``."""
    refused = [k for k in NOT_FOR_GRAM if k in options]
    if refused:
        flags = ", ".join(declared(k).flag for k in refused)
        raise UsageError(
            f"gram takes no {flags}: G = Xᵀ X (or X Xᵀ with --rows) fixes its operands; use "
            "`multiply` for other products"
        )
    fixed: PrepareOptions = {
        **options,
        "transpose_a": not rows,
        "transpose_b": rows,
        "symmetric": True,
    }
    return prepare(x, x, out, **fixed)

"""Gram matrices: ``G = Xᵀ X`` (``rows=True``: ``X Xᵀ``) at about half the work of a general
product. op(A) = Xᵀ and op(B) = X (or X and Xᵀ), read in place from the one array; only tiles on
and above the diagonal are tasks, each written with its mirror (pipeline.store.mirror), so G
is exactly symmetric."""

from __future__ import annotations

from collections.abc import Sequence
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
INSTEAD = {
    "transpose_a": "Xᵀ is read in place already; for Aᵀ B of two arrays run "
    "`multiply A B OUT --transpose-a`",
    "transpose_b": "--rows reads Xᵀ in place for X Xᵀ; for A Bᵀ of two arrays run "
    "`multiply A B OUT --transpose-b`",
    "ignore_coordinates": "X is contracted with itself, so its coordinates always agree: drop "
    "--ignore-coordinates",
    "accumulate": "to add {g} into an existing C, run `multiply X X C {t} --accumulate` (the "
    "whole product: about twice gram's work)",
    "alpha": "for α·{g} run `multiply X X G {t} --alpha 2` (the whole product: about twice "
    "gram's work), or scale G afterwards",
    "beta": "β·C + {g} for an existing C is `multiply X X C {t} --accumulate --beta 0.5`",
    "symmetric": "G is symmetric already: drop --symmetric",
}
"""For each option gram refuses, what to do instead (``{g}``: the product, ``{t}``: the
transpose that gives it); each in flags, which the API's door respells for Python."""


def refusal(refused: Sequence[str], rows: bool = False) -> str:
    """Why gram takes none of the declared options ``refused``, and what to do instead."""
    g, t = ("X Xᵀ", "--transpose-b") if rows else ("Xᵀ X", "--transpose-a")
    flags = ", ".join(declared(k).flag for k in refused)
    instead = "; ".join(INSTEAD[k].format(g=g, t=t) for k in refused)
    return f"gram takes no {flags}: G = Xᵀ X (or X Xᵀ with --rows) fixes its operands; {instead}"


@takes_options(GRAM, refuses=NOT_FOR_GRAM)
def gram(
    x: Any,
    out: Any,
    *,
    rows: bool = False,
    client: Client | None = None,
    **options: Unpack[ProductOptions],
) -> MultiplyResult:
    """Compute ``out = xᵀ @ x`` (``rows=True``: ``x @ xᵀ``) for a 2-D Zarr array (or a numpy
    or dask array, copied once); the options are ``multiply``'s that apply."""
    return prepare_gram(x, out, rows=rows, **options).execute(client)


@takes_options(GRAM, refuses=NOT_FOR_GRAM)
def prepare_gram(
    x: Any, out: Any, *, rows: bool = False, **options: Unpack[ProductOptions]
) -> MatmulJob:
    """Validate and plan ``gram`` (no side effects); see ``pipeline.prepare``."""
    refused = [k for k in NOT_FOR_GRAM if k in options]
    if refused:
        raise UsageError(refusal(refused, rows))
    fixed: PrepareOptions = {
        **options,
        "transpose_a": not rows,
        "transpose_b": rows,
        "symmetric": True,
    }
    return prepare(x, x, out, **fixed)

"""The operands' orientation from their stored dimension names: A's and B's metadata read
(nothing else) and handed to the pure resolver (pipeline.plan.dimensions) when the product is
asked for by name (``--over``, gram's ``--stack``); otherwise the flags as given."""

from __future__ import annotations

from typing import Any

from pipeline.errors import UsageError
from pipeline.plan import dimensions
from pipeline.plan.dimensions import Orientation
from pipeline.store import inputs
from pipeline.store.fields import stored_names


def orientation(
    urls: tuple[str, str],
    storage_options: dict[str, Any],
    values: dict[str, Any],
) -> Orientation:
    """The transposes (gram: ``--rows``) and N-D splits of ``op(A) @ op(B)``; ``values``: the
    checked options (``over``, ``stack``, the transposes, ``symmetric``)."""
    over, stack, symmetric = values.get("over"), values.get("stack"), values["symmetric"]
    given = (bool(values["transpose_a"]), bool(values["transpose_b"]))
    if stack is not None and not symmetric:
        raise UsageError(
            "--stack names a Gram matrix's variables (gram X G --stack lat,lon); for a product "
            "of two arrays, name the dimensions summed over with --over"
        )
    if over is None and stack is None:
        return dimensions.as_given(given)
    if symmetric:
        x = inputs.open_input(urls[0], storage_options, "X")
        found = dimensions.resolve_gram(stored_names(x), over, stack, rows=given[1])
    else:
        a, b = (inputs.open_input(u, storage_options, n) for u, n in zip(urls, "AB", strict=True))
        names = (stored_names(a), stored_names(b))
        shapes = (tuple(a.shape), tuple(b.shape))
        found = dimensions.resolve_multiply(names, shapes, over, given, same=urls[0] == urls[1])
    if any(split is not None for split in found.splits):
        _check_field_options(values)
    return found


def _check_field_options(values: dict[str, Any]) -> None:
    """What an N-D field read as a matrix does not take (yet)."""
    if values.get("gpu_decode"):
        raise UsageError(
            "--gpu-decode places 2-D chunks on the GPU; an N-D field is read as a matrix on the "
            "host: drop --gpu-decode"
        )
    if values.get("accumulate"):
        raise UsageError(
            "--accumulate does not take N-D fields yet; write the product to a new OUT and add "
            "it to C afterwards"
        )

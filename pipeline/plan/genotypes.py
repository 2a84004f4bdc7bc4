"""Which axis of a genotype matrix holds the variants, by its dimension names: a kinship sums
over the variants, and the names sgkit, plink-derived stores and AnnData give refuse the
orientation that contradicts them (pure)."""

from __future__ import annotations

from pipeline.errors import UsageError

VARIANTS = frozenset(
    ("variants", "variant", "snps", "snp", "sid", "markers", "marker", "loci", "locus", "var")
)
"""Dimension names of the variants: sgkit's, bed-reader's (sid), AnnData's var."""
SAMPLES = frozenset(
    ("samples", "sample", "iid", "individuals", "individual", "subjects", "obs", "cells")
)
"""Dimension names of the samples: sgkit's, bed-reader's (iid), AnnData's obs."""


def check_kinship_orientation(
    names: tuple[str | None, str | None], rows: bool, x_name: str = "X"
) -> None:
    """Refuse a kinship that would sum over what X's dimension names call the samples (or
    index G by what they call the variants): G = XᵀX sums over X's first dimension, --rows
    (G = X·Xᵀ) over its second. Unnamed or other names: the flags stand."""
    summed, indexed = (names[1], names[0]) if rows else names
    wrong = _kind(summed) == "samples" or _kind(indexed) == "variants"
    if not wrong:
        return
    variants = next((n for n in names if _kind(n) == "variants"), None)
    shown = ", ".join(repr(n) for n in names)
    product, which = ("G = X·Xᵀ", "second") if rows else ("G = XᵀX", "first")
    other = "G = XᵀX: no --rows" if rows else "G = X·Xᵀ: --rows"
    over = f"--over {variants} (or {other})" if variants else other
    raise UsageError(
        f"--kinship sums over the variants, but {x_name}'s dimensions are ({shown}) and this "
        f"product ({product}) sums over its {which}, {summed!r}; sum over the variants with "
        f"{over}"
    )


def _kind(name: str | None) -> str | None:
    if name is None:
        return None
    low = name.lower()
    return "variants" if low in VARIANTS else "samples" if low in SAMPLES else None

"""Worker side of a decomposition's steps between passes over X: tall-skinny arrays (n x l or
p x l, float64, in OUT) read, transformed and written band by band, so no worker holds one
whole. Each task returns only small sums (an R factor, column sums, signed peaks).

A band's correction makes the stored product the standardized one (pipeline.plan.decomposition):
on the observations' side ``T = Y − 1 cᵀ``; on the variables' side ``T = F (Z − μ sᵀ)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.store.decomposition import open_array


@dataclass(frozen=True)
class Fix:
    """The rank-one correction (and row scaling) that makes a stored band the standardized
    product's."""

    side: str
    """``n``: subtract ``1 vecᵀ``; ``p``: subtract ``μ vecᵀ`` and scale rows by F."""
    vec: tuple[float, ...] | None = None
    mean_url: str | None = None
    factor_url: str | None = None


@dataclass(frozen=True)
class Where:
    url: str
    options: dict[str, Any]


def _vector(
    url: str | None, options: dict[str, Any], rows: tuple[int, int]
) -> NDArray[np.float64] | None:
    if url is None:
        return None
    return np.asarray(open_array(url, options)[rows[0] : rows[1]], dtype=np.float64)


def fixed(src: Where, rows: tuple[int, int], fix: Fix) -> NDArray[np.float64]:
    """The band ``rows`` of ``src``, corrected."""
    band = np.array(open_array(src.url, src.options)[rows[0] : rows[1]], dtype=np.float64)
    if fix.vec is not None:
        vec = np.asarray(fix.vec, dtype=np.float64)
        if fix.side == "n":
            band -= vec[None, :]
        elif (mean := _vector(fix.mean_url, src.options, rows)) is not None:
            band -= np.outer(mean, vec)
    if fix.side == "p" and (factor := _vector(fix.factor_url, src.options, rows)) is not None:
        band *= factor[:, None]
    if not np.isfinite(band).all():
        raise FloatingPointError(
            f"{src.url} rows {rows[0]}..{rows[1]} hold non-finite values (a product overflowed)"
        )
    return band


def r_task(src: Where, rows: tuple[int, int], fix: Fix) -> NDArray[np.float64]:
    """TSQR's first level: the R factor of one band."""
    return np.asarray(np.linalg.qr(fixed(src, rows, fix), mode="r"), dtype=np.float64)


def weights(
    fix: Fix, options: dict[str, Any], rows: tuple[int, int], length: int
) -> NDArray[np.float64]:
    """Per row: what a band's column sums are weighted by (1 on the observations' side; μ ⊙ f
    on the variables', 0 when nothing is centred)."""
    if fix.side == "n":
        return np.ones(length)
    mean = _vector(fix.mean_url, options, rows)
    if mean is None:
        return np.zeros(length)
    factor = _vector(fix.factor_url, options, rows)
    return mean if factor is None else mean * factor


@dataclass(frozen=True)
class Apply:
    """What TSQR's second level does with a band's orthonormal rows ``Q_band``."""

    block: NDArray[np.float64]
    """This band's block of the second level's Q."""
    post: NDArray[np.float64] | None = None
    """Multiply by this on the right (the finish: Ua); None: keep."""
    target: Where | None = None
    """Where to write (None: nothing is written, only the peaks are returned)."""
    transposed: bool = False
    """Write the band transposed (components: K x p)."""
    scale_rows: bool = False
    """Write F ⊙ rows (the next product's operand)."""
    signs: NDArray[np.float64] | None = None


def apply_task(src: Where, rows: tuple[int, int], fix: Fix, how: Apply) -> dict[str, Any]:
    """TSQR's second level for one band: its Q (recomputed from the band: nothing but R left
    the worker) times its block, then written as ``how`` says. Returns the band's weighted
    column sums and signed peaks."""
    band = fixed(src, rows, fix)
    q_band = np.linalg.qr(band)[0] @ how.block
    if how.post is not None:
        q_band = q_band @ how.post
    if how.signs is not None:
        q_band *= how.signs[None, :]
    found = {
        "sums": weights(fix, src.options, rows, len(band)) @ q_band,
        "peaks": _peaks(q_band),
    }
    if how.target is not None:
        out = q_band
        if how.scale_rows and (factor := _vector(fix.factor_url, src.options, rows)) is not None:
            out = out * factor[:, None]
        _write(how.target, rows, out, how.transposed)
    return found


def sketch_task(
    target: Where, rows: tuple[int, int], seed: int, width: int, fix: Fix
) -> NDArray[np.float64]:
    """Ω's band (standard normal, from the seed and the band's first row: the same on any
    cluster), written as F Ω; returns (μ ⊙ f)ᵀ Ω."""
    rng = np.random.default_rng([seed, rows[0]])
    omega = rng.standard_normal((rows[1] - rows[0], width))
    factor = _vector(fix.factor_url, target.options, rows)
    _write(target, rows, omega if factor is None else omega * factor[:, None])
    sums: NDArray[np.float64] = weights(fix, target.options, rows, len(omega)) @ omega
    return sums


def project_task(
    src: Where, rows: tuple[int, int], matrix: NDArray[np.float64], target: Where
) -> NDArray[np.float64]:
    """``target[rows] = src[rows] @ matrix`` (the scores: Q (Va S)); returns the band's column
    sums."""
    band = np.asarray(open_array(src.url, src.options)[rows[0] : rows[1]], dtype=np.float64)
    out = band @ matrix
    _write(target, rows, out)
    sums: NDArray[np.float64] = out.sum(axis=0)
    return sums


def _write(
    target: Where, rows: tuple[int, int], values: NDArray[Any], transposed: bool = False
) -> None:
    array = open_array(target.url, target.options, "r+")
    if transposed:
        array[:, rows[0] : rows[1]] = values.T.astype(array.dtype)
    else:
        array[rows[0] : rows[1]] = values.astype(array.dtype)


def _peaks(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each column's entry of largest magnitude, signed (0 for an empty band)."""
    if values.shape[0] == 0:
        return np.zeros(values.shape[1])
    at = np.abs(values).argmax(axis=0)
    return np.asarray(values[at, np.arange(values.shape[1])], dtype=np.float64)

"""Covariance, correlation and kinship as Gram products of a standardized X (pure: numpy only).

``gram --center`` computes the covariance of the variables G is indexed by, ``--scale`` their
correlation, ``--kinship`` VanRaden's genomic relationship matrix. Each is the Gram product
of X' = (X − shift)·scale, one shift and one scale per row or per column of X (``axis``),
from one streaming pass over X (per-block moments merged by Chan's formulas, in float64):

- center: shift = the variable's mean over the summed axis, scale = 1/√(n − ddof), so
  G = X'ᵀX' is ``np.cov``'s matrix;
- scale: shift = the mean, scale = 1/√(Σ(x − mean)²), so G is ``np.corrcoef``'s (a constant
  variable gives NaN, as there);
- kinship: one shift and scale per variant (the summed axis): 2p = the variant's mean dosage
  over the samples, scale = 1/√(2p(1 − p)·m) with m the variants that vary, so
  G = Σ_variants (x − 2p)(x − 2p)ᵀ / (2p(1 − p)) / m. A variant every sample shares (p = 0
  or 1) gets scale 0: it is left out of G and of m.

Panels are standardized as they are read, in float64 and then rounded to the compute dtype:
float32 data loses nothing to a large mean (280 K temperatures with a 3 K spread).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.errors import InputError, UsageError

KINDS = {"center": "covariance", "scale": "correlation", "kinship": "kinship"}
"""The standardizations, by their flags, and what each makes G."""
MODES = tuple(KINDS)
DOSAGES = (0.0, 2.0)
"""The values a diploid genotype dosage takes at most (kinship refuses others)."""
MAX_STORED = 65536
"""The most per-variable means OUT's attributes hold (``tilegemm_moments``); beyond it only
their digest is recorded."""
MOMENTS_KEY = "tilegemm_moments"
"""OUT's attribute with the shifts and scales, where there are at most MAX_STORED."""


@dataclass(frozen=True)
class Moments:
    """Per-variable moments over the summed axis of one block of X, or of several merged."""

    count: int
    """Values per variable (the summed axis's length so far)."""
    mean: NDArray[np.float64]
    m2: NDArray[np.float64]
    """Σ (x − mean)² per variable."""
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    nonfinite: NDArray[np.int64]
    """NaN and ±inf per variable (they are left out of mean and m2)."""


def block_moments(block: NDArray[Any], axis: int) -> Moments:
    """The moments of ``block`` for each of its rows (``axis`` 0) or columns (1), over the
    other axis; two passes in float64 (the block's mean first): stable."""
    x = np.asarray(block, dtype=np.float64)
    if axis == 0:
        x = x.T
    finite = np.isfinite(x)
    bad = (~finite).sum(axis=0).astype(np.int64)
    if bad.any():
        x = np.where(finite, x, 0.0)
    count = x.shape[0]
    mean = x.sum(axis=0) / max(count, 1)
    m2 = ((x - mean) ** 2).sum(axis=0)
    inf = np.full(x.shape[1], np.inf)
    low = x.min(axis=0, initial=np.inf) if count else inf
    high = x.max(axis=0, initial=-np.inf) if count else -inf
    return Moments(count, mean, m2, low, high, bad)


def merge(a: Moments, b: Moments) -> Moments:
    """The moments of two blocks of the same variables (Chan, Golub and LeVeque)."""
    n = a.count + b.count
    if n == 0:
        return a
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / n)
    m2 = a.m2 + b.m2 + delta**2 * (a.count * b.count / n)
    return Moments(
        n, mean, m2, np.minimum(a.low, b.low), np.maximum(a.high, b.high),
        a.nonfinite + b.nonfinite,
    )  # fmt: skip


@dataclass(frozen=True)
class Standardize:
    """Which standardization, along which axis of X; ``shift`` and ``scale`` once measured."""

    mode: str
    """A name in MODES."""
    axis: int
    """1: one shift and scale per column of X (moments over its rows); 0: per row."""
    ddof: int = 1
    """center: G is divided by n − ddof (np.cov's ddof)."""
    shift: NDArray[np.float64] | None = field(default=None, compare=False, repr=False)
    scale: NDArray[np.float64] | None = field(default=None, compare=False, repr=False)
    count: int = 0
    """Values each shift was measured over (the summed axis for center and scale, the samples
    for kinship)."""
    used: int = 0
    """kinship: the variants that vary (m); else the variables."""
    constant: int = 0
    """Variables (kinship: variants) with no spread: NaN rows of a correlation, left out of a
    kinship."""

    @property
    def kind(self) -> str:
        """What G is: covariance, correlation or kinship."""
        return KINDS[self.mode]

    @property
    def measures(self) -> str:
        """What the pass over X measures, in words."""
        return "allele frequencies" if self.mode == "kinship" else "means"

    @property
    def flags(self) -> str:
        """The command line's flags for it: ``--center --ddof 1``, ``--scale``, ``--kinship``."""
        return f"--{self.mode}" + (f" --ddof {self.ddof}" if self.mode == "center" else "")

    def apply(self, block: NDArray[Any], rows: tuple[int, int], cols: tuple[int, int]) -> None:
        """Standardize ``block`` = X[rows, cols] (as stored) in place: computed in float64,
        rounded once to the block's dtype, in slabs (no float64 copy of a whole panel)."""
        if self.shift is None or self.scale is None:
            raise ValueError("the moments are not measured yet")
        lo, hi = cols if self.axis == 1 else rows
        shift, scale = self.shift[lo:hi], self.scale[lo:hi]
        if self.axis == 0:
            shift, scale = shift[:, None], scale[:, None]
        step = max(2**20 // max(block.shape[1], 1), 1)
        for r0 in range(0, block.shape[0], step):
            r1 = min(r0 + step, block.shape[0])
            part = (shift[r0:r1], scale[r0:r1]) if self.axis == 0 else (shift, scale)
            with np.errstate(invalid="ignore"):  # NaN scale: a constant variable's correlation
                block[r0:r1] = (block[r0:r1].astype(np.float64) - part[0]) * part[1]

    def finish(self, tile: NDArray[Any], row0: int, col0: int) -> None:
        """A correlation's tile at (row0, col0) of G, in place before it is written: its
        diagonal is 1 (a variable with itself; NaN stays for a constant one) and the rest
        clipped to [-1, 1], as np.corrcoef clips: float32 sums leave both a few ulp off."""
        if self.mode != "scale" or tile.size == 0:
            return
        np.clip(tile, -1.0, 1.0, out=tile)
        first, last = max(row0, col0), min(row0 + tile.shape[0], col0 + tile.shape[1])
        at = np.arange(first, max(first, last))
        diagonal = tile[at - row0, at - col0]
        tile[at - row0, at - col0] = np.where(np.isnan(diagonal), diagonal, 1.0)

    def digest(self) -> str:
        """sha256 of the shifts and scales (what verify measures again and compares)."""
        h = hashlib.sha256()
        for v in (self.shift, self.scale):
            h.update(np.ascontiguousarray(v, dtype="<f8").tobytes() if v is not None else b"-")
        return h.hexdigest()[:32]

    def record(self) -> dict[str, Any]:
        """What OUT's record states: the mode and axis, and once measured the divisor, the
        counts and the digest of the shifts and scales."""
        found: dict[str, Any] = {"mode": self.mode, "axis": "columns" if self.axis else "rows"}
        if self.mode == "center":
            found["ddof"] = self.ddof
        if self.shift is None:
            return found
        found |= {"count": self.count, "digest": self.digest()}
        if self.mode == "center":
            found["divisor"] = self.count - self.ddof
        if self.mode == "kinship":
            found |= {"variants_used": self.used, "monomorphic": self.constant}
        if self.mode == "scale":
            found["constant"] = self.constant
        return found

    def stored(self) -> dict[str, Any] | None:
        """OUT's ``tilegemm_moments`` attribute (None: more than MAX_STORED variables)."""
        if self.shift is None or self.scale is None or len(self.shift) > MAX_STORED:
            return None
        name = "two_p" if self.mode == "kinship" else "mean"
        return {name: self.shift.tolist(), "scale": self.scale.tolist()}


def from_record(record: dict[str, Any]) -> Standardize:
    """The standardization a record states, to measure again (verify); ValueError if it
    names none."""
    mode, axis = record.get("mode"), record.get("axis")
    if mode not in MODES or axis not in ("rows", "columns"):
        raise ValueError(f"no standardization: mode {mode!r}, axis {axis!r}")
    ddof = record.get("ddof", 1)
    return Standardize(str(mode), 1 if axis == "columns" else 0, int(ddof))


def requested(
    center: bool, scale: bool, kinship: bool, ddof: int | None, rows: bool
) -> Standardize | None:
    """The gram options as a Standardize (None: a plain Gram product); UsageError for
    combinations that mean nothing."""
    if kinship and (center or scale):
        raise UsageError(
            "--kinship standardizes each variant itself; drop --center and --scale (they "
            "standardize the variables G is indexed by: a covariance or correlation)"
        )
    if ddof is not None and scale:
        raise UsageError(
            "--ddof has no effect on a correlation (the divisor cancels, as in np.corrcoef); "
            "drop --ddof, or use --center for a covariance"
        )
    if ddof is not None and not center:
        raise UsageError("--ddof sets --center's divisor n − ddof; add --center, or drop --ddof")
    if ddof is not None and (isinstance(ddof, bool) or not isinstance(ddof, int) or ddof < 0):
        raise UsageError(f"--ddof takes a whole number >= 0 (1: np.cov's default); got {ddof!r}")
    if not (center or scale or kinship):
        return None
    mode = "kinship" if kinship else "scale" if scale else "center"
    # G = XᵀX: the variables are X's columns, the variants (summed) its rows; --rows: the other.
    per_column = (mode == "kinship") == rows
    return Standardize(mode, 1 if per_column else 0, 1 if ddof is None else ddof)


def parse_ddof(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--ddof takes a whole number >= 0, e.g. 1; got {text!r}") from None


def output_dtype(std: Standardize, x_dtype: str, requested_dtype: str | None) -> str:
    """OUT's dtype: as asked (a float), else float64 for float64 X and float32 otherwise."""
    kind = np.dtype(x_dtype).kind
    if kind == "c":
        raise InputError(f"--{std.mode} takes real data; X is {x_dtype}")
    if requested_dtype is None:
        return "float64" if np.dtype(x_dtype) == np.float64 else "float32"
    if np.dtype(requested_dtype).kind != "f":
        raise UsageError(
            f"--dtype {requested_dtype}: a {std.kind} is not whole numbers; choose "
            "float32 or float64"
        )
    return requested_dtype


def describe(std: Standardize) -> str:
    """The plan's line: what G is, and the extra pass over X."""
    over = "columns" if std.axis == 1 else "rows"
    if std.mode == "kinship":
        return (
            f"kinship (VanRaden): X's {over} are the variants, each centred by 2p and scaled "
            "by 1/sqrt(2p(1-p)), G divided by the variants that vary; one more pass over X "
            "first, for p"
        )
    what = std.kind
    divisor = f", divided by n - {std.ddof}" if std.mode == "center" else ""
    return f"{what} of X's {over}{divisor}; one more pass over X first, for their means" + (
        " and spreads" if std.mode == "scale" else ""
    )


def measured(std: Standardize, moments: Moments, x_name: str = "X") -> Standardize:
    """``std`` with its shifts and scales from X's moments; refuses what has no answer: too
    few values for the divisor, non-finite values, dosages outside 0..2 for a kinship."""
    n = moments.count
    what = "column" if std.axis == 1 else "row"
    if moments.nonfinite.any():
        first = int(np.flatnonzero(moments.nonfinite)[0])
        raise InputError(
            f"{x_name} holds {int(moments.nonfinite.sum()):,} NaN or infinite value(s) "
            f"(the first in {what} {first}); --{std.mode} needs them filled or removed first"
        )
    if std.mode == "kinship":
        return _kinship(std, moments, x_name, what)
    if std.mode == "center" and n - std.ddof <= 0:
        raise UsageError(
            f"--ddof {std.ddof} leaves no divisor: each variable has {n} value(s) (n − ddof "
            f"= {n - std.ddof}); pass a smaller --ddof"
        )
    if std.mode == "center":
        scale = np.full(moments.mean.shape, 1.0 / math.sqrt(n - std.ddof))
        return replace(std, shift=moments.mean, scale=scale, count=n, used=len(scale))
    spread = moments.m2 > 0
    with np.errstate(divide="ignore"):
        scale = np.where(spread, 1.0 / np.sqrt(np.where(spread, moments.m2, 1.0)), np.nan)
    constant = int((~spread).sum())
    return replace(
        std, shift=moments.mean, scale=scale, count=n, used=len(scale), constant=constant
    )


def _kinship(std: Standardize, moments: Moments, x_name: str, what: str) -> Standardize:
    low, high = DOSAGES
    outside = (moments.low < low) | (moments.high > high)
    if outside.any():
        first = int(np.flatnonzero(outside)[0])
        raise InputError(
            f"--kinship takes genotype dosages 0, 1 or 2 (0..2 for imputed ones), but "
            f"{x_name}'s variant {what} {first} holds values from "
            f"{moments.low[first]:g} to {moments.high[first]:g}; recode missing genotypes "
            "(e.g. -1 or 3) by imputing them first"
        )
    p = moments.mean / 2
    var = 2 * p * (1 - p)
    varies = var > 0
    m = int(varies.sum())
    if m == 0:
        raise InputError(
            f"--kinship: no variant of {x_name} has both alleles among the samples (each is "
            "all 0 or all 2), so the relationship matrix is undefined"
        )
    scale = np.where(varies, 1.0 / np.sqrt(np.where(varies, var, 1.0) * m), 0.0)
    constant = len(scale) - m
    return replace(
        std, shift=moments.mean, scale=scale, count=moments.count, used=m, constant=constant
    )

"""Covariance, correlation and kinship as Gram products of a standardized X (pure: numpy only).

``gram --center`` computes the covariance of the variables G is indexed by, ``--scale`` their
correlation, ``--kinship`` a genomic relationship matrix. Each is the Gram product of
X' = (X − shift)·scale, one shift and one scale per row or per column of X (``axis``), from one
streaming pass over X (per-block moments merged by Chan's formulas, in float64):

- center: shift = the variable's mean over the summed axis, scale = 1/√(n − ddof), so
  G = X'ᵀX' is ``np.cov``'s matrix;
- scale: shift = the mean, scale = 1/√(Σ(x − mean)²), so G is ``np.corrcoef``'s (a constant
  variable gives NaN, as there);
- kinship: one shift per variant (the summed axis), 2p = the variant's mean dosage over the
  samples; ``standardized`` (GCTA's): scale = 1/√(2p(1 − p)·m) with m the variants that vary,
  so G = Σ_variants (x − 2p)(x − 2p)ᵀ / (2p(1 − p)) / m; ``vanraden`` (VanRaden's first
  method): scale = 1/√(2 Σ p(1 − p)) for every variant, so G = ZZᵀ / (2 Σ p(1 − p)). A variant
  every sample shares (p = 0 or 1) gets scale 0: it is left out of G and of m.

Missing values (NaN, or a ``code`` such as -1) are refused unless a policy says what they are:
``impute`` fills each with its variable's mean over the present values (standardized: 0, as
plink and sgkit impute calls), ``drop-columns`` leaves out every variable holding one (its row
and column of a covariance or correlation are NaN; a variant is left out of a kinship).

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
FORMS = ("standardized", "vanraden")
"""The kinship forms: GCTA's per-variant standardized one, and VanRaden's first method."""
MISSING = ("impute", "drop-columns")
"""What missing values (NaN, or --missing-code) become: each variable's mean, or the variable
left out."""
DOSAGES = (0.0, 2.0)
"""The values a diploid genotype dosage takes at most (kinship refuses others)."""
MAX_STORED = 65536
"""The most per-variable means and scales OUT's attributes hold (``tilegemm_mean`` and
``tilegemm_scale``); beyond it only their digest is recorded."""
MEAN_KEY, SCALE_KEY = "tilegemm_mean", "tilegemm_scale"
"""OUT's attributes with the shifts and scales (lists of numbers, which netCDF stores)."""


@dataclass(frozen=True)
class Moments:
    """Per-variable moments over the summed axis of one block of X, or of several merged."""

    count: int
    """Values per variable (the summed axis's length so far), present or not."""
    mean: NDArray[np.float64]
    m2: NDArray[np.float64]
    """Σ (x − mean)² per variable, over its present values."""
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    nonfinite: NDArray[np.int64]
    """±inf per variable (left out of mean and m2; always refused)."""
    missing: NDArray[np.int64] | None = None
    """NaN (and the missing code) per variable, left out of mean and m2; None: none."""

    @property
    def present(self) -> NDArray[np.int64]:
        """Values per variable that count: neither missing nor infinite."""
        gone = self.nonfinite if self.missing is None else self.nonfinite + self.missing
        return np.int64(self.count) - gone

    @property
    def absent(self) -> NDArray[np.int64]:
        return np.zeros_like(self.nonfinite) if self.missing is None else self.missing


def block_moments(block: NDArray[Any], axis: int, code: float | None = None) -> Moments:
    """The moments of ``block`` for each of its rows (``axis`` 0) or columns (1), over the
    other axis; two passes in float64 (the block's mean first): stable. NaN and ``code`` are
    missing, ±inf non-finite: both are counted and left out."""
    x = np.asarray(block, dtype=np.float64)
    if axis == 0:
        x = x.T
    count = x.shape[0]
    sums = x.sum(axis=0)
    if code is None and count and np.isfinite(sums).all():  # every value finite: the same
        mean = sums / count  # figures as below, in fewer passes over the block
        dev = x - mean
        np.square(dev, out=dev)
        zero = np.zeros(x.shape[1], dtype=np.int64)
        return Moments(count, mean, dev.sum(axis=0), x.min(axis=0), x.max(axis=0), zero)
    gone = np.isnan(x)
    if code is not None:
        gone |= x == code
    infinite = np.isinf(x)
    valid = ~(gone | infinite)
    present = valid.sum(axis=0)
    whole = bool(valid.all())
    if not whole:
        x = np.where(valid, x, 0.0)
    mean = x.sum(axis=0) / np.maximum(present, 1)
    dev = x - mean if whole else np.where(valid, x - mean, 0.0)
    m2 = (dev**2).sum(axis=0)
    inf = np.full(x.shape[1], np.inf)
    low = np.where(valid, x, np.inf).min(axis=0, initial=np.inf) if count else inf
    high = np.where(valid, x, -np.inf).max(axis=0, initial=-np.inf) if count else -inf
    nonfinite = infinite.sum(axis=0).astype(np.int64)
    missing = gone.sum(axis=0).astype(np.int64) if gone.any() else None
    return Moments(count, mean, m2, low, high, nonfinite, missing)


SLAB_ELEMENTS = 2**17
"""Values a slab of ``slab_moments`` holds in float64 (1 MiB: it stays in cache)."""


def slab_moments(block: NDArray[Any], axis: int) -> Moments | None:
    """``block_moments`` for a block of finite values, in slabs of the block as stored (no
    float64 copy of it, each slab cast while in cache): the same figures to rounding, several
    times faster. None when a value is not finite (``block_moments`` counts them)."""
    x = block.T if axis == 0 else block  # the variables along the columns
    count, width = x.shape
    if count == 0 or width == 0:
        return None
    step = max(1, SLAB_ELEMENTS // width)
    sums = np.zeros(width)
    for a in range(0, count, step):
        sums += x[a : a + step].sum(axis=0, dtype=np.float64)
    if not np.isfinite(sums).all():
        return None
    mean = sums / count
    m2 = np.zeros(width)
    for a in range(0, count, step):
        dev = x[a : a + step].astype(np.float64)
        dev -= mean
        dev *= dev
        m2 += dev.sum(axis=0)
    low = x.min(axis=0).astype(np.float64)
    high = x.max(axis=0).astype(np.float64)
    return Moments(count, mean, m2, low, high, np.zeros(width, dtype=np.int64))


def merge(a: Moments, b: Moments) -> Moments:
    """The moments of two blocks of the same variables (Chan, Golub and LeVeque), each
    variable over its own present values."""
    na, nb = a.present, b.present
    n = na + nb
    if a.count + b.count == 0:
        return a
    delta = b.mean - a.mean
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, a.mean + delta * (nb / n), 0.0)
        m2 = np.where(n > 0, a.m2 + b.m2 + delta**2 * (na * nb / n), 0.0)
    missing = None if a.missing is None and b.missing is None else a.absent + b.absent
    return Moments(
        a.count + b.count, mean, m2, np.minimum(a.low, b.low), np.maximum(a.high, b.high),
        a.nonfinite + b.nonfinite, missing,
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
    form: str = "standardized"
    """kinship: a name in FORMS."""
    missing: str | None = None
    """What missing values become: a name in MISSING; None: refused."""
    code: float | None = None
    """A stored value that means missing, besides NaN (e.g. -1)."""
    imputed: int = 0
    """Missing values filled with their variable's mean."""
    dropped: int = 0
    """Variables (kinship: variants) left out for holding missing values (or only those)."""

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
        found = f"--{self.mode}"
        if self.mode == "kinship" and self.form != FORMS[0]:
            found += f" {self.form}"
        if self.mode == "center":
            found += f" --ddof {self.ddof}"
        if self.missing is not None and self.missing != _default_missing(self.mode):
            found += f" --missing {self.missing}"
        if self.code is not None:
            found += f" --missing-code {self.code:g}"
        return found

    def apply(self, block: NDArray[Any], rows: tuple[int, int], cols: tuple[int, int]) -> None:
        """Standardize ``block`` = X[rows, cols] (as stored) in place: computed in float64,
        rounded once to the block's dtype, in slabs (no float64 copy of a whole panel). A
        missing value becomes its variable's shift first (0 once standardized)."""
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
            slab = block[r0:r1].astype(np.float64)
            if self.missing is not None:
                gone = np.isnan(slab) if self.code is None else np.isnan(slab) | (slab == self.code)
                if gone.any():
                    slab = np.where(gone, part[0], slab)
            slab -= part[0]  # in place: one float64 slab at a time
            with np.errstate(invalid="ignore"):  # NaN scale: a constant or left-out variable
                slab *= part[1]
            block[r0:r1] = slab

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
        if self.mode == "kinship":
            found["form"] = self.form
        if self.missing is not None:
            found["missing"] = self.missing
        if self.code is not None:
            found["missing_code"] = self.code
        if self.shift is None:
            return found
        found |= {"count": self.count, "digest": self.digest()}
        if self.mode == "center":
            found["divisor"] = self.count - self.ddof
        if self.mode == "kinship":
            found |= {"variants_used": self.used, "monomorphic": self.constant}
        if self.mode == "scale":
            found["constant"] = self.constant
        if self.missing is not None:
            found |= {"imputed": self.imputed, "dropped": self.dropped}
        return found

    def stored(self) -> dict[str, list[float]] | None:
        """OUT's ``tilegemm_mean`` and ``tilegemm_scale`` attributes: lists of numbers, which
        xarray's to_netcdf writes as they are (None: more than MAX_STORED variables)."""
        if self.shift is None or self.scale is None or len(self.shift) > MAX_STORED:
            return None
        return {MEAN_KEY: self.shift.tolist(), SCALE_KEY: self.scale.tolist()}

    def counts(self) -> str:
        """The done line's words for what was measured: variants used, left out, imputed."""
        if self.shift is None:
            return ""
        what = "variants" if self.mode == "kinship" else "variables"
        parts = [f"{self.used:,} {what} used"]
        if self.mode == "kinship":
            parts.append(f"{self.constant:,} monomorphic left out")
        elif self.constant:
            parts.append(f"{self.constant:,} constant (NaN)")
        if self.dropped:
            parts.append(f"{self.dropped:,} left out for missing values")
        if self.missing is not None:
            parts.append(f"{self.imputed:,} missing value(s) imputed")
        return ", ".join(parts)


def _default_missing(mode: str) -> str | None:
    """A kinship imputes missing calls unless told otherwise, as plink and sgkit do; a
    covariance or correlation refuses them."""
    return "impute" if mode == "kinship" else None


def from_record(record: dict[str, Any]) -> Standardize:
    """The standardization a record states, to measure again (verify); ValueError if it
    names none."""
    mode, axis = record.get("mode"), record.get("axis")
    if mode not in MODES or axis not in ("rows", "columns"):
        raise ValueError(f"no standardization: mode {mode!r}, axis {axis!r}")
    ddof = record.get("ddof", 1)
    form = record.get("form", FORMS[0])
    missing = record.get("missing")
    code = record.get("missing_code")
    if form not in FORMS or (missing is not None and missing not in MISSING):
        raise ValueError(f"no standardization: form {form!r}, missing {missing!r}")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int | float)):
        raise ValueError(f"no standardization: missing code {code!r}")
    return Standardize(
        str(mode), 1 if axis == "columns" else 0, int(ddof), form=str(form), missing=missing,
        code=None if code is None else float(code),
    )  # fmt: skip


def requested(
    center: bool,
    scale: bool,
    kinship: bool | str | None,
    ddof: int | None,
    rows: bool,
    missing: str | None = None,
    missing_code: float | None = None,
) -> Standardize | None:
    """The gram options as a Standardize (None: a plain Gram product); UsageError for
    combinations that mean nothing."""
    form = kinship_form(kinship)
    if form and (center or scale):
        raise UsageError(
            "--kinship centres each variant itself; drop --center and --scale (they "
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
    if missing is not None and missing not in MISSING:
        raise UsageError(f"--missing takes {' or '.join(MISSING)}; got {missing!r}")
    if missing_code is not None and (
        isinstance(missing_code, bool)
        or not isinstance(missing_code, int | float)
        or not math.isfinite(missing_code)
    ):
        raise UsageError(f"--missing-code takes a finite number, e.g. -1; got {missing_code!r}")
    if not (center or scale or form):
        if missing is not None or missing_code is not None:
            flag = "--missing" if missing is not None else "--missing-code"
            raise UsageError(
                f"{flag} says what missing values become in a standardized X; add --center, "
                f"--scale or --kinship, or drop {flag} (a plain Gram product multiplies NaN "
                "as it is)"
            )
        return None
    low, high = DOSAGES
    if form and missing_code is not None and low <= missing_code <= high:
        raise UsageError(
            f"--missing-code {missing_code:g} is a genotype dosage (0..2), so real calls would be "
            "taken as missing; pass the value that marks a missing call (e.g. -1 or 3)"
        )
    mode = "kinship" if form else "scale" if scale else "center"
    # G = XᵀX: the variables are X's columns, the variants (summed) its rows; --rows: the other.
    per_column = (mode == "kinship") == rows
    if missing is None:
        missing = _default_missing(mode) if missing_code is None else "impute"
    return Standardize(
        mode, 1 if per_column else 0, 1 if ddof is None else ddof, form=form or FORMS[0],
        missing=missing, code=None if missing_code is None else float(missing_code),
    )  # fmt: skip


def kinship_form(value: bool | str | None) -> str | None:
    """--kinship's value as a form in FORMS (True: the standardized one); None: not asked."""
    if value is None or value is False:
        return None
    if value is True:
        return FORMS[0]
    if value in FORMS:
        return str(value)
    raise UsageError(f"--kinship takes {' or '.join(FORMS)} (default {FORMS[0]}); got {value!r}")


def parse_ddof(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--ddof takes a whole number >= 0, e.g. 1; got {text!r}") from None


def parse_code(text: str) -> float:
    """--missing-code's text: a finite number, e.g. -1 or 9."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"--missing-code takes a finite number, e.g. -1; got {text!r}")
    return value


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
    """The plan's line: what G is, the missing values' policy, and the extra pass over X."""
    over = "columns" if std.axis == 1 else "rows"
    if std.mode == "kinship" and std.form == "vanraden":
        text = (
            f"kinship (VanRaden's first method): X's {over} are the variants, each centred by "
            "2p, G = ZZᵀ / (2 Σ p(1-p)); monomorphic variants left out"
        )
    elif std.mode == "kinship":
        text = (
            f"kinship (standardized, GCTA's): X's {over} are the variants, each centred by 2p "
            "and scaled by 1/sqrt(2p(1-p)), G divided by the variants that vary"
        )
    else:
        divisor = f", divided by n - {std.ddof}" if std.mode == "center" else ""
        text = f"{std.kind} of X's {over}{divisor}"
    if std.missing is not None:
        values = "NaN" + ("" if std.code is None else f" and {std.code:g}")
        fate = (
            "its variable's mean"
            if std.missing == "impute"
            else "its variable left out" + ("" if std.mode == "kinship" else " (NaN in G)")
        )
        text += f"; missing values ({values}): {fate}"
    measures = "p" if std.mode == "kinship" else "their means"
    spreads = " and spreads" if std.mode == "scale" else ""
    return f"{text}; one more pass over X first, for {measures}{spreads}"


def measured(std: Standardize, moments: Moments, x_name: str = "X") -> Standardize:
    """``std`` with its shifts and scales from X's moments; refuses what has no answer: too
    few values for the divisor, infinite values, missing values without a policy, dosages
    outside 0..2 for a kinship."""
    n = moments.count
    what = "column" if std.axis == 1 else "row"
    if moments.nonfinite.any():
        first = int(np.flatnonzero(moments.nonfinite)[0])
        raise InputError(
            f"{x_name} holds {int(moments.nonfinite.sum()):,} infinite value(s) (the first in "
            f"{what} {first}); --{std.mode} needs them replaced or removed first"
        )
    absent = moments.absent
    if std.missing is None and absent.any():
        first = int(np.flatnonzero(absent)[0])
        raise InputError(
            f"{x_name} holds {int(absent.sum()):,} NaN value(s) in {int((absent > 0).sum()):,} "
            f"{what}(s) (the first in {what} {first}); --{std.mode} needs a policy for them: "
            "--missing drop-columns leaves out every variable holding one (NaN in G, as for "
            "land points), --missing impute fills each with its variable's mean"
        )
    if std.mode == "center" and n - std.ddof <= 0:
        raise UsageError(
            f"--ddof {std.ddof} leaves no divisor: each variable has {n} value(s) (n − ddof "
            f"= {n - std.ddof}); pass a smaller --ddof"
        )
    # impute: a variable with no value at all has no mean to fill with; it is left out too
    drop = absent > 0 if std.missing == "drop-columns" else moments.present == 0
    counted = replace(std, count=n, dropped=int(drop.sum()), imputed=int(absent[~drop].sum()))
    if std.mode == "kinship":
        return _kinship(counted, moments, drop, x_name, what)
    mean = np.where(drop, 0.0, moments.mean)
    if std.mode == "center":
        scale = np.where(drop, np.nan, 1.0 / math.sqrt(n - std.ddof))
        return replace(counted, shift=mean, scale=scale, used=int((~drop).sum()))
    spread = (moments.m2 > 0) & ~drop
    with np.errstate(divide="ignore"):
        scale = np.where(spread, 1.0 / np.sqrt(np.where(spread, moments.m2, 1.0)), np.nan)
    constant = int((~spread & ~drop).sum())
    return replace(counted, shift=mean, scale=scale, used=int((~drop).sum()), constant=constant)


def _kinship(
    std: Standardize, moments: Moments, drop: NDArray[np.bool_], x_name: str, what: str
) -> Standardize:
    low, high = DOSAGES
    outside = ((moments.low < low) | (moments.high > high)) & ~drop
    if outside.any():
        first = int(np.flatnonzero(outside)[0])
        code = "" if std.code is None else f" (--missing-code {std.code:g} is taken as missing)"
        raise InputError(
            f"--kinship takes genotype dosages 0, 1 or 2 (0..2 for imputed ones), but "
            f"{x_name}'s variant {what} {first} holds values from "
            f"{moments.low[first]:g} to {moments.high[first]:g}{code}; if a value marks a "
            "missing call (e.g. -1 or 3), pass --missing-code with it"
        )
    p = np.where(drop, 0.0, moments.mean / 2)
    var = 2 * p * (1 - p)
    varies = (var > 0) & ~drop
    m = int(varies.sum())
    if m == 0:
        raise InputError(
            f"--kinship: no variant of {x_name} has both alleles among the samples (each is "
            "all 0 or all 2"
            + (", or left out for missing calls" if std.dropped else "")
            + "), so the relationship matrix is undefined"
        )
    safe = np.where(varies, var, 1.0)
    if std.form == "vanraden":
        scale = np.where(varies, 1.0 / math.sqrt(float(var[varies].sum())), 0.0)
    else:
        scale = np.where(varies, 1.0 / np.sqrt(safe * m), 0.0)
    constant = len(scale) - m - std.dropped
    return replace(std, shift=2 * p, scale=scale, used=m, constant=constant)

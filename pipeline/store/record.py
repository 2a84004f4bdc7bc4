"""OUT's record: what this tool wrote into OUT's ``tilegemm`` attribute, as one typed value.

Stored as JSON text, so OUT's attributes stay flat (xarray's ``to_netcdf`` takes only
strings, numbers and lists); OUTs of earlier versions hold the same fields as a nested
object, still read. A value that does not parse, is larger than MAX_RECORD_CHARS, has a field
of the wrong type or a field this tool never writes is no record: its array is not ours.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ATTRS_KEY = "tilegemm"
"""The attribute this tool writes into OUT; a record there marks OUT as ours."""
MAX_RECORD_CHARS = 4096
"""The longest JSON text read as a record (ours are a few hundred characters)."""
MAX_TEXT_CHARS = 256
"""The longest fingerprint or precision name a record holds."""
FIELDS = (
    "complete", "fingerprint", "tile_shape", "transpose_a", "transpose_b", "symmetric",
    "precision", "alpha", "verified", "generated", "standardize",
)  # fmt: skip
"""The stored names, in the order they are written."""


STANDARDIZE_FIELDS = (
    "mode", "axis", "ddof", "divisor", "count", "digest", "variants_used", "monomorphic",
    "constant", "form", "missing", "missing_code", "imputed", "dropped",
)  # fmt: skip
"""What a standardized Gram product's record states."""


@dataclass(frozen=True)
class OutRecord:
    """OUT's record; every field is optional (a ``random`` array has only its seed)."""

    fingerprint: str | None = None
    """The plan's fingerprint (inputs, tiling, layout, α): what --resume must match."""
    complete: bool | None = None
    """False while tiles are unwritten, True once every tile is; None: not a product's."""
    verified: bool | None = None
    """The outcome of ``--verify``; None: not verified."""
    tile_shape: tuple[int, int] | None = None
    """The tiling the journal's entries are named by (what --resume keeps)."""
    transpose_a: bool = False
    transpose_b: bool = False
    symmetric: bool = False
    """A Gram product's: C equals its transpose bitwise."""
    precision: str | None = None
    """``--precision`` (verify's tolerance follows it); None: not recorded, which means fp32."""
    alpha: float | None = None
    """``--alpha`` when not 1 (verify checks C == α·A·B)."""
    seed: int | None = None
    """A ``random`` array's seed (stored as ``generated.seed``)."""
    standardize: dict[str, str | int] | None = None
    """A covariance, correlation or kinship (``gram --center``, ``--scale``, ``--kinship``):
    its mode, axis, divisor and counts (pipeline.plan.standardize.Standardize.record)."""

    def __post_init__(self) -> None:
        for name in ("complete", "verified", "transpose_a", "transpose_b", "symmetric"):
            value = getattr(self, name)
            unset = value is None and name in ("complete", "verified")
            if not (isinstance(value, bool) or unset):
                raise ValueError(f"{name} is {value!r}, not a boolean")
        for name in ("fingerprint", "precision"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and len(value) <= MAX_TEXT_CHARS):
                raise ValueError(f"{name} is not a string of at most {MAX_TEXT_CHARS} characters")
        shape = self.tile_shape
        if shape is not None and not (
            isinstance(shape, tuple) and len(shape) == 2 and all(_count(t, 1) for t in shape)
        ):
            raise ValueError(f"tile_shape is {shape!r}, not two integers >= 1")
        if self.alpha is not None and not (_number(self.alpha) and math.isfinite(self.alpha)):
            raise ValueError(f"alpha is {self.alpha!r}, not a finite number")
        if self.seed is not None and not _count(self.seed, 0):
            raise ValueError(f"seed is {self.seed!r}, not an integer >= 0")
        std = self.standardize
        if std is not None and not (
            isinstance(std, dict)
            and set(std) <= set(STANDARDIZE_FIELDS)
            and all(
                isinstance(v, str) and len(v) <= 64 or _count(v, -(2**62))
                for k, v in std.items()
                if k != "missing_code"
            )
            and _finite(std.get("missing_code", 0))
        ):
            raise ValueError(f"standardize is {std!r}, not a standardization's record")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutRecord:
        """The record stored as ``data``; ValueError for a field unknown or of the wrong type."""
        unknown = set(data) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)[:3]}")
        if any(v is None for v in data.values()):
            raise ValueError("a field is null (an unset field is left out)")
        fields = {k: v for k, v in data.items() if k not in ("tile_shape", "generated")}
        shape = data.get("tile_shape")
        if shape is not None:
            if not isinstance(shape, list):
                raise ValueError(f"tile_shape is {shape!r}, not a list")
            fields["tile_shape"] = tuple(shape)
        if "generated" in data:
            fields["seed"] = _seed(data["generated"])
        alpha = fields.get("alpha")
        if alpha is not None and _number(alpha):
            fields["alpha"] = float(alpha)
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        """The stored fields: only those set (a transpose only when true), lists for tuples."""
        found: dict[str, Any] = {
            "complete": self.complete,
            "fingerprint": self.fingerprint,
            "tile_shape": None if self.tile_shape is None else list(self.tile_shape),
            "precision": self.precision,
            "alpha": self.alpha,
            "verified": self.verified,
            "generated": None if self.seed is None else {"seed": self.seed},
            "standardize": self.standardize,
        }
        for name in ("transpose_a", "transpose_b", "symmetric"):
            found[name] = True if getattr(self, name) else None
        return {k: found[k] for k in FIELDS if found[k] is not None}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    def attributes(self) -> dict[str, Any]:
        """OUT's attributes holding this record (the one place its stored form is made)."""
        return {ATTRS_KEY: self.to_json()}


@dataclass(frozen=True)
class Difference:
    """One option a run gives otherwise than OUT was started with, in flag words."""

    started: str
    """How OUT was started: ``with --transpose-b``."""
    given: str
    """What this run has: ``no --transpose-b``."""
    fix: str
    """How to rerun: ``with --transpose-b``."""


def differences(started: OutRecord, given: OutRecord) -> list[Difference]:
    """The options of the product recorded in ``started`` (OUT's) that ``given`` (the record
    this run would write) does not share: transposes (``--rows`` for a Gram product), the
    precision, α and a Gram product's standardization. A Gram product against a plain one is
    one difference."""
    if started.symmetric != given.symmetric:
        kinds = {True: "a Gram product (`gram`)", False: "a plain product (`multiply`)"}
        command = "`gram`" if started.symmetric else "`multiply`"
        return [Difference(f"as {kinds[started.symmetric]}", kinds[given.symmetric], command)]
    found = []
    flags = (("transpose_b", "--rows"),) if given.symmetric else (
        ("transpose_a", "--transpose-a"), ("transpose_b", "--transpose-b"),
    )  # fmt: skip
    for name, flag in flags:
        then, now = getattr(started, name), getattr(given, name)
        if then and not now:
            found.append(Difference(f"with {flag}", f"no {flag}", f"with {flag}"))
        elif now and not then:
            found.append(Difference(f"without {flag}", flag, f"without {flag}"))
    then, now = started.precision or "fp32", given.precision or "fp32"
    if then != now:
        found.append(
            Difference(f"with --precision {then}", f"--precision {now}", f"with --precision {then}")
        )
    if started.alpha != given.alpha:
        now_alpha = f"--alpha {_text(1.0 if given.alpha is None else given.alpha)}"
        found.append(Difference(alpha_flag(started), now_alpha, alpha_flag(started)))
    then, now = _standardized(started), _standardized(given)
    if then != now:
        none = "no --center, --scale or --kinship"
        was = f"with {then}" if then else "without --center, --scale or --kinship"
        found.append(Difference(was, now or none, was))
    return found


def _standardized(record: OutRecord) -> str:
    """A Gram product's standardization in flags (``--center --ddof 1``); "" for none."""
    std = record.standardize or {}
    if "mode" not in std:
        return ""
    ddof = f" --ddof {std['ddof']}" if std["mode"] == "center" and "ddof" in std else ""
    form = f" {std['form']}" if std.get("form", "standardized") != "standardized" else ""
    default = "impute" if std["mode"] == "kinship" else None  # a kinship's, unless told
    missing = f" --missing {std['missing']}" if std.get("missing", default) != default else ""
    code = f" --missing-code {std['missing_code']:g}" if "missing_code" in std else ""
    return f"--{std['mode']}{form}{ddof}{missing}{code}"


def alpha_flag(record: OutRecord) -> str:
    """How a product was asked for its α: ``with --alpha 2`` (``--alpha 1`` when none was)."""
    return f"with --alpha {_text(1.0 if record.alpha is None else record.alpha)}"


def parse(value: object) -> OutRecord | None:
    """The record a ``tilegemm`` attribute holds: JSON text, or an earlier version's object.
    None when it holds none, or a malformed one (read within MAX_RECORD_CHARS)."""
    if isinstance(value, str):
        if len(value) > MAX_RECORD_CHARS:
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not isinstance(value, dict):
        return None
    try:
        return OutRecord.from_dict(value)
    except (ValueError, TypeError):
        return None


def of_attributes(attributes: object) -> OutRecord | None:
    """The record in an array's attributes (a mapping), or None."""
    return parse(attributes.get(ATTRS_KEY)) if isinstance(attributes, Mapping) else None


def of_array(array: Any) -> OutRecord | None:
    """The record in a zarr array's attributes, or None (not ours, or malformed)."""
    return of_attributes(dict(array.attrs))


def _text(number: float) -> str:
    """A number as short as it reads back exactly (2, not 2.0)."""
    short = f"{number:g}"
    return short if float(short) == number else repr(number)


def _count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _finite(value: object) -> bool:
    return _number(value) and math.isfinite(value)  # type: ignore[arg-type]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seed(generated: object) -> int:
    if not (isinstance(generated, dict) and set(generated) == {"seed"}):
        raise ValueError(f"generated is {generated!r}, not {{'seed': N}}")
    seed = generated["seed"]
    if not _count(seed, 0):
        raise ValueError(f"generated.seed is {seed!r}, not an integer >= 0")
    return int(seed)

"""Products asked for by dimension name (pure): ``--over`` (the dimensions summed over) and
``gram``'s ``--stack`` (the dimensions G is indexed by) resolved against the operands' stored
dimension names into the transposes, and for an N-D field into the split that reads it as a
matrix (its first ``split`` stored dimensions stacked as rows, the rest as columns: a C-order
reshape, so each side must be consecutive in stored order). Without names nothing changes;
with them, a product that sums two different names while the operands share one is refused."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.errors import InputError, UsageError
from pipeline.plan.layout import DEFAULT_DIMENSIONS

Names = tuple[str | None, ...]
"""An array's stored dimension names, in order (None: unnamed)."""
Side = tuple[str | None, ...]
"""The names of one side of a matrix (several: stacked, the first outermost)."""


@dataclass(frozen=True)
class Orientation:
    """The operands as the product uses them: ``op(A) @ op(B)``."""

    transposed: tuple[bool, bool]
    """Whether A and B are read transposed."""
    splits: tuple[int | None, int | None]
    """Per operand, how many leading stored dimensions are stacked as the matrix's rows (the
    rest are its columns); None: a 2-D array, read as stored."""
    sides: tuple[tuple[Side, Side], tuple[Side, Side]]
    """Per operand as used (op(A), op(B)): the names of its rows and of its columns. For
    ``gram``, ``sides[0]`` is X as used: (G's side, the summed side)."""

    @property
    def summed(self) -> Side:
        """The names op(A)'s columns carry: the dimensions summed over."""
        return self.sides[0][1]


def as_given(flags: tuple[bool, bool]) -> Orientation:
    """The transposes as given, of 2-D operands whose names are not read."""
    return _as_stored((), (), flags)


def stacked_name(side: Side) -> str | None:
    """One name for a side: its dimension's, or its stacked dimensions' joined by ``_``
    (``lat_lon``); None when any of them is unnamed."""
    if not side or any(n is None for n in side):
        return None
    return "_".join(n for n in side if n is not None)


def parse_names(text: str, flag: str) -> tuple[str, ...]:
    """``time`` or ``lat,lon``: one or more dimension names, each once."""
    names = tuple(n.strip() for n in str(text).split(","))
    if not all(names):
        raise UsageError(f"{flag} {text!r}: give dimension names separated by commas, e.g. time")
    if len(set(names)) != len(names):
        raise UsageError(f"{flag} {text!r} names a dimension twice")
    return names


def resolve_gram(names: Names, over: str | None, stack: str | None, rows: bool) -> Orientation:
    """X's orientation for ``G = op(A) @ op(B)``: Xᵀ·X when the summed dimensions lead X's
    stored order, X·Xᵀ (``--rows``) when they trail it. ``rows``: --rows was given."""
    if over is None and stack is None:
        return _as_stored(names, names, (not rows, rows))
    _need_names("X", names, "--over" if over is not None else "--stack")
    summed = _summed_for_gram(names, over, stack)
    split, leading = _place(names, summed, "X", _given(over, stack))
    if rows and leading:
        raise UsageError(
            f"{_given(over, stack)} contradicts --rows: X is {_text(names)}, so summing "
            f"{_list(summed)} is G = XᵀX; drop --rows"
        )
    flags = (leading, not leading)
    return _oriented((names, names), flags, (split, split))


def resolve_multiply(
    names: tuple[Names, Names],
    shapes: tuple[Sequence[int], Sequence[int]],
    over: str | None,
    given: tuple[bool, bool],
    same: bool = False,
) -> Orientation:
    """A's and B's orientation: with ``over``, each operand's named dimensions are the ones
    contracted (``given``: the --transpose flags passed, which must agree); without it, the
    flags stand, refused where 2-D operands share a name but another one is summed (``same``:
    A and B are one array, whose names are its own either way)."""
    if over is None:
        if not same:
            check_shared(names, given)
        return _as_stored(*names, given)
    for which, found in zip("AB", names, strict=True):
        _need_names(which, found, "--over")
    summed = parse_names(over, "--over")
    (split_a, lead_a), (split_b, lead_b) = (
        _place(found, summed, which, f"--over {over}")
        for which, found in zip("AB", names, strict=True)
    )
    flags = (lead_a, not lead_b)  # A's summed side is its columns, B's its rows
    for which, flag, on, asked in zip("AB", _FLAGS, flags, given, strict=True):
        if asked and not on:
            found = names[0] if which == "A" else names[1]
            raise UsageError(
                f"--over {over} contradicts {flag}: {which} is {_text(found)}, so "
                f"{_list(summed)} is summed as {which} is stored; drop {flag}"
            )
    _check_pairing(names, shapes, summed)
    return _oriented(names, flags, (split_a, split_b))


_FLAGS = ("--transpose-a", "--transpose-b")


def check_shared(names: tuple[Names, Names], transposed: tuple[bool, bool]) -> None:
    """Refuse 2-D operands whose contracted dimensions are named differently while a name they
    share is not the one summed (A (time, x) @ B (time, y)): the product would pair x with
    time. This tool's own placeholder names (``i``, ``j``) are no evidence either way."""
    a, b = names
    if len(a) != 2 or len(b) != 2:
        return
    ka, kb = a[0 if transposed[0] else 1], b[1 if transposed[1] else 0]
    if ka is None or kb is None or ka == kb:
        return
    shared = [n for n in a if n is not None and n in b and n not in DEFAULT_DIMENSIONS]
    if not shared:
        return
    name = shared[0]
    wanted = (a[0] == name, b[1] == name)
    flags = " ".join(
        flag if want else f"no {flag}"
        for flag, want, now in zip(_FLAGS, wanted, transposed, strict=True)
        if want != now
    )
    raise UsageError(
        f"A and B share the dimension {name!r}, but the product sums A's {ka!r} against B's "
        f"{kb!r}; pass --over {name} (or {flags})"
    )


def _as_stored(a: Names, b: Names, flags: tuple[bool, bool]) -> Orientation:
    """The flags as given; 2-D operands (N-D ones are refused where their specs are read)."""
    splits: tuple[int | None, int | None] = (None, None)
    return _oriented((a, b), flags, splits)


def _oriented(
    names: tuple[Names, Names], flags: tuple[bool, bool], splits: tuple[int | None, int | None]
) -> Orientation:
    sides = []
    for found, split, flag in zip(names, splits, flags, strict=True):
        cut = 1 if split is None else split
        rows, cols = tuple(found[:cut]), tuple(found[cut:])
        sides.append((cols, rows) if flag else (rows, cols))
    kept = tuple(None if len(n) == 2 else s for n, s in zip(names, splits, strict=True))
    return Orientation(flags, (kept[0], kept[1]), (sides[0], sides[1]))


def _summed_for_gram(names: Names, over: str | None, stack: str | None) -> tuple[str, ...]:
    """The summed dimensions, from --over, or the complement of --stack; both must agree."""
    summed = parse_names(over, "--over") if over is not None else None
    if stack is not None:
        indexed = parse_names(stack, "--stack")
        _check_named("X", names, indexed, "--stack")
        stored = tuple(n for n in names if n in indexed)
        if stored != indexed:  # G's positions follow the stored order; another would mislead
            raise UsageError(
                f"--stack {stack}: X stores them as ({', '.join(str(n) for n in stored)}), and G "
                "is indexed by them in stored order (read in place); pass --stack "
                f"{','.join(str(n) for n in stored)}, or rewrite X in the order you want"
            )
        rest = tuple(n for n in names if n is not None and n not in indexed)
        if summed is not None and set(summed) != set(rest):
            raise UsageError(
                f"--over {over} and --stack {stack} disagree: X is {_text(names)}, and --stack "
                f"{stack} sums {_list(rest)}; give one of them"
            )
        if not rest:
            raise UsageError(
                f"--stack {stack} names every dimension of X {_text(names)}; leave the summed "
                "ones out"
            )
        summed = rest
    assert summed is not None
    return summed


def _place(names: Names, summed: tuple[str, ...], which: str, given: str) -> tuple[int, bool]:
    """(the split, whether the summed dimensions lead): they must come first or last in the
    stored order, so each side is one C-order block."""
    _check_named(which, names, summed, given.split(" ")[0])
    if len(summed) == len(names):
        raise UsageError(
            f"{given} sums every dimension of {which} {_text(names)}; leave one for the "
            "product's side"
        )
    at = sorted(names.index(n) for n in summed)
    n, s = len(names), len(summed)
    if at == list(range(s)):
        return s, True
    if at == list(range(n - s, n)):
        return n - s, False
    order = [n for n in names if n in summed] + [n for n in names if n not in summed]
    raise UsageError(
        f"{given}: {which} is {_text(names)}, and the summed dimensions must be the first or the "
        "last ones in its stored order (each side of the matrix is read in place as a block of "
        f"whole rows); rewrite {which} with them first, e.g. "
        f"ds.transpose({', '.join(repr(x) for x in order)}).to_zarr(NEW_STORE)"
    )


def _check_named(which: str, names: Names, wanted: tuple[str, ...], flag: str) -> None:
    for name in wanted:
        count = names.count(name)
        if count == 0:
            raise UsageError(
                f"{flag} {name}: {which} has no dimension {name!r}; its dimensions are "
                f"{_text(names)}"
            )
        if count > 1:
            raise UsageError(
                f"{flag} {name}: {which} names {count} dimensions {name!r} {_text(names)}; "
                f"use {_instead(which)} instead"
            )


def _check_pairing(
    names: tuple[Names, Names], shapes: tuple[Sequence[int], Sequence[int]], summed: tuple[str, ...]
) -> None:
    """Stacked summed dimensions pair element by element only in the same order and lengths."""
    a, b = ([n for n in found if n in summed] for found in names)
    if a != b:
        raise UsageError(
            f"--over {','.join(summed)}: A stores them as ({', '.join(a)}) and B as "
            f"({', '.join(b)}), so their stacked positions would not pair; rewrite one of them "
            "in the other's order"
        )
    for name in a:
        la, lb = (int(s[found.index(name)]) for s, found in zip(shapes, names, strict=True))
        if la != lb:
            raise InputError(
                f"--over {','.join(summed)}: A's {name!r} has {la} elements and B's {lb}; "
                "they must be the same dimension"
            )


def _need_names(which: str, names: Names, flag: str) -> None:
    if all(n is None for n in names):
        raise UsageError(
            f"{flag} needs dimension names, and {which} has none (Zarr v3 dimension_names or "
            f"xarray's _ARRAY_DIMENSIONS); use {_instead(which)} instead"
        )


def _instead(which: str) -> str:
    """The flags that orient a product without names: gram's --rows, multiply's transposes."""
    return "--rows" if which == "X" else "--transpose-a/--transpose-b"


def _given(over: str | None, stack: str | None) -> str:
    return f"--over {over}" if over is not None else f"--stack {stack}"


def _text(names: Names) -> str:
    return "(" + ", ".join("?" if n is None else n for n in names) + ")"


def _list(names: Sequence[str | None]) -> str:
    return ", ".join(repr(n) for n in names)

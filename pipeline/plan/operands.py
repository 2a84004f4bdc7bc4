"""The operands as used (pure): op(A) and op(B) from the stored arrays and the transpose flags,
the refusal of shapes that don't contract (with the transposes that would), and the rules of
a symmetric (Gram) product's layout."""

from __future__ import annotations

from typing import Any

from pipeline.errors import InputError, UsageError
from pipeline.plan.spec import ArraySpec

FLAGS = ("--transpose-a", "--transpose-b")


def operands(
    a: ArraySpec, b: ArraySpec, transposed: tuple[bool, bool]
) -> tuple[ArraySpec, ArraySpec]:
    """op(A) and op(B): the stored specs, reversed where read transposed; refuses shapes
    that don't contract, naming the transposes that would."""
    check_contraction(a.shape, b.shape, transposed)
    op_a = a.transposed() if transposed[0] else a
    op_b = b.transposed() if transposed[1] else b
    return op_a, op_b


def check_contraction(
    a: tuple[int, ...], b: tuple[int, ...], transposed: tuple[bool, bool] = (False, False)
) -> None:
    """Refuse op(A) @ op(B) when op(A)'s columns differ from op(B)'s rows."""
    if len(a) != 2 or len(b) != 2:
        return  # the planner refuses non-2-D arrays with its own message
    op_a, op_b = _op(a, transposed[0]), _op(b, transposed[1])
    if op_a[1] == op_b[0]:
        return
    stored = f"A is {_text(a)} and B is {_text(b)}"
    if any(transposed):
        used = f"{_name('A', transposed[0])} is {_text(op_a)} and {_name('B', transposed[1])}"
        stored = f"{used} is {_text(op_b)} ({stored} as stored)"
    problem = (
        f"shapes do not contract: {stored}; {_name('A', transposed[0])}'s columns ({op_a[1]}) "
        f"must equal {_name('B', transposed[1])}'s rows ({op_b[0]})"
    )
    raise InputError(problem + _suggestion(a, b, transposed))


def _suggestion(a: tuple[int, ...], b: tuple[int, ...], given: tuple[bool, bool]) -> str:
    """``; --transpose-a would contract them (Aᵀ is 4096x32768)`` for each choice of flags
    that would, or how to transpose a copy when none would."""
    hints = []
    for flags in ((True, False), (False, True), (True, True), (False, False)):
        op_a, op_b = _op(a, flags[0]), _op(b, flags[1])
        if flags == given or op_a[1] != op_b[0]:
            continue
        named = " ".join(f for f, on in zip(FLAGS, flags, strict=True) if on) or "no transpose"
        shapes = [
            f"{_name(x, on)} is {_text(_op(s, on))}"
            for x, s, on in (("A", a, flags[0]), ("B", b, flags[1]))
            if on
        ]
        hints.append(f"{named} would contract them" + (f" ({', '.join(shapes)})" if shapes else ""))
    if not hints:
        return "; no transpose of A or B would contract them either: check the inputs"
    return "; " + "; ".join(hints)


def symmetric_layout(out: ArraySpec) -> None:
    """A Gram matrix lives on one grid both ways: square chunks (and shards), so a tile and
    its mirror are made of the same whole chunks."""
    for flag, pair in (("--chunks", out.chunks), ("--shards", out.shards)):
        if pair is not None and pair[0] != pair[1]:
            raise UsageError(
                f"gram writes G and its mirror on one grid, so {flag} must be square, not "
                f"{_text(pair)}; pass e.g. {flag} {_text((pair[0], pair[0]))}"
            )


def attributes(transposed: tuple[bool, bool], symmetric: bool) -> dict[str, Any]:
    """What OUT's ``tilegemm`` attributes record of the operation (only what is set), so
    ``verify`` checks the same product."""
    found: dict[str, Any] = {}
    for key, on in zip(("transpose_a", "transpose_b"), transposed, strict=True):
        if on:
            found[key] = True
    if symmetric:
        found["symmetric"] = True
    return found


def _op(shape: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    return tuple(reversed(shape)) if transposed else shape


def _name(which: str, transposed: bool) -> str:
    return f"{which}ᵀ" if transposed else which


def _text(shape: tuple[int, ...]) -> str:
    return "x".join(str(x) for x in shape)


def check_gram(urls: tuple[str, str, str], transposed: tuple[bool, bool]) -> None:
    """A Gram product reads one array as both operands, exactly one of them transposed."""
    if urls[0] != urls[1] or transposed[0] == transposed[1]:
        raise UsageError(
            "a symmetric product is X·Xᵀ or Xᵀ·X of one array X; use `gram X G [--rows]` "
            "(pipeline.gram) rather than symmetric=True"
        )

"""How a product option is declared: an ``Option`` in the ``Annotated`` type of a TypedDict field
(pipeline.options.product), read back in order with its name and its type as written."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ForwardRef, get_args, get_type_hints

MULTIPLY = "multiply"
GRAM = "gram"
PREPARE = "prepare"
"""Takes every declared option (``gram`` is ``prepare`` with some of them fixed)."""

Pair = str | Sequence[int]
"""``"RxC"`` or ``(rows, columns)``."""


@dataclass(frozen=True)
class Option:
    """One product option's declaration: the metadata of its ``ProductOptions`` field."""

    default: Any
    help: str
    """The command line's help, and the API's."""
    commands: tuple[str, ...] = (MULTIPLY, GRAM)
    """The products that take it, on the command line and in the API (``prepare``: all)."""
    cli: bool = True
    """A flag of its own (``flag``); False: the API's only, or built by the command line from
    arguments of its own (cluster, storage, progress)."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    """The values taken: argparse's choices, and ``unknown ...; choose ...`` in the API."""
    const: str | None = None
    """The value of the flag given alone (its value optional: ``--kinship [FORM]``)."""
    parse: Callable[[str], Any] | None = None
    """The command line's text to a value as argparse reads it (UsageError: its message)."""
    check: Callable[[Any, str], Any] | None = None
    """``prepare``'s check of a value (and the flag to name): the value used, or UsageError."""
    excludes: str | None = None
    """The option this one can't be given with."""
    carried_by: str | None = None
    """The ``JobOptions`` field that takes the checked value (default: its namesake, if any)."""
    name: str = ""
    """The keyword (the field's name)."""
    annotation: str = ""
    """The keyword's type as written, for signatures."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def declarations(options: type) -> tuple[Option, ...]:
    """The ``Option`` of each field of a TypedDict like ``PrepareOptions``, named, in order."""
    hints = get_type_hints(options, include_extras=True)
    found = []
    for name, hint in hints.items():
        option = next(m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Option))
        shown = _written(options.__annotations__[name], get_args(hint)[0])
        found.append(dataclasses.replace(option, name=name, annotation=shown))
    return tuple(found)


def _written(raw: object, kind: object) -> str:
    """A field's type as its source writes it (``DTypeLike | None``, not numpy's long union)."""
    text = raw.__forward_arg__ if isinstance(raw, ForwardRef) else raw
    if isinstance(text, str):
        tree = ast.parse(text, mode="eval").body
        if isinstance(tree, ast.Subscript) and isinstance(tree.slice, ast.Tuple):
            return ast.unparse(tree.slice.elts[0])
    return inspect.formatannotation(kind)

"""A PipelineError in its reader's words. Messages are written once, naming the command line's
flags (``pass --overwrite``); a Python caller gave keywords, so the API's doors (``door``:
prepare, multiply, gram, a job's methods, verify_product) rewrite the message on its way out
(``pass overwrite=True``). The command line runs its commands under ``cli_spelling()``, and its
messages keep their flags."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from cluster.spec import ClusterSpec
from pipeline.errors import PipelineError
from pipeline.options.declaration import Option

F = TypeVar("F", bound=Callable[..., Any])

_READER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tilegemm_reader", default=None
)
"""Who reads this context's errors: "cli", "python" (set by the outermost door), or None."""

FLAG = re.compile(
    r"(?<![^\s(\[{])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?=$|[\s,;:)\]}=]|\.(?:\s|$)|'s\b)"
)
"""A flag standing alone in prose: never part of a path or URL (``x--resume.zarr``,
``s3://b/--resume``), nor a quoted value."""
COMMAND = re.compile(r"(?:python -m pipeline )?(multiply|gram|verify)((?: +\S+)*) *")
"""A command line of ours quoted in a message: `multiply A B OUT --transpose-a`."""
VALUE = re.compile(r" (?P<v>'[^'\n]*'|\"[^\"\n]*\"|[^\s,;)\]]+)")
"""The word after a flag: quoted, or up to a space or the punctuation that ends it."""
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|\.\.\.")
"""A metavar (ADDRESS, OUT) or ``...``: shown as it is."""
NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:e-?\d+)?")
PAIR = re.compile(r"(\d+)x(\d+)")
PAIRS = ("chunks", "shards")
"""Keywords that take ``(rows, columns)``."""
CALLS = {
    "multiply": "pipeline.multiply",
    "gram": "pipeline.gram",
    "verify": "pipeline.verify_product",
}

PHRASES = {
    "--dry-run": "pipeline.prepare(...)",
    "--help": "help(pipeline.multiply)",
    "--debug": 'logging.getLogger("pipeline").setLevel("DEBUG")',
    "--no-progress": "progress=False",
    "--transpose": "transpose_a=/transpose_b=",
}
"""The command line's flags without a keyword of their own, and what stands for them."""
OWN_KEYWORDS = {"rows": False, "rounds": True, "seed": True}
"""Keywords of gram and verify_product that no product option declares: takes a value?"""


@dataclass(frozen=True)
class _Keyword:
    """What a flag is in Python."""

    name: str
    """The keyword: ``overwrite``, ``cluster``, ``storage_options``."""
    valued: bool = True
    """``name=VALUE``; False: ``name=True``."""
    field: str = ""
    """``cluster``'s ClusterSpec field; ``*`` for ``storage_options``' KEY=VALUE."""
    choices: tuple[str, ...] = ()
    phrase: str = ""
    """Text that stands for the flag (no keyword takes it)."""
    switch: bool = False
    """A flag whose value is optional (``--kinship [FORM]``): alone, ``name=True``."""


@contextlib.contextmanager
def cli_spelling() -> Iterator[None]:
    """Errors raised inside keep their flags: the command line's reader typed them."""
    token = _READER.set("cli")
    try:
        yield
    finally:
        _READER.reset(token)


def door(func: F, options: Callable[[], Sequence[Option]]) -> F:
    """``func`` for a Python caller: a PipelineError it raises names keywords, not flags
    (same exception, same class and attributes, its message respelled). Inner doors and the
    command line's calls (``cli_spelling``) pass errors on as they are."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _READER.get() is not None:
            return func(*args, **kwargs)
        token = _READER.set("python")
        try:
            return func(*args, **kwargs)
        except PipelineError as e:
            if e.args and isinstance(e.args[0], str):
                e.args = (python_spelling(e.args[0], options()), *e.args[1:])
            raise
        finally:
            _READER.reset(token)

    return cast(F, call)


def python_spelling(message: str, options: Sequence[Option]) -> str:
    """``message`` with each flag of ours as a Python caller spells it (``--resume`` ->
    ``resume=True``, ``--dtype int32`` -> ``dtype='int32'``, ``--chunks`` -> ``chunks``) and
    each command line of ours quoted in backticks as a call; other tools' commands and flags,
    paths and URLs stay as they are."""
    keywords = _keywords(options)
    parts = re.split(r"(`[^`\n]*`)", message)
    return "".join(
        _command(part, keywords) if i % 2 else _prose(part, keywords)
        for i, part in enumerate(parts)
    )


def _keywords(options: Sequence[Option]) -> dict[str, _Keyword]:
    found = {
        o.flag: _Keyword(
            o.name,
            not isinstance(o.default, bool) or o.const is not None,
            "",
            o.choices or (),
            switch=o.const is not None,
        )
        for o in options
    }
    for f in dataclasses.fields(ClusterSpec):
        found["--" + f.name.replace("_", "-")] = _Keyword("cluster", field=f.name)
    found["--storage-option"] = _Keyword("storage_options", field="*")
    found |= {f"--{name}": _Keyword(name, valued) for name, valued in OWN_KEYWORDS.items()}
    found |= {flag: _Keyword("", phrase=text) for flag, text in PHRASES.items()}
    return found


def _prose(text: str, keywords: dict[str, _Keyword]) -> str:
    out, pos = [], 0
    while found := FLAG.search(text, pos):
        keyword = keywords.get(found.group())
        if keyword is None:  # another tool's flag
            out.append(text[pos : found.end()])
            pos = found.end()
            continue
        out.append(text[pos : found.start()])
        if text.startswith("'s", found.end()):  # --report's folder: the report's folder
            out.append(keyword.phrase or keyword.name)
            pos = found.end()
            continue
        given, pos = _prose_value(text, found.end(), keyword)
        run = [(keyword, given)]
        # Flags of one container side by side (--storage-option k=v --storage-option s=v) are
        # one keyword in Python.
        while keyword.field and (more := FLAG.match(text, _after_spaces(text, pos))):
            following = keywords.get(more.group())
            if following is None or following.name != keyword.name:
                break
            given, pos = _prose_value(text, more.end(), following)
            run.append((following, given))
        out.append(_render(run))
    out.append(text[pos:])
    return "".join(out)


def _after_spaces(text: str, pos: int) -> int:
    return len(text) - len(text[pos:].lstrip(" "))


def _prose_value(text: str, pos: int, keyword: _Keyword) -> tuple[str | None, int]:
    """The value written after a flag at ``pos`` (a word that reads as a value, not prose),
    and where the text goes on."""
    if not keyword.valued or keyword.phrase:
        return None, pos
    found = VALUE.match(text, pos)
    if found is None:
        return None, pos
    value = found["v"]
    if value.endswith((".", ":")) and not value.endswith(".."):  # the sentence's, not the value's
        value = value[:-1]
    if not _reads_as_value(keyword, value):
        return None, pos
    return value, found.start("v") + len(value)


def _reads_as_value(keyword: _Keyword, text: str) -> bool:
    if keyword.field == "*":  # KEY=VALUE, or a key such as endpoint_url
        return "=" in text or "_" in text
    return bool(
        text in keyword.choices
        or QUOTED.fullmatch(text)
        or PLACEHOLDER.fullmatch(text)
        or re.search(r"[\d/.:=]", text)
    )


def _command(span: str, keywords: dict[str, _Keyword]) -> str:
    """A quoted command line of ours as a call, e.g. `pipeline.multiply(A, B, OUT,
    transpose_a=True)`; anything else (another tool's command) as it is."""
    found = COMMAND.fullmatch(span[1:-1])
    if found is None:
        return span
    tokens = found[2].split()
    if not tokens:
        return f"`{CALLS[found[1]]}`"
    args: list[tuple[str, bool]] = [("client", False)] if found[1] == "verify" else []
    # cluster's and storage_options' flags, each one keyword at the end
    runs: dict[str, list[tuple[_Keyword, str | None]]] = {}
    while tokens:
        token = tokens.pop(0)
        optional, bare = token.startswith("["), token.strip("[]")
        if not bare.startswith("--"):
            args.append((_shown(bare), optional))
            continue
        keyword = keywords.get(bare)
        if keyword is None or keyword.phrase:
            return span  # not a flag a call takes: left as written
        valued = keyword.valued and tokens and not tokens[0].startswith(("--", "[--"))
        given = tokens.pop(0).strip("[]") if valued else None
        if keyword.field:
            runs.setdefault(keyword.name, []).append((keyword, given))
            continue
        args.append((_render([(keyword, given)]), optional))
    args += [(_render(run), False) for run in runs.values()]
    listed = ""
    for text, optional in args:
        item = f"{', ' if listed else ''}{text}"
        listed += f"[{item}]" if optional else item
    return f"`{CALLS[found[1]]}({listed})`"


def _shown(word: str) -> str:
    """A positional argument: a placeholder as it is, a path as a string."""
    return word if PLACEHOLDER.fullmatch(word) else repr(word)


def _render(run: list[tuple[_Keyword, str | None]]) -> str:
    """One keyword: ``overwrite=True``, ``dtype='int32'``, ``chunks`` (named, no value),
    ``cluster=ClusterSpec(workers=2)``, ``storage_options={'anon': True}``."""
    keyword = run[0][0]
    if keyword.phrase:
        return keyword.phrase
    if not keyword.valued:
        return f"{keyword.name}=True"
    if keyword.field == "*":
        items = [_storage_item(given) for _, given in run if given is not None]
        return f"{keyword.name}={{{', '.join(items)}}}" if items else f"{keyword.name}="
    if keyword.field:
        fields = (f"{k.field}={'...' if v is None else _value(k, v)}" for k, v in run)
        return f"cluster=ClusterSpec({', '.join(fields)})"
    given = run[0][1]
    if given is None and keyword.switch:
        return f"{keyword.name}=True"
    return keyword.name if given is None else f"{keyword.name}={_value(keyword, given)}"


def _value(keyword: _Keyword, text: str) -> str:
    if QUOTED.fullmatch(text) or PLACEHOLDER.fullmatch(text) or NUMBER.fullmatch(text):
        return text
    if (pair := PAIR.fullmatch(text)) and keyword.name in PAIRS:
        return f"({pair[1]}, {pair[2]})"
    return repr(text)


def _storage_item(text: str) -> str:
    """``key=value`` (or a key alone) as a dict item, as the command line reads the value."""
    key, _, value = text.partition("=")
    literals = {"true": "True", "false": "False", "none": "None"}
    if not value or value == "...":
        shown = "..."
    elif value.lower() in literals:
        shown = literals[value.lower()]
    else:
        shown = value if NUMBER.fullmatch(value) else repr(value)
    return f"{key!r}: {shown}"

"""Storage options from a JSON file (``--storage-options-file``) or ``$TILEGEMM_STORAGE_OPTIONS``,
so secrets stay off the command line: read within a bound, refused when malformed."""

from __future__ import annotations

import json
import logging
import os
import stat
from typing import Any

from pipeline.errors import UsageError
from pipeline.sensitive.values import has_secrets
from pipeline.store import deputy

log = logging.getLogger("pipeline")

ENV = "TILEGEMM_STORAGE_OPTIONS"
"""Environment variable holding a JSON object of storage options (the CLI reads it)."""
OPTIONS_MAX_BYTES = 1 << 20
"""The most a storage-options file, or ``$TILEGEMM_STORAGE_OPTIONS``, may hold (a few hundred
bytes is usual): a link to /dev/zero or a huge file is refused, not read into memory."""
OPTIONS_MAX_DEPTH = 32
"""The deepest nesting of objects and lists taken (fsspec's options nest two or three deep:
``client_kwargs``, ``config_kwargs``): deeper is refused, not left to Python's recursion."""
EXAMPLE = 'give a JSON object such as {"key": "...", "secret": "..."}'


def options_from_env() -> dict[str, Any]:
    """Storage options from ``$TILEGEMM_STORAGE_OPTIONS`` (a JSON object), or none."""
    text = os.environ.get(ENV)
    if text and len(text) > OPTIONS_MAX_BYTES:
        raise UsageError(f"${ENV} holds more than {OPTIONS_MAX_BYTES:,} characters; {EXAMPLE}")
    return {} if not text else _json_object(text, f"${ENV}")


def options_from_file(path: str) -> dict[str, Any]:
    """Storage options from a JSON file (a regular file of at most OPTIONS_MAX_BYTES); a
    warning when it holds secrets others can read."""
    source = f"--storage-options-file {path}"
    try:
        data, mode = read_small_file(path, OPTIONS_MAX_BYTES)
    except NotReadable as e:
        raise UsageError(f"{source} {e}; {EXAMPLE}") from None
    except OSError as e:
        raise UsageError(f"{source} cannot be read ({e.strerror}); {EXAMPLE}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{source} is not UTF-8 text; {EXAMPLE}") from None
    options = _json_object(text, source)
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and has_secrets(options):
        log.warning(
            "--storage-options-file %s holds secrets and other users may read it "
            "(mode %s); chmod 600 %s",
            path,
            oct(stat.S_IMODE(mode)),
            path,
        )
    return options


class NotReadable(ValueError):
    """A small file that is not a regular file, or larger than it may be."""


def read_small_file(path: str, limit: int) -> tuple[bytes, int]:
    """The bytes and mode of the regular file at ``path`` (links followed); NotReadable when
    it is something else or holds more than ``limit`` bytes, OSError when it can't be read."""
    # A look before the open (opening some devices acts), then the open file's own: opened
    # with O_NONBLOCK, a FIFO swapped in between cannot block the open.
    _regular(os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        opened = os.fstat(fd)
        mode = opened.st_mode
        _regular(mode)
        problem = deputy.refusal(path, opened)
        if problem is not None:  # another user's link must not hand over the caller's file
            raise NotReadable(f"is {problem}")
        pieces, left = [], limit + 1
        while left > 0 and (piece := os.read(fd, left)):
            pieces.append(piece)
            left -= len(piece)
    finally:
        os.close(fd)
    if left <= 0:
        raise NotReadable(f"holds more than {limit:,} bytes")
    return b"".join(pieces), mode


def _regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
        kind = next((k for test, k in kinds if test(mode)), "a device or special file")
        raise NotReadable(f"is {kind}, not a regular file")


def _json_object(text: str, source: str) -> dict[str, Any]:
    try:
        options = json.loads(text)
        deep = _depth(options) > OPTIONS_MAX_DEPTH
    except json.JSONDecodeError as e:
        # The message has no part of the text: a secret may be where it fails.
        raise UsageError(
            f"{source} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); give "
            'an object such as {"key": "...", "secret": "..."}'
        ) from None
    except RecursionError:  # nested past the parser's own limit
        deep = True
    if deep:
        raise UsageError(
            f"{source} nests objects or lists more than {OPTIONS_MAX_DEPTH} deep; {EXAMPLE}"
        ) from None
    if not isinstance(options, dict):
        raise UsageError(
            f"{source} holds a JSON {type(options).__name__}, not an object; give e.g. "
            '{"key": "...", "secret": "..."}'
        )
    return options


def _depth(value: Any) -> int:
    """How deep ``value`` nests objects and lists (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            todo.extend((child, depth + 1) for child in children)
    return deepest


def merged(*sources: dict[str, Any]) -> dict[str, Any]:
    """Later sources override earlier ones key by key (nested dicts merged too)."""
    out: dict[str, Any] = {}
    for source in sources:
        for key, value in source.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                value = merged(out[key], value)
            out[key] = value
    return out

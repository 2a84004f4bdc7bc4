"""Sensitive storage options — keys, secrets, tokens, passwords — hidden wherever they could be
shown (reprs, messages, logs, tracebacks), taken from a file or the environment so they stay
off the command line, and warned about when they would travel to a scheduler unencrypted. The
secret parts of URLs (``user:PASSWORD@``, ``?X-Amz-Signature=``, ``&sig=``, ``&token=``, ...)
are hidden the same way (``redact_url``).

Pure: the standard library only (the plan's specs use ``redacted_repr``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import traceback
from collections.abc import Iterable
from typing import Any

from pipeline.errors import UsageError
from pipeline.redaction import (
    HIDDEN,
    SHORTEST_SCRUBBED,
    is_sensitive,
    redact_url,
    url_secrets,
)

log = logging.getLogger("pipeline")

ENV = "TILEGEMM_STORAGE_OPTIONS"
"""Environment variable holding a JSON object of storage options (the CLI reads it)."""
PLAIN = ("tcp", "ws")
"""Scheduler address schemes that carry tasks unencrypted."""


def redact(value: Any) -> Any:
    """``value`` with every sensitive option's value replaced by ``***`` (nested dicts and
    lists too) and passwords in URLs (``https://user:PASSWORD@host``) hidden."""
    if isinstance(value, dict):
        return {
            k: HIDDEN if is_sensitive(k) and v is not None else redact(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str):
        return redact_url(value)
    return value


def secret_values(options: Any, inside: bool = False) -> set[str]:
    """The strings to hide in free text (an exception's message, a log line)."""
    found: set[str] = set()
    if isinstance(options, dict):
        for k, v in options.items():
            found |= secret_values(v, inside or is_sensitive(k))
    elif isinstance(options, list | tuple):
        for v in options:
            found |= secret_values(v, inside)
    elif options is not None and not isinstance(options, bool):
        text = str(options)
        found |= {text} if inside else url_secrets(text)
    return {s for s in found if len(s) >= SHORTEST_SCRUBBED}


def has_secrets(options: dict[str, Any]) -> bool:
    return bool(redact(options) != options)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***`` (longest first), and the secret
    parts of any URL in it too (``redact_url``)."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return redact_url(text)


def redacted_repr(self: Any) -> str:
    """A dataclass's repr with its ``metadata={"sensitive": True}`` fields redacted; set it as
    ``__repr__`` in the class body (the dataclass then keeps it)."""
    shown = []
    for f in dataclasses.fields(self):
        if f.repr:
            value = getattr(self, f.name)
            text = redact(value) if f.metadata.get("sensitive") else redact_url(repr(value))
            shown.append(f"{f.name}={text}")
    return f"{type(self).__qualname__}({', '.join(shown)})"


SENSITIVE_FIELD: dict[str, Any] = {"sensitive": True}
"""``field(metadata=SENSITIVE_FIELD)`` for options that may hold secrets."""


class ScrubLogs(logging.Filter):
    """A handler filter hiding ``secrets``, and the secret parts of URLs, in every record it
    passes (and its traceback)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = set(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed call: logging reports it, not us
            return True
        shown = scrub(message, self.secrets)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info and record.exc_info[0] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            hidden = scrub(text, self.secrets)
            if hidden != text:
                record.exc_info, record.exc_text = None, hidden
        elif record.exc_text:
            record.exc_text = scrub(record.exc_text, self.secrets)
        return True


log.addFilter(ScrubLogs(()))  # URLs' secrets hidden in our log lines for API callers too


def exposure_warning(address: str, options: dict[str, Any]) -> str | None:
    """What to say when storage options with secrets go, inside every task, to a scheduler
    reached without encryption (any client of that scheduler can read the tasks)."""
    scheme = address.split("://", 1)[0] if "://" in address else "tcp"  # distributed's default
    if not address or scheme not in PLAIN or not has_secrets(options):
        return None
    hidden = sorted(k for k, v in redact(options).items() if v != options[k])
    return (
        f"storage options {', '.join(hidden)} hold secrets that go to the scheduler at "
        f"{address} unencrypted, inside every task, readable by any client of it; use a tls:// "
        "scheduler, or give the workers their own credentials (AWS_* or FSSPEC_S3_* variables, "
        "~/.config/fsspec, an instance role) instead of storage options"
    )


def warn_if_exposed(client: Any, options: dict[str, Any]) -> None:
    """One log line when ``client`` (a distributed Client) reaches its scheduler in the clear
    and ``options`` hold secrets."""
    address = getattr(getattr(client, "scheduler", None), "address", None)
    warning = exposure_warning(str(address or ""), options)
    if warning:
        log.warning("%s", warning)


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
        data, mode = _read_options(path, source)
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


def _read_options(path: str, source: str) -> tuple[bytes, int]:
    """The bytes and mode of the regular file at ``path`` (links followed), refused when it
    is something else or larger than OPTIONS_MAX_BYTES."""
    # A look before the open (opening some devices acts), then the open file's own: opened
    # with O_NONBLOCK, a FIFO swapped in between cannot block the open.
    _regular(os.stat(path).st_mode, source)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        _regular(mode, source)
        pieces, left = [], OPTIONS_MAX_BYTES + 1
        while left > 0 and (piece := os.read(fd, left)):
            pieces.append(piece)
            left -= len(piece)
    finally:
        os.close(fd)
    if left <= 0:
        raise UsageError(f"{source} holds more than {OPTIONS_MAX_BYTES:,} bytes; {EXAMPLE}")
    return b"".join(pieces), mode


def _regular(mode: int, source: str) -> None:
    if not stat.S_ISREG(mode):
        kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
        kind = next((k for test, k in kinds if test(mode)), "a device or special file")
        raise UsageError(f"{source} is {kind}, not a regular file; {EXAMPLE}")


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

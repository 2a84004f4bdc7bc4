"""Sensitive storage options — keys, secrets, tokens, passwords — hidden wherever they could be
shown (reprs, messages, logs, tracebacks), taken from a file or the environment so they stay
off the command line, and warned about when they would travel to a scheduler unencrypted.

Pure: the standard library only (the plan's specs use ``redacted_repr``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import stat
import traceback
from collections.abc import Iterable
from typing import Any

from pipeline.errors import UsageError

log = logging.getLogger("pipeline")

SENSITIVE = re.compile(
    r"key|secret|token|passw|credential|auth|signature|connection.?string|private", re.I
)
"""Option names whose values are hidden: ``key``, ``secret``, ``session_token``,
``account_key``, ``password``, ``Authorization`` (in ``headers``), ... at any depth."""
HIDDEN = "***"
SHORTEST_SCRUBBED = 4
"""Shorter values are not searched for in free text: hiding every "ab" would garble it."""
ENV = "TILEGEMM_STORAGE_OPTIONS"
"""Environment variable holding a JSON object of storage options (the CLI reads it)."""
PLAIN = ("tcp", "ws")
"""Scheduler address schemes that carry tasks unencrypted."""
_USERINFO = re.compile(r"(://[^/@:\s]*:)([^/@\s]+)@")


def is_sensitive(key: object) -> bool:
    return bool(SENSITIVE.search(str(key)))


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
        return _USERINFO.sub(rf"\1{HIDDEN}@", value)
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
        found |= {text} if inside else {m.group(2) for m in _USERINFO.finditer(text)}
    return {s for s in found if len(s) >= SHORTEST_SCRUBBED}


def has_secrets(options: dict[str, Any]) -> bool:
    return bool(redact(options) != options)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***`` (longest first)."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text


def redacted_repr(self: Any) -> str:
    """A dataclass's repr with its ``metadata={"sensitive": True}`` fields redacted; set it as
    ``__repr__`` in the class body (the dataclass then keeps it)."""
    shown = []
    for f in dataclasses.fields(self):
        if f.repr:
            value = getattr(self, f.name)
            shown.append(f"{f.name}={redact(value) if f.metadata.get('sensitive') else value!r}")
    return f"{type(self).__qualname__}({', '.join(shown)})"


SENSITIVE_FIELD: dict[str, Any] = {"sensitive": True}
"""``field(metadata=SENSITIVE_FIELD)`` for options that may hold secrets."""


class ScrubLogs(logging.Filter):
    """A handler filter hiding ``secrets`` in every record it passes (and its traceback)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = set(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed call: logging reports it, not us
            return True
        record.msg, record.args = scrub(message, self.secrets), None
        if record.exc_info and record.exc_info[0] is not None:
            text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_info, record.exc_text = None, scrub(text.rstrip("\n"), self.secrets)
        return True


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


def options_from_env() -> dict[str, Any]:
    """Storage options from ``$TILEGEMM_STORAGE_OPTIONS`` (a JSON object), or none."""
    text = os.environ.get(ENV)
    return {} if not text else _json_object(text, f"${ENV}")


def options_from_file(path: str) -> dict[str, Any]:
    """Storage options from a JSON file; a warning when it holds secrets others can read."""
    try:
        with open(path, encoding="utf-8") as f:
            options = _json_object(f.read(), f"--storage-options-file {path}")
            mode = os.fstat(f.fileno()).st_mode
    except OSError as e:
        raise UsageError(
            f"--storage-options-file {path} cannot be read ({e.strerror}); give a JSON file "
            'such as {"key": "...", "secret": "..."}'
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and has_secrets(options):
        log.warning(
            "--storage-options-file %s holds secrets and other users may read it "
            "(mode %s); chmod 600 %s",
            path,
            oct(stat.S_IMODE(mode)),
            path,
        )
    return options


def _json_object(text: str, source: str) -> dict[str, Any]:
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        # The message has no part of the text: a secret may be where it fails.
        raise UsageError(
            f"{source} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); give "
            'an object such as {"key": "...", "secret": "..."}'
        ) from None
    if not isinstance(options, dict):
        raise UsageError(
            f"{source} holds a JSON {type(options).__name__}, not an object; give e.g. "
            '{"key": "...", "secret": "..."}'
        )
    return options


def merged(*sources: dict[str, Any]) -> dict[str, Any]:
    """Later sources override earlier ones key by key (nested dicts merged too)."""
    out: dict[str, Any] = {}
    for source in sources:
        for key, value in source.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                value = merged(out[key], value)
            out[key] = value
    return out

"""Sensitive storage options — keys, secrets, tokens, passwords — hidden wherever they could be
shown (reprs, messages, logs, tracebacks), and warned about when they would travel to a
scheduler unencrypted. The secret parts of URLs (``user:PASSWORD@``, ``?X-Amz-Signature=``,
``&sig=``, ``&token=``, ...) are hidden the same way (``redact_url``).

Pure: the standard library only (the plan's specs use ``redacted_repr``).
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Iterable
from typing import Any

from pipeline.sensitive.text import (
    HIDDEN,
    SHORTEST_SCRUBBED,
    is_sensitive,
    redact_url,
    url_secrets,
)

log = logging.getLogger("pipeline")

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

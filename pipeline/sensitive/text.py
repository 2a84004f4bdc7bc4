"""The secret parts of text: which option names hold secrets, and a URL's password,
signature and token parameters (``user:PASSWORD@``, ``?X-Amz-Signature=``, ``&sig=``,
``&token=``, ...) hidden as ``***`` wherever a URL is shown. Standard library only: the error
messages themselves use it."""

from __future__ import annotations

import re
import urllib.parse

SENSITIVE = re.compile(
    r"key|secret|token|passw|credential|auth|signature|connection.?string|private", re.I
)
"""Option names whose values are hidden: ``key``, ``secret``, ``session_token``,
``account_key``, ``password``, ``Authorization`` (in ``headers``), ... at any depth."""
HIDDEN = "***"
SHORTEST_SCRUBBED = 4
"""Shorter values are not searched for in free text: hiding every "ab" would garble it."""
_USERINFO = re.compile(r"(://[^/@:\s]*:)([^/\s]+)@")
"""A URL's ``user:PASSWORD@`` (to the last ``@`` before the path: a password may hold one)."""
_QUERY_PARAM = re.compile(r"([?&])([^=&#?\s'\"]+)=([^&#\s'\"<>()\[\]{},\\]*)")
"""A URL's ``?name=value`` or ``&name=value``, in a URL or in free text holding one."""
SECRET_PARAMS = ("sig", "code")
"""Query parameters that carry a secret whose names ``SENSITIVE`` misses (Azure's SAS
signature, Azure Functions' key); ``X-Amz-Signature``, ``X-Amz-Credential``,
``X-Amz-Security-Token``, ``AWSAccessKeyId``, ``Signature``, ``token``, ``access_token``,
``key``, ``api_key``, ``apikey``, ``password`` are sensitive names already."""


def is_sensitive(key: object) -> bool:
    return bool(SENSITIVE.search(str(key)))


def is_secret_param(name: str) -> bool:
    """A URL query parameter whose value is a credential, a token or a signature."""
    return is_sensitive(name) or name.lower() in SECRET_PARAMS


def redact_url(url: str) -> str:
    """``url`` with its secret parts replaced by ``***``: the password of ``user:PASSWORD@``
    and the values of credential, token and signature query parameters (``?X-Amz-Signature=``,
    ``&sig=``, ``&token=``, ...). Any text holding URLs (a message, a log line) works too."""
    url = _USERINFO.sub(rf"\1{HIDDEN}@", url)
    return _QUERY_PARAM.sub(_hide_param, url)


def _hide_param(found: re.Match[str]) -> str:
    start, name, value = found.groups()
    return f"{start}{name}={HIDDEN}" if value and is_secret_param(name) else found.group(0)


def url_secrets(url: str) -> set[str]:
    """The secret parts of the URLs in ``url`` as they may appear elsewhere in free text (a
    library's message may quote them outside the URL: ``bucket name "user:PASSWORD@b"``),
    also percent-decoded."""
    found = {m.group(2) for m in _USERINFO.finditer(url)}
    found |= {v for _, n, v in _QUERY_PARAM.findall(url) if v and is_secret_param(n)}
    found |= {urllib.parse.unquote_plus(s) for s in found}
    return {s for s in found if len(s) >= SHORTEST_SCRUBBED and s != HIDDEN}

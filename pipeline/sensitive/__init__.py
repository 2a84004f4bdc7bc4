"""Secrets kept out of sight: the secret parts of text and URLs (``text``, the bottom of the
package, used by every error message) and sensitive storage options in reprs, logs and
tracebacks (``values``)."""

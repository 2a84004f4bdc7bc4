"""Stdout for a reader that stops early: the rest of the output goes nowhere, quietly.

``tilegemm multiply A B C --dry-run | head -1`` ends with the command's own exit code, not a
BrokenPipeError (a verification that failed still exits 1)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class Forgiving:
    """``sys.stdout`` whose writes go to /dev/null once the reader has gone."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        """Point the stream's file at /dev/null: what is still buffered goes nowhere, instead
        of raising again when the interpreter flushes it at exit."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self._stream, name)


@contextlib.contextmanager
def forgiving() -> Iterator[None]:
    """``sys.stdout`` forgiving a reader that has gone, for the command's run; flushed inside,
    so a reader gone is met here, not at exit."""
    given = sys.stdout
    sys.stdout = Forgiving(given)
    try:
        yield
        sys.stdout.flush()
    finally:
        sys.stdout = given

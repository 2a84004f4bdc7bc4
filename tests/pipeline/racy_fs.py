"""A file system without conditional writes, for lock races between real processes.

``racy://PATH`` is the local disk, except that ``pipe_file(mode="create")`` checks, then writes,
as fsspec does for stores with no ``If-None-Match`` -- with the gap between the two widened, and
every read slowed by as much, so jobs started together all pass the check, all write, and only
then read back. Each write replaces the whole file at once, as an object store's put does: the
race is in the check, not in torn objects. ``register()`` in each process that opens such a URL.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

GAP = 0.3
"""Seconds between the existence check and the write, and before every read."""


class RacyFileSystem(LocalFileSystem):
    protocol = ("racy",)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if mode == "create" and self.exists(path):
            raise FileExistsError(path)
        time.sleep(GAP)
        local = self._strip_protocol(path)
        staged = f"{local}.{uuid.uuid4().hex}.put"
        with open(staged, "wb") as f:
            f.write(value)
        os.replace(staged, local)

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> Any:
        time.sleep(GAP)
        return super().cat_file(path, start, end, **kwargs)


def register() -> None:
    fsspec.register_implementation("racy", RacyFileSystem, clobber=True)

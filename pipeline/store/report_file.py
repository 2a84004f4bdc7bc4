"""Where ``--report`` may go: never onto or inside an input or OUT, never over a file that is
not a report this tool (or distributed) wrote."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec

from pipeline.errors import ArgumentTypeError, UnsafeOutputError, UsageError
from pipeline.store.door import Door
from pipeline.store.fs import (
    check_credentials,
    inside,
    local_path,
    location,
    resolve_url,
    url_to_fs,
)

log = logging.getLogger("pipeline")
REPORT_MARKS = (b"<title>Dask Performance Report</title>", b'id="tilegemm-accounting"')
"""What a report of ours holds near its start (distributed's title, our section)."""
HEAD_BYTES = 1 << 16
REPORT_BYTES = 1 << 30
"""A report is read back (to add our section) only up to this size."""


def check_report(report: str, stores: dict[str, str], storage_options: dict[str, Any]) -> str:
    """The report's resolved location, refused when it is (or is inside) one of ``stores``
    (name -> URL) or would replace a file that is not one of our reports."""
    report = _path_text(report)
    check_credentials(report, "--report")
    url = resolve_url(report, "--report")
    key = location(url, storage_options)
    for name, store in stores.items():
        other = location(store, storage_options)
        if key == other or inside(key, other):
            raise UnsafeOutputError(
                f"--report {report} is {'inside ' if key != other else ''}{name} ({store}); "
                "the report is written beside the arrays, never into them: give a path such "
                "as report.html outside every array"
            )
    folder = local_path(url)
    if folder is not None and not os.access(os.path.dirname(folder), os.W_OK):
        raise UsageError(
            f"--report {report}: its folder {os.path.dirname(folder)} is missing or not "
            "writable; create it or give another path"
        )
    if folder is not None and os.path.isdir(folder):
        raise UsageError(f"--report {report} is a folder; give a file name such as report.html")
    if folder is not None:
        _check_local(report, folder)
    head = _head(url, storage_options)
    if head is None:
        return url
    _check_ours(head, report)
    log.info("--report: replacing the earlier report %s", url)
    return url


@contextlib.contextmanager
def staged(url: str) -> Iterator[str]:
    """A private path for distributed to write a local report to; once it is written, it is
    placed at ``url`` through its folder's door (never through a link planted meanwhile, never
    over a file that is not a report of ours). Other URLs are written where they are."""
    local = local_path(url)
    if local is None:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="tilegemm-report-") as folder:
        path = os.path.join(folder, "report.html")
        yield path
        if os.path.exists(path):
            with open(path, "rb") as f:
                write_report(url, f.read(), {})


def read_report(url: str, storage_options: dict[str, Any] | None) -> bytes:
    local = local_path(url)
    if local is not None:
        data = _door(local).read(os.path.basename(local), REPORT_BYTES)
        return data or b""
    with fsspec.open(url, "rb", **(storage_options or {})) as f:
        return bytes(f.read())


def write_report(url: str, data: bytes, storage_options: dict[str, Any] | None) -> None:
    """Write the report at ``url``: a local one only over nothing or a report of ours."""
    local = local_path(url)
    if local is None:
        with fsspec.open(url, "wb", **(storage_options or {})) as f:
            f.write(data)
        return
    head = _head(url, storage_options)
    if head is not None:
        _check_ours(head, url)
    _door(local).write(os.path.basename(local), data)


def _head(url: str, storage_options: dict[str, Any] | None) -> bytes | None:
    """The first HEAD_BYTES of the file at ``url`` (None: there is none); a local link,
    folder or special file is refused, never opened."""
    local = local_path(url)
    if local is not None:
        return _door(local).read_head(os.path.basename(local), HEAD_BYTES)
    fs, path = url_to_fs(url, storage_options)
    if not fs.exists(path):
        return None
    if fs.isdir(path):
        raise UsageError(f"--report {url} is a folder; give a file name such as report.html")
    return bytes(fs.cat_file(path, start=0, end=HEAD_BYTES))


PSEUDO_FOLDERS = ("/proc", "/sys", "/dev")
"""Where the kernel's files live: nothing written there is a file (``/dev/stdout`` resolves
to ``/proc/self/fd/1``, a pipe or a terminal)."""


def _path_text(report: object) -> str:
    """``report`` as a path string; ArgumentTypeError for anything else (the API's
    ``report=123``)."""
    text = os.fspath(report) if isinstance(report, str | os.PathLike) else None
    if not isinstance(text, str):
        raise ArgumentTypeError(
            f"--report is {type(report).__name__} {report!r}, not a path; give a file name "
            "such as report.html"
        )
    return text


def _check_local(report: str, resolved: str) -> None:
    """Refuse, before any work, a report that could only fail once the product is done: one
    on the kernel's file systems, or a pipe, device or socket where the report would go."""
    pseudo = [top for top in PSEUDO_FOLDERS if resolved == top or resolved.startswith(top + "/")]
    if pseudo:
        where = f" ({resolved})" if resolved != report else ""
        raise UsageError(
            f"--report {report}{where} is in {pseudo[0]}, where the kernel keeps its own "
            "files and no report can be written; give a file name such as report.html"
        )
    try:
        mode = os.stat(report).st_mode
    except OSError:
        return  # not there yet (or unreachable: said when it is written)
    if not stat.S_ISREG(mode):
        raise UsageError(
            f"--report {report} is a pipe, device or socket, not a file; the report is an HTML "
            "file: give a file name such as report.html"
        )


def _check_ours(head: bytes, report: str) -> None:
    if not any(mark in head for mark in REPORT_MARKS):
        raise UnsafeOutputError(
            f"--report {report} exists and is not a performance report this tool wrote; it "
            "will not be replaced: choose another file name or remove it yourself"
        )


def _door(local: str) -> Door:
    return Door(os.path.dirname(local) or ".", "--report's folder")

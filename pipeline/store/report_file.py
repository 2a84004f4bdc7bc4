"""Where ``--report`` may go: never onto or inside an input or OUT, never over a file that is
not a report this tool (or distributed) wrote."""

from __future__ import annotations

import logging
import os
from typing import Any

from pipeline.errors import UnsafeOutputError, UsageError
from pipeline.store.fs import inside, local_path, location, resolve_url, url_to_fs

log = logging.getLogger("pipeline")
REPORT_MARKS = (b"<title>Dask Performance Report</title>", b'id="tilegemm-accounting"')
"""What a report of ours holds near its start (distributed's title, our section)."""
HEAD_BYTES = 1 << 16


def check_report(report: str, stores: dict[str, str], storage_options: dict[str, Any]) -> str:
    """The report's resolved location, refused when it is (or is inside) one of ``stores``
    (name -> URL) or would replace a file that is not one of our reports."""
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
    fs, path = url_to_fs(url, storage_options)
    if not fs.exists(path):
        return url
    if fs.isdir(path):
        raise UsageError(f"--report {report} is a folder; give a file name such as report.html")
    with fs.open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    if not any(mark in head for mark in REPORT_MARKS):
        raise UnsafeOutputError(
            f"--report {report} exists and is not a performance report this tool wrote; it "
            "will not be replaced: choose another file name or remove it yourself"
        )
    log.info("--report: replacing the earlier report %s", url)
    return url

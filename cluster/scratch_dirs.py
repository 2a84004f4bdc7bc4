"""Where a local cluster's workers write scratch files, refused inside an array.

Each worker of a cluster we start takes dask's ``temporary-directory`` (DASK_TEMPORARY_DIRECTORY)
as its local directory, else the system's temporary directory ($TMPDIR), and writes
``dask-scratch-space/worker-*`` there (locks, uploaded files, spilled data). Inside A, B, C or
OUT those files would land in an array: refused before any work, naming both.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import dask

from cluster.spec import ClusterSpec
from pipeline.errors import UsageError
from pipeline.store.fs import local_path

KEY = "temporary-directory"
"""dask config of the local directory of the workers distributed starts."""


def scratch_directory() -> tuple[str, str]:
    """(the workers' local directory, links resolved; where it comes from)."""
    configured = dask.config.get(KEY, None)
    if configured:
        return os.path.realpath(os.path.expanduser(str(configured))), f"dask config {KEY}"
    return os.path.realpath(tempfile.gettempdir()), "the system's temporary directory, $TMPDIR"


def check_scratch_dirs(
    urls: Sequence[str], cluster: ClusterSpec, names: Sequence[str] = ("A", "B", "OUT")
) -> None:
    """Refuse a local cluster whose workers' local directory is one of the local arrays
    ``urls`` (named ``names``) or inside one; a cluster we only join keeps its own."""
    if cluster.existing:
        return
    directory, source = scratch_directory()
    for name, url in zip(names, urls, strict=True):
        path = local_path(url)
        if path is None:
            continue  # an object store: dask writes local files only
        array = os.path.realpath(path)
        if directory == array or directory.startswith(array.rstrip(os.sep) + os.sep):
            where = "is" if directory == array else "is inside"
            raise UsageError(
                f"dask's temporary directory {directory} ({source}) {where} {name} ({array}): "
                "the local cluster's workers would write their scratch files "
                "(dask-scratch-space) into the array; set DASK_TEMPORARY_DIRECTORY to a "
                f"directory elsewhere, outside {', '.join(dict.fromkeys(names))}"
            )

"""The doctor's cluster check, run in a child process (``python -m pipeline.doctor.cluster_check``)
with a timeout: a tiny product through ``pipeline.multiply`` with ``verify=True`` on a
LocalCUDACluster of one worker, as a job would start it. Prints one JSON check."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from kernels.cuda.host import exit_skipping_teardown

SHAPE = (256, 192, 160)
"""m, k, n of the product: ragged against the kernel tiles, seconds on a GPU."""


def cluster_multiply(shape: tuple[int, int, int] = SHAPE) -> dict[str, str]:
    import zarr

    from cluster import lifecycle
    from cluster.spec import ClusterSpec
    from pipeline.api import multiply
    from pipeline.options.spelling import cli_spelling

    def check(status: str, detail: str, fix: str = "") -> dict[str, str]:
        return {"check": "cluster", "status": status, "detail": detail, "fix": fix}

    if lifecycle.count_gpus() == 0:
        return check("skip", "no GPU visible to dask-cuda")
    m, k, n = shape
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
            paths = []
            for name, (rows, cols) in (("a", (m, k)), ("b", (k, n))):
                path = str(Path(tmp) / f"{name}.zarr")
                data = rng.standard_normal((rows, cols)).astype("float32")
                zarr.create_array(path, data=data, chunks=(max(rows // 2, 1), max(cols // 2, 1)))
                paths.append(path)
            spec = ClusterSpec(workers=1, dashboard_address="127.0.0.1:0")
            # doctor's reader runs a command line: the messages keep their flags
            with lifecycle.start(spec) as client, cli_spelling():
                client.wait_for_workers(1, timeout=120)
                a, b = paths
                multiply(a, b, str(Path(tmp) / "c.zarr"), client=client, backend="cuda",
                         verify=True)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the job's own error is the finding
        fix = "run the same job with --debug for the worker's traceback"
        return check("fail", f"{m}x{k} @ {k}x{n} float32: {type(e).__name__}: {e}", fix)
    seconds = time.perf_counter() - started
    detail = f"{m}x{k} @ {k}x{n} float32 on a 1-worker LocalCUDACluster, verified"
    return check("pass", f"{detail} ({seconds:.1f} s with start-up)")


if __name__ == "__main__":
    print(json.dumps([cluster_multiply()]))
    exit_skipping_teardown(0)

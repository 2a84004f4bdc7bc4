"""Shared fixtures. The CUDA simulator is switched on before anything imports numba.

Helpers live in tests/helpers.py: importing this file again (as tests.conftest) from a test
module would run its numba check after numba is loaded.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

# Too late once numba is imported: the CUDA kernel tests would then skip silently.
assert "numba" not in sys.modules, "numba was imported before tests/conftest.py"
# CPU-only CI runs the CUDA kernels in the simulator; `make test-gpu` (TILEGEMM_TEST_GPU=1) runs
# the `gpu` tests on a real device instead.
if os.environ.get("TILEGEMM_TEST_GPU") != "1":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__DAEMON", "False")
# Plans in the suite use the committed calibration, whatever this host's speed
# (tests/pipeline/test_host_probe.py covers the scaling).
os.environ.setdefault("DASK_TILEGEMM__HOST_PROBE", "False")
# Saved device and host records (kernels.device.figures) steer plans: the suite, and its CLI
# subprocesses, start from none, whatever `doctor` saved on this machine.
if os.environ.get("TILEGEMM_TEST_GPU") != "1":
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tilegemm-test-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)

from cluster.tuning import worker_config  # noqa: E402  (pure: no dask, no numba)

# Every cluster of the suite, in this process and in CLI subprocesses, as cluster.start makes
# its own: no worker profiler where it can deadlock the interpreter (see worker_config).
for _key, _value in worker_config().items():
    os.environ["DASK_" + _key.upper().replace(".", "__").replace("-", "_")] = str(_value)

from collections.abc import Iterator  # noqa: E402

import dask  # noqa: E402
import pytest  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

# in case a plugin imported dask before the variables were set
dask.config.set({**worker_config(), "tilegemm.host-probe": False})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine (simulator only)")
    for item in items:
        if "gpu" in item.keywords and not _real_gpu():
            item.add_marker(skip)


def _real_gpu() -> bool:
    from cluster.lifecycle import count_gpus

    return os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" and count_gpus() > 0


@pytest.fixture(scope="session")
def client() -> Iterator[Client]:
    """One LocalCluster for the session: 2 worker processes x 1 thread, loopback only."""
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=":0",
            memory_limit="4GiB",
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c

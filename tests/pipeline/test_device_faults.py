"""Finding 5: a CUDA error in a task is one clear error, and its worker is restarted (a fresh
process, so a fresh CUDA context) instead of failing every later task with a lost context.

The fault is a fake: the worker's emulated device raises an exception of numba's CUDA error
class name, as a real illegal-address fault would surface."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.errors import DeviceFaultError
from pipeline.run.faults import is_device_fault
from tests.helpers import assert_product, random_matrix, write_array


class CudaAPIError(Exception):
    """Named as numba-cuda's driver error."""


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (CudaAPIError(700, "CUDA_ERROR_ILLEGAL_ADDRESS"), True),  # numba's class
        (RuntimeError("nvCOMP: CUDA error: an illegal memory access was encountered"), True),
        (RuntimeError("cudaErrorLaunchFailure: unspecified launch failure"), True),
        (ValueError("could not decode chunk"), False),  # a host error stays itself
        (MemoryError(), False),
    ],
)
def test_which_errors_are_device_faults(error: BaseException, fault: bool) -> None:
    assert is_device_fault(error) is fault


@pytest.fixture(scope="module")
def nanny_client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=":0", memory_limit="2GiB",
        ) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        yield client


def _break_the_device() -> None:
    """Run on the worker: every gemm of its emulated device raises a CUDA error."""
    from kernels.device.emulated import EmulatedDevice

    def gemm(*args: object, **kwargs: object) -> None:
        raise CudaAPIError("[700] Call to cuLaunchKernel results in CUDA_ERROR_ILLEGAL_ADDRESS")

    EmulatedDevice.gemm = gemm  # type: ignore[method-assign]


def test_a_device_fault_is_one_error_and_a_fresh_worker(
    nanny_client: Client, tmp_path: Path
) -> None:
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, (40, 24), "float32"), random_matrix(rng, (24, 30), "float32")
    a_url, b_url = (
        write_array(tmp_path / "a.zarr", a, (20, 12)),
        write_array(tmp_path / "b.zarr", b, (12, 15)),
    )
    pids = nanny_client.run(os.getpid)
    before = set(pids.values())
    nanny_client.run(_break_the_device)
    with pytest.raises(
        DeviceFaultError, match=r"CUDA_ERROR_ILLEGAL_ADDRESS.*worker is restarted"
    ) as e:
        multiply(a_url, b_url, str(tmp_path / "c.zarr"), client=nanny_client, backend="emulated")
    assert e.value.worker in pids  # the faulted worker, by address
    nanny_client.wait_for_workers(1, timeout=60)
    after = set(nanny_client.run(os.getpid).values())
    assert after and not after & before  # a new process: a new CUDA context
    # The fresh worker's device works: the same job now runs (on the CPU backend, whose
    # numbers the emulated device does not compute).
    out = str(tmp_path / "d.zarr")
    multiply(a_url, b_url, out, client=nanny_client, backend="cpu")
    import zarr

    assert_product(zarr.open_array(out, mode="r")[:], a, b)
    nanny_client.run(_break_the_device)  # and a later fault is caught the same way
    with pytest.raises(DeviceFaultError):
        multiply(a_url, b_url, str(tmp_path / "e.zarr"), client=nanny_client, backend="emulated")

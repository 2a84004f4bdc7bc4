"""The doctor's cluster check (pipeline.doctor.cluster_check,
pipeline.doctor.checks.cluster_check): skipped without a GPU, and a verified job on a
LocalCUDACluster of one dask-cuda MockWorker running the CUDA kernels in the simulator."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from cluster import lifecycle
from pipeline.doctor import checks as doctor
from pipeline.doctor import cluster_check as doctor_cluster
from pipeline.doctor.checks import Check


def test_skipped_where_dask_cuda_sees_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "count_gpus", lambda: 0)
    found = doctor_cluster.cluster_multiply()
    assert found["status"] == "skip" and found["check"] == "cluster"


@pytest.mark.parametrize(
    ("devices", "ran"),
    [("pass", True), ("warn", True), ("fail", False)],  # warn: MIG on, still a GPU
)
def test_the_doctor_runs_it_only_after_a_working_gpu(
    monkeypatch: pytest.MonkeyPatch, devices: str, ran: bool
) -> None:
    monkeypatch.setattr(doctor, "run_child", lambda module, name: [Check(name, "pass", module)])
    found = doctor.cluster_check([Check("devices", devices, "H100")])
    assert [c.check for c in found] == ["cluster"]
    assert (found[0].detail == "pipeline.doctor.cluster_check") == ran, found


def test_a_verified_job_on_a_mock_gpu_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kernels.cuda.host")
    import dask_cuda
    from dask_cuda.utils_test import MockWorker

    real = dask_cuda.LocalCUDACluster
    mock = functools.partial(real, CUDA_VISIBLE_DEVICES="0", worker_class=MockWorker)
    monkeypatch.setattr(dask_cuda, "LocalCUDACluster", mock)
    monkeypatch.setattr(lifecycle, "count_gpus", lambda: 1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Cannot get CPU affinity", UserWarning)
        found = doctor_cluster.cluster_multiply((24, 16, 20))  # the simulator: tiny
    assert found["status"] == "pass", found
    assert "24x16 @ 16x20 float32 on a 1-worker LocalCUDACluster, verified" in found["detail"]


def test_a_job_that_fails_verification_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.api
    from pipeline.errors import VerificationError

    def wrong(*args: object, **kwargs: object) -> None:
        assert kwargs["verify"] is True and kwargs["backend"] == "cuda"
        raise VerificationError("C differs from A @ B at 3 elements")

    monkeypatch.setattr(pipeline.api, "multiply", wrong)
    monkeypatch.setattr(lifecycle, "count_gpus", lambda: 1)
    monkeypatch.setattr(lifecycle, "start", no_cluster)
    found = doctor_cluster.cluster_multiply((8, 8, 8))
    assert found["status"] == "fail" and "VerificationError: C differs" in found["detail"], found


@contextlib.contextmanager
def no_cluster(spec: Any) -> Iterator[Any]:
    assert spec.workers == 1
    yield SimpleNamespace(wait_for_workers=lambda n, timeout: None)

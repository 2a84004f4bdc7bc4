"""Sizing honestly: the write rate follows --storage-gbps unless --write-gbps gives its own, the
dry run names where each storage rate and each worker's memory come from, and rented workers
(--device-class, no --memory-limit, no cluster) get their class's reference server's host
memory per GPU, not this machine's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pipeline
from cluster.spec import ClusterSpec
from pipeline.errors import UsageError
from pipeline.facts.job_plan import worker_memory
from pipeline.job import MatmulJob
from pipeline.options.job_options import JobOptions
from pipeline.plan.device_model import DEVICE_CLASSES, ReferenceServer
from tests.helpers import run_cli
from tests.pipeline.test_sizing import line, metadata_only, small

GiB = 2**30
RENTED = ("--dry-run", "--device-class", "h100-sxm", "--workers", "8")
"""The complaint's cluster: 8 rented H100s, sized from this machine."""


def _write_seconds(job: MatmulJob) -> float:
    return dict(job.plan.resource_seconds)["write"]


def _out_bytes_per_worker(job: MatmulJob) -> float:
    (m, n), plan = job.plan.out.shape, job.plan
    return m * n * 4 / plan.workers  # float32


@pytest.mark.parametrize(
    ("storage", "write", "rate", "flag"),
    [
        (2.0, None, 2.0, "--storage-gbps"),  # one rate both ways
        (2.0, 0.5, 0.5, "--write-gbps"),  # writes slower than reads
        (0.5, 4.0, 4.0, "--write-gbps"),  # writes faster than reads
        (None, 1.0, 1.0, "--write-gbps"),  # reads stay this host's
    ],
)
def test_the_write_term_takes_the_write_rate(
    tmp_path: Path, storage: float | None, write: float | None, rate: float, flag: str
) -> None:
    a, b = metadata_only(tmp_path)  # 200,000² float32: 18.6 GiB of OUT per worker
    job = pipeline.prepare(
        a, b, tmp_path / "c.zarr", device_class="h100-sxm", storage_gbps=storage,
        write_gbps=write, cluster=ClusterSpec(workers=8),
    )  # fmt: skip
    costs = job.plan.costs
    assert costs.write_rate == rate * 1e9 and costs.write_source == flag
    assert costs.read_rate == (storage * 1e9 if storage else None)
    stored = _out_bytes_per_worker(job) / (rate * 1e9)
    assert stored <= _write_seconds(job) <= 2 * stored  # encoding, a bigger share, on top


def test_the_complaint_writes_no_faster_than_the_storage(tmp_path: Path) -> None:
    a, b = metadata_only(tmp_path)
    done = run_cli("multiply", a, b, str(tmp_path / "c.zarr"), *RENTED, "--storage-gbps", "2")
    assert done.returncode == 0, done.stderr
    written = re.search(r"write ([0-9.]+)", line(done.stdout, "modelled seconds"))
    assert written and float(written.group(1)) >= 149 * GiB / 8 / 2e9  # not 1.9 s
    assert line(done.stdout, "storage") == (
        "reads 2 GB/s per worker (--storage-gbps), writes 2 GB/s per worker (--storage-gbps)"
    )


@pytest.mark.parametrize(
    ("flags", "storage"),
    [
        # both calibrated on this host, and how to say otherwise
        (
            [],
            r"reads [0-9.]+ GB/s per thread \(this host's calibrated local reads\), "
            r"writes [0-9.]+ GB/s per thread \(this host's calibrated local writes\); "
            r"--storage-gbps sets a shared file system's or an object store's",
        ),
        # writes alone given
        (
            ["--write-gbps", "0.5"],
            r"reads [0-9.]+ GB/s per thread \(this host's calibrated local reads\), "
            r"writes 0\.5 GB/s per worker \(--write-gbps\); --storage-gbps sets .*",
        ),
        # both given, each named by its own flag
        (
            ["--storage-gbps", "2", "--write-gbps", "1.1"],
            r"reads 2 GB/s per worker \(--storage-gbps\), writes 1\.1 GB/s per worker "
            r"\(--write-gbps\)",
        ),
    ],
)
def test_each_storage_rate_names_its_source(tmp_path: Path, flags: list[str], storage: str) -> None:
    a, b = metadata_only(tmp_path, n=20_000)
    done = run_cli("multiply", a, b, str(tmp_path / "c.zarr"), *RENTED, *flags)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(storage, line(done.stdout, "storage")), line(done.stdout, "storage")


def test_a_write_bound_verdict_names_its_rate(tmp_path: Path) -> None:
    a, b = metadata_only(tmp_path, n=50_000)
    job = pipeline.prepare(
        a, b, tmp_path / "c.zarr", device_class="h100-sxm", storage_gbps=2, write_gbps=0.01
    )
    assert job.plan.bound_by == "write"
    assert "writes 0.01 GB/s per worker (--write-gbps)" in line(str(job), "storage")


@pytest.mark.parametrize(
    ("name", "per_gpu", "server"),
    [
        ("h100-sxm", 256 * GiB, "NVIDIA DGX H100: 2 TiB for 8 GPU(s)"),
        ("h100-pcie", 256 * GiB, "NVIDIA's MLPerf v3.1 Gigabyte G482-Z54: 2 TiB for 8 GPU(s)"),
        ("h200", 256 * GiB, "NVIDIA DGX H200: 2 TiB for 8 GPU(s)"),
        ("a100-80gb", 256 * GiB, "NVIDIA DGX A100 640GB: 2 TiB for 8 GPU(s)"),
        ("a100-40gb", 128 * GiB, "NVIDIA DGX A100 320GB: 1 TiB for 8 GPU(s)"),
        ("l40s", 128 * GiB, "NVIDIA's MLPerf v4.0 ASRock Rack 4U8G-ROME2: 1 TiB for 8 GPU(s)"),
        ("l4", 256 * GiB, "NVIDIA's MLPerf v3.1 ASRock Rack 1U1G-MILAN: 256 GiB for 1 GPU(s)"),
    ],
)
def test_every_class_has_its_reference_servers_memory(name: str, per_gpu: int, server: str) -> None:
    reference = DEVICE_CLASSES[name].server
    assert isinstance(reference, ReferenceServer)
    assert reference.memory_per_gpu_bytes == per_gpu and str(reference) == server


def test_rented_workers_get_their_class_memory_not_this_hosts(tmp_path: Path) -> None:
    a, b = metadata_only(tmp_path)
    done = run_cli("multiply", a, b, str(tmp_path / "c.zarr"), *RENTED, "--storage-gbps", "2")
    assert done.returncode == 0, done.stderr
    assert line(done.stdout, "workers") == (
        "8 x 1 thread(s), 256.0 GiB each (the H100-SXM's reference server, NVIDIA DGX H100: "
        "2 TiB for 8 GPU(s); --memory-limit sets it)"
    )
    job = pipeline.prepare(
        a, b, tmp_path / "c.zarr", device_class="a100-40gb",
        cluster=ClusterSpec(workers=8),
    )  # fmt: skip
    assert job.plan.memory_limit_bytes == 128 * GiB


@pytest.mark.parametrize(
    ("options", "limit", "source"),
    [
        # a size asked for wins over the class's
        ({"memory_limit": "200GiB"}, 200 * GiB, "--memory-limit"),
        # the CPU backend plans for no GPU: this host's memory, shared
        ({"backend": "cpu"}, None, r"this host's memory over 8 workers; --memory-limit sets it"),
    ],
)
def test_the_class_memory_gives_way(
    tmp_path: Path, options: dict[str, object], limit: int | None, source: str
) -> None:
    a, b = metadata_only(tmp_path, n=20_000)
    job = pipeline.prepare(
        a, b, tmp_path / "c.zarr", device_class="h100-sxm",
        cluster=ClusterSpec(workers=8), **options,
    )  # fmt: skip
    assert job.plan.memory_source == source
    assert limit is None or job.plan.memory_limit_bytes == limit
    assert f"each ({source})" in line(str(job), "workers")


@pytest.mark.parametrize(
    ("asked", "own", "limit", "source"),
    [
        (None, 8 * GiB, 8 * GiB, "the workers' own limit"),  # not the class's 256 GiB
        (4 * GiB, 8 * GiB, 4 * GiB, "--memory-limit"),
        (16 * GiB, 8 * GiB, 8 * GiB, "the workers' own limit"),
    ],
)
def test_a_running_cluster_keeps_its_workers_memory(
    asked: int | None, own: int, limit: int, source: str
) -> None:
    options = JobOptions(device_class="h100-sxm", memory_limit=asked)
    live = {"workers": 2, "threads": 1, "memory_limit": own}
    assert worker_memory(options, live, 2, 1, True) == (limit, source)


def test_a_bad_write_rate_is_refused_in_one_line(tmp_path: Path) -> None:
    a, b = small(tmp_path)
    out = str(tmp_path / "c.zarr")
    for given in ("0", "x", "-2"):
        done = run_cli("multiply", a, b, out, "--dry-run", "--write-gbps", given)
        assert done.returncode == 2, done.stderr
        assert f"{given!r} is not a rate in GB/s above zero and at most 1e+06" in done.stderr
        assert done.stderr.count("\n") <= 2  # usage and one error line
    with pytest.raises(UsageError, match=r"write_gbps takes a rate in GB/s above zero .* got 0"):
        pipeline.prepare(a, b, out, write_gbps=0)
    assert not Path(out).exists()

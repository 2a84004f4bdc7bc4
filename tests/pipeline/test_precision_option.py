"""--precision through the pipeline: refused before any work where the backend or
dtype cannot honour it, carried to the worker's accumulator and the staged engine, stated by
the plan, the fingerprint, the summary and OUT's attributes, and followed by verify's
tolerance. Tensor precisions cannot run here (no GPU, and inline PTX does not run in the
simulator), so their end-to-end paths are the refusals, cuBLAS's math mode against the fake
CuPy of tests/kernels/test_precision.py, and verify of a C rounded as TF32 rounds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply, prepare
from pipeline.errors import BackendUnavailableError, UsageError
from pipeline.job import fingerprint
from pipeline.run import worker
from pipeline.store.record import of_array
from pipeline.verify.check import verify_product
from tests.helpers import assert_product, cpu_tile_task, random_matrix, run_cli, write_array
from tests.kernels.test_cublas import FakeCupy
from tests.kernels.test_precision import TF32_TENSOR_OP_MATH, FakeCublasLib
from tests.kernels.test_precision import fake_cublas as fake_cublas  # noqa: F401 - a fixture
from tests.kernels.tf32_emulation import round_tf32


def _inputs(tmp_path: Path, dtype: str = "float32", k: int = 24) -> tuple[str, str]:
    rng = np.random.default_rng(5)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (16, k), dtype), (8, 8))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (k, 12), dtype), (8, 6))
    return a, b


@pytest.mark.parametrize(("backend", "dtype", "precision", "message"), [
    ("cpu", "float32", "tf32", r"^precision='tf32': the cpu backend computes fp32 only; use "),
    ("cpu", "float32", "3xtf32", r"^precision='3xtf32': the cpu backend computes fp32 only"),
    ("cublas", "float32", "3xtf32", r"the cublas backend computes fp32 or tf32 only; use backe"),
    ("cuda", "float64", "tf32", r"the product computes in float64: use precision='fp32'"),
    ("auto", "float64", "3xtf32", r"the product computes in float64"),  # no backend could
    ("cuda", "float32", "fp16", r"unknown precision 'fp16'; choose fp32, tf32, 3xtf32"),
])  # fmt: skip
def test_prepare_refuses_what_the_backend_cannot_compute(
    tmp_path: Path, backend: str, dtype: str, precision: str, message: str
) -> None:
    a, b = _inputs(tmp_path, dtype)
    with pytest.raises(UsageError, match=message):
        prepare(a, b, str(tmp_path / "c.zarr"), backend=backend, precision=precision)
    assert not (tmp_path / "c.zarr").exists()


def test_cli_refusal_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    a, b = _inputs(tmp_path)
    out = tmp_path / "c.zarr"
    got = run_cli("multiply", a, b, str(out), "--backend", "cpu", "--precision", "tf32")
    assert got.returncode == 2, got.stderr
    assert got.stderr.splitlines() == [
        "error: --precision tf32: the cpu backend computes fp32 only; use --backend cuda or "
        "cublas (a GPU), or --precision fp32"
    ]
    assert not out.exists()


def test_gram_takes_precision(tmp_path: Path) -> None:
    a, _ = _inputs(tmp_path)
    got = run_cli("gram", a, str(tmp_path / "g.zarr"), "--backend", "cublas", "--precision",
                  "3xtf32", "--dry-run")  # fmt: skip
    assert got.returncode == 2 and "the cublas backend computes fp32 or tf32 only" in got.stderr


def test_auto_resolving_to_cpu_is_refused_before_any_work(tmp_path: Path, client: Client) -> None:
    a, b = _inputs(tmp_path)
    job = prepare(a, b, str(tmp_path / "c.zarr"), precision="tf32")  # auto: may become cuda
    with pytest.raises(UsageError, match=r"backend='auto' chose cpu \(not a GPU on every worker"):
        job.execute(client)
    assert not (tmp_path / "c.zarr").exists()


def test_tensor_kernels_are_refused_on_simulated_workers(tmp_path: Path) -> None:
    """The session's workers run numba's CUDA simulator (tests/conftest.py): our tensor-core
    kernel's inline PTX cannot run there, said before any tile is computed."""
    from distributed import LocalCluster

    a, b = _inputs(tmp_path)
    job = prepare(a, b, str(tmp_path / "c.zarr"), backend="cuda", precision="3xtf32")
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as c,
        pytest.raises(BackendUnavailableError, match=r"precision='3xtf32' runs our tensor-core "
                      r"kernel \(inline PTX\), which numba's CUDA simulator cannot run"),
    ):  # fmt: skip
        job.execute(c)


def test_dry_run_and_fingerprint_state_the_precision(tmp_path: Path) -> None:
    a, b = _inputs(tmp_path)
    fp32 = prepare(a, b, str(tmp_path / "c.zarr"), backend="cuda")
    tf32 = prepare(a, b, str(tmp_path / "c.zarr"), backend="cuda", precision="tf32")
    assert "precision          fp32 (the dtype's own arithmetic)" in fp32.describe()
    assert "precision          tf32 (tensor cores, factors rounded to TF32" in tf32.describe()
    assert "time modelled at the fp32 rate" in tf32.describe()
    assert tf32.plan.precision == "tf32" and fp32.plan.precision == "fp32"
    # --resume compares fingerprints: another precision is another product ...
    assert fingerprint(tf32.plan) != fingerprint(fp32.plan)
    assert fingerprint(tf32.plan) != fingerprint(replace(tf32.plan, precision="3xtf32"))
    # ... while fp32 leaves the key out: its digest is that of a plan without a precision.
    assert fingerprint(fp32.plan) == fingerprint(replace(fp32.plan, precision="fp32"))


def test_fp32_job_records_its_precision(tmp_path: Path, client: Client) -> None:
    a, b = _inputs(tmp_path)
    out = str(tmp_path / "c.zarr")
    result = multiply(a, b, out, client=client, backend="cpu", verify=True)
    assert result.plan.precision == "fp32" and result.verified is True
    assert of_array(zarr.open_array(out)).precision == "fp32"
    from pipeline.summary import format_summary

    assert "backend cpu, precision fp32)" in format_summary(result)


def test_the_worker_gives_cublas_the_tasks_precision(
    tmp_path: Path,
    fake_cublas: tuple[FakeCupy, FakeCublasLib],  # noqa: F811 - the fixture
) -> None:
    """A tile task on the cublas backend (fake CuPy): TaskSpec.precision reaches the
    accumulator, which runs every panel's gemm in the handle's TF32 math mode."""
    cupy, lib = fake_cublas
    a_url, b_url = _inputs(tmp_path)
    plan, spec = cpu_tile_task(a_url, b_url, tmp_path / "c.zarr")
    tile, group = next(iter(plan.tiles())), plan.k_groups()[0]
    for precision, mode in (("tf32", TF32_TENSOR_OP_MATH), ("fp32", lib.mode[7])):
        cupy.modes_seen.clear()  # type: ignore[attr-defined]
        task = replace(spec, backend="cublas", precision=precision)
        got, _, _ = worker.tile_product(task, tile, group)
        assert cupy.modes_seen == [mode] * len(group), precision  # type: ignore[attr-defined]
        a, b = zarr.open_array(a_url)[:], zarr.open_array(b_url)[:]
        assert_product(got, a[tile.rows[0] : tile.rows[1]], b[:, tile.cols[0] : tile.cols[1]])


def test_the_staged_engine_gives_the_device_its_precision(tmp_path: Path) -> None:
    """The staged engine on numba's device (simulator): fp32 computes the product; a tensor
    precision picks the mma variant, whose refusal to run in the simulator reaches the
    caller."""
    from kernels.device.engine import StagedProduct
    from kernels.device.gpu import NumbaDevice
    from kernels.memory.allocators import numpy_allocator
    from kernels.memory.buffers import BufferPool

    rng = np.random.default_rng(2)
    a, b = random_matrix(rng, (5, 7), "float32"), random_matrix(rng, (7, 3), "float32")

    def panel() -> tuple[int, Any, Any]:
        return 7, lambda host: host.__setitem__(..., a), lambda host: host.__setitem__(..., b)

    device = NumbaDevice()
    fp32 = StagedProduct(device, (5, 3), "float32", BufferPool(numpy_allocator, 1 << 20))
    fp32.run([panel()])
    assert_product(fp32.result(), a, b)
    tf32 = StagedProduct(
        device, (5, 3), "float32", BufferPool(numpy_allocator, 1 << 20), precision="tf32"
    )
    with pytest.raises(RuntimeError, match=r"mma_tf32 \(tf32\) runs inline PTX"):
        tf32.run([panel()])


def _set_record(out: str, **fields: Any) -> None:
    c = zarr.open_array(out, mode="r+")
    c.attrs.update(replace(of_array(c), **fields).attributes())


def test_verify_tolerance_follows_the_recorded_precision(tmp_path: Path, client: Client) -> None:
    """A C rounded as TF32 rounds (A and B rounded to TF32, multiplied in float64, stored
    float32) passes when OUT says tf32 and fails when it says fp32, K = 256."""
    a_url, b_url = _inputs(tmp_path, k=256)
    out = str(tmp_path / "c.zarr")
    multiply(a_url, b_url, out, client=client, backend="cpu")
    a, b = zarr.open_array(a_url)[:], zarr.open_array(b_url)[:]
    rounded = round_tf32(a).astype(np.float64) @ round_tf32(b).astype(np.float64)
    zarr.open_array(out, mode="r+")[:] = rounded.astype(np.float32)
    relative = np.abs(rounded - a.astype(np.float64) @ b).max() / np.abs(a @ b).max()
    assert 1e-5 < relative < 2.0**-9, relative  # far beyond fp32's rounding, within TF32's
    _set_record(out, precision="tf32")
    assert verify_product(client, a_url, b_url, out).passed
    _set_record(out, precision="fp32")
    assert not verify_product(client, a_url, b_url, out).passed
    # A C computed elsewhere: --precision says what it was computed at.
    assert verify_product(client, a_url, b_url, out, precision="tf32").passed


def test_verify_cli_takes_precision(tmp_path: Path) -> None:
    got = run_cli("verify", "--help")
    assert "--precision {fp32,tf32,3xtf32}" in got.stdout

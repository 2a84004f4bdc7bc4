"""Integer and bool products on the GPU backends, in the simulator: bit for bit numpy's integer
product through exact float K blocks (kernels.cuda.integer), on CudaAccumulator, the staged
NumbaDevice path and cuBLAS's glue (a numpy-backed fake CuPy); which backend "auto" picks; the
elementwise kernels' static no-spill check; one CLI Gram product end to end.

Every data case sums past what its float holds exactly in one unblocked product (large
same-sign values, long panels), so each fails when the K blocking is taken out."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from numpy.typing import NDArray

from kernels import exact
from kernels.backends import BACKENDS, check_precision
from kernels.cuda import host as cuda_host
from kernels.cuda import integer
from kernels.cuda import tiled as cuda_tiled
from kernels.device.engine import Panel, StagedProduct
from kernels.device.gpu import NumbaDevice
from kernels.memory.allocators import pinned_allocator
from kernels.memory.buffers import PAGE, BufferPool
from pipeline.errors import BackendUnavailableError
from pipeline.run.client import resolve_backend
from tests.child_env import child_env
from tests.helpers import REPO, write_array
from tests.kernels.test_cublas import FakeClient, FakeCupy

needs_cuda = pytest.mark.skipif(
    not cuda_host.cuda_available(), reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1"
)
pytestmark = pytest.mark.filterwarnings("ignore:Grid size .* under-utilization")

Case = tuple[str, str, tuple[int, int], tuple[int, int], list[int], int]
CASES: list[Case] = [
    # (input dtype, accumulator, a's values [lo, hi), b's, K panel widths, MIN_FLOAT32_BLOCK)
    ("uint8", "int32", (200, 256), (200, 256), [650, 0, 9], 256),  # float32 blocks of 258
    ("int8", "int64", (-128, -118), (-128, -118), [1500], 256),  # blocks of 1023
    ("int16", "int32", (1000, 1100), (-1100, -1000), [40, 7], 8),  # float32 blocks of 13
    ("uint16", "int64", (60000, 65536), (60000, 65536), [20], 256),  # float32 panels, float64
    ("int32", "int64", (2**26 - 9, 2**26), (-(2**26), 9 - 2**26), [12, 5], 256),  # blocks of 2
]
IDS = [f"{c[0]}-{c[1]}" for c in CASES]
M, N = 5, 3  # simulator-sized


def panels(case: Case, seed: int = 0) -> list[tuple[NDArray[Any], NDArray[Any]]]:
    dtype, _, (alo, ahi), (blo, bhi), widths, _ = case
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(alo, ahi, (M, w)).astype(dtype), rng.integers(blo, bhi, (w, N)).astype(dtype))
        for w in widths
    ]


def numpy_product(data: list[tuple[NDArray[Any], NDArray[Any]]], acc: str) -> NDArray[Any]:
    out = np.zeros((M, N), acc)
    for a, b in data:
        out += a.astype(acc) @ b.astype(acc)
    return out


@pytest.fixture
def small_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiled kernel with 4 x 4 tiles as the float default: the simulator runs long K
    blocks in seconds (the blocked default is used by one case and the CLI test)."""
    monkeypatch.setattr(cuda_tiled, "TILE", 4)
    swapped = {
        name: dataclasses.replace(v, default=name.startswith("tiled_"))
        if v.precision in ("fp32", "fp64")
        else v
        for name, v in cuda_host.VARIANTS.items()
    }
    monkeypatch.setattr(cuda_host, "VARIANTS", swapped)


def unblocked(a: NDArray[Any], b: NDArray[Any], dtype: str) -> NDArray[Any]:
    """a @ b as a kernel without K blocks sums it: each element's products in ``dtype``, one
    after another (numpy's BLAS splits the sum over SIMD lanes, which may hide the rounding)."""
    products = a.astype(dtype)[:, :, None] * b.astype(dtype)[None, :, :]
    if a.shape[1] == 0:
        return np.zeros((a.shape[0], b.shape[1]), dtype)
    return np.add.accumulate(products, axis=1, dtype=dtype)[:, -1]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_case_needs_its_blocks(seed: int) -> None:
    """One unblocked product per panel in the panels' own float is wrong for every case (both
    seeds the tests use): the tests below see a missing K blocking."""
    for case in CASES:
        data = panels(case, seed)
        float_dtype = exact.panel_dtype(case[0], case[0], case[1])
        rounded = sum(unblocked(a, b, float_dtype).astype(case[1]) for a, b in data)
        assert not np.array_equal(rounded, numpy_product(data, case[1])), case


@needs_cuda
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cuda_accumulator_is_numpys_integer_product(
    case: Case, small_kernels: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exact, "MIN_FLOAT32_BLOCK", case[5])
    data = panels(case)
    acc = cuda_host.CudaAccumulator((M, N), np.dtype(case[1]))
    read = exact.panel_dtype(case[0], case[0], case[1])
    for i, (a, b) in enumerate(data):  # integer panels, or the floats the worker reads
        acc.add(*((a, b) if i % 2 else (a.astype(read), b.astype(read))))
    got = acc.result()
    assert got.dtype == np.dtype(case[1]) and np.array_equal(got, numpy_product(data, case[1]))


@needs_cuda
def test_the_blocked_default_kernel_in_float32_blocks() -> None:
    """The register-blocked kernel itself (not the tests' small tiled one) over 3 blocks,
    a band of rows added on top."""
    data = panels(CASES[0])[:1]
    acc = cuda_host.CudaAccumulator((M, N), np.dtype("int32"))
    acc.add(*data[0])
    acc.add(data[0][0][2:], data[0][1], rows=(2, M))
    want = numpy_product(data, "int32")
    want[2:] += data[0][0][2:].astype("int32") @ data[0][1].astype("int32")
    assert np.array_equal(acc.result(), want)


def staged_run(
    case: Case, data: list[tuple[NDArray[Any], NDArray[Any]]], bands: list[tuple[int, int]] | None
) -> NDArray[Any]:
    read = exact.panel_dtype(case[0], case[0], case[1])

    def fill(x: NDArray[Any]) -> Callable[[NDArray[Any]], None]:
        return lambda out: np.copyto(out, x, casting="unsafe")

    engine = StagedProduct(
        NumbaDevice(), (M, N), case[1], BufferPool(pinned_allocator, 64 * PAGE), panel_dtype=read
    )
    staged = [Panel(a.shape[1], fill(a), fill(b)) for a, b in data]
    if bands is None:
        engine.run(staged)
        return engine.result()
    got: dict[tuple[int, int], NDArray[Any]] = {}
    engine.run(staged, lambda band, rows: got.__setitem__(band, rows.copy()), bands)
    return np.vstack([got[band] for band in bands])


@needs_cuda
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_staged_numba_device_is_numpys_integer_product(
    case: Case, small_kernels: None, monkeypatch: Any
) -> None:
    """The engine stages float panels, measures their max |values| in the decode threads and
    the device cuts each product into exact blocks by them; every other case hands its last
    panel over band by band."""
    monkeypatch.setattr(exact, "MIN_FLOAT32_BLOCK", case[5])
    bands = [(0, 2), (2, M)] if CASES.index(case) % 2 == 0 else None
    data = panels(case, seed=1)
    got = staged_run(case, data, bands)
    assert got.dtype == np.dtype(case[1]) and np.array_equal(got, numpy_product(data, case[1]))


@needs_cuda
@pytest.mark.parametrize(("acc", "want"), [("bool", "any"), ("int32", "count")])
def test_bool_products(acc: str, want: str, small_kernels: None) -> None:
    """Bool into bool is numpy's (an OR of ANDs), into int32 a count. No float sum of 0/1
    leaves its exact range: blocking cannot matter here, the flush's semantics do."""
    rng = np.random.default_rng(5)
    a, b = rng.random((M, 9)) < 0.5, rng.random((9, N)) < 0.5
    gpu = cuda_host.CudaAccumulator((M, N), np.dtype(acc))
    gpu.add(a, b)
    gpu.add(a, b)
    once = a.astype(acc) @ b.astype(acc)
    assert np.array_equal(gpu.result(), once if want == "any" else 2 * once)


def test_blocks_follow_kernels_exact() -> None:
    """exact_blocks (from max |values|) is plan_blocks (from the panels)."""
    rng = np.random.default_rng(2)
    for lo, hi, k in [(-128, 128, 300), (60000, 65536, 30), (0, 2, 10), (1000, 1100, 400)]:
        a = rng.integers(lo, hi, (4, k)).astype("float32")
        b = rng.integers(lo, hi, (k, 3)).astype("float32")
        dtype, step = exact.plan_blocks(a, b) or ("", 0)
        got = integer.exact_blocks("float32", exact.largest(a), exact.largest(b), k)
        assert (got.dtype, got.step) == (dtype, step)


@pytest.mark.parametrize(
    ("blocks", "precision", "tensor"),
    [
        (integer.ExactBlocks("float32", 1023, 128), "tf32", True),  # int8: exact in TF32
        (integer.ExactBlocks("float32", 258, 255), "3xtf32", True),  # uint8
        (integer.ExactBlocks("float32", 13, 3000), "tf32", False),  # > 2**11: the fp32 kernel
        (integer.ExactBlocks("float64", 99, 5), "tf32", False),  # a float64 block
        (integer.ExactBlocks("float32", 1023, 128), "fp32", False),
    ],
)
def test_tensor_cores_only_where_exact(
    blocks: integer.ExactBlocks, precision: str, tensor: bool
) -> None:
    assert integer.tensor_exact(blocks, precision) is tensor


@needs_cuda
def test_tf32_picks_the_tensor_kernel_for_int8_and_fp32_past_2_11() -> None:
    """The simulator cannot run the TF32 kernel (inline PTX): int8 data reach it; int16 data
    past 2**11 run the fp32 kernel, exactly."""
    acc = cuda_host.CudaAccumulator((2, 2), np.dtype("int32"), precision="tf32")
    with pytest.raises(RuntimeError, match="inline PTX"):
        acc.add(np.full((2, 3), 100, "int8"), np.full((3, 2), -100, "int8"))
    a, b = np.full((2, 3), 3000, "int16"), np.full((3, 2), 3000, "int16")
    acc = cuda_host.CudaAccumulator((2, 2), np.dtype("int64"), precision="tf32")
    acc.add(a, b)
    assert np.array_equal(acc.result(), a.astype("int64") @ b.astype("int64"))


@pytest.mark.parametrize(("backend", "ok"), [("cuda", True), ("cublas", True), ("cpu", False)])
def test_tensor_precisions_for_integers(backend: str, ok: bool) -> None:
    if ok:
        check_precision(backend, "int32", "tf32")
        return
    with pytest.raises(ValueError, match="the cpu backend computes fp32 only"):
        check_precision(backend, "int32", "tf32")


def test_cublas_glue_is_numpys_integer_product(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels.cuda.cublas import CublasAccumulator

    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cublas", fake.cublas)  # type: ignore[arg-type]
    for case in (CASES[0], CASES[3], CASES[4]):
        data = panels(case, seed=3)
        acc = CublasAccumulator((M, N), case[1])
        for a, b in data:
            acc.add(a, b)
        assert np.array_equal(acc.result(), numpy_product(data, case[1])), case
    assert {beta for *_, beta in fake.gemm_calls} == {0.0}  # each block into a zeroed temp


def _gpu_workers() -> FakeClient:
    found = {"gpu": True, "cuda": True, "cublas": True, "simulator": False}
    return FakeClient({"tcp://w0": found, "tcp://w1": found})


@pytest.mark.parametrize(
    ("inputs", "acc", "chosen"),
    [
        ("int8", "int32", "cuda"),  # float32 panels
        ("int32", "int64", "cuda"),  # float64 panels
        ("bool", "bool", "cuda"),
        ("int64", "int64", "cpu"),  # no float holds them: numpy's integer product
        ("float32", "float32", "cuda"),
    ],
)
def test_auto_takes_a_gpu_for_integers_a_float_holds(inputs: str, acc: str, chosen: str) -> None:
    panel = exact.panel_dtype(inputs, inputs, acc)
    assert resolve_backend(_gpu_workers(), "auto", acc, panel) == chosen  # type: ignore[arg-type]
    assert BACKENDS["cuda"].takes(acc, panel) is (chosen == "cuda")


def test_a_named_gpu_backend_refuses_64_bit_integers() -> None:
    with pytest.raises(
        BackendUnavailableError,
        match=r"not int64 from int64 panels \(integers: from inputs of up to 32 bits",
    ):
        resolve_backend(_gpu_workers(), "cuda", "int64", "int64")  # type: ignore[arg-type]
    assert not BACKENDS["emulated"].takes("int32", "float32")


NO_SPILLS = """
import json, sys
from pathlib import Path
from kernels.cuda.host import VARIANTS
from kernels.inspect import machine_code as ki
reports = ki.inspect_helpers((9, 0), Path(sys.argv[1]))
v = VARIANTS["blocked_float32"]
reports.append(ki.inspect_kernel(v.name, "float32", v.make_kernel(), (9, 0), Path(sys.argv[1]),
                                 v.launch_bounds, v.default))
print(json.dumps(reports))
"""


def test_the_integer_route_kernels_do_not_spill(tmp_path: Path) -> None:
    """Static check, no GPU: the flush and gather kernels and the fp32 blocked kernel compile
    (numba -> ptxas) with no spills and no local memory."""
    pytest.importorskip("nvidia", reason="ptxas comes with the CUDA wheels")
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # compile_ptx needs the real numba.cuda
    done = subprocess.run(
        [sys.executable, "-c", NO_SPILLS, str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    reports = {r["name"]: r for r in json.loads(done.stdout)}
    assert {n for n, *_ in integer.inspected_kernels()} | {"blocked_float32"} == set(reports)
    for r in reports.values():
        assert r["spill_bytes"] == r["local_bytes"] == r["local_instructions"] == 0, r
        assert r["targets_missed"] == [] or r["name"] == "blocked_float32", r


def test_cli_gram_of_uint8_into_int32_on_the_cuda_backend(tmp_path: Path) -> None:
    """`python -m pipeline gram X G --dtype int32 --backend cuda` in the simulator: the staged
    engine's exact blocks (one K panel of 600 > 258, the float32 block of uint8)."""
    rng = np.random.default_rng(9)
    x = rng.integers(200, 256, (600, 4)).astype("uint8")
    x_url = write_array(tmp_path / "x.zarr", x, (600, 2))
    out = tmp_path / "g.zarr"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "gram", x_url, str(out), "--dtype", "int32",
         "--chunks", "4x4", "--backend", "cuda", "--dashboard-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=300, env=child_env({"NUMBA_ENABLE_CUDASIM": "1"}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "backend cuda" in done.stdout
    got = zarr.open_array(str(out), mode="r")[:]
    want = x.T.astype("int32") @ x.astype("int32")
    assert got.dtype == np.int32 and np.array_equal(got, want)
    assert not np.array_equal(unblocked(x.T, x, "float32").astype("int32"), want)

"""cuBLAS backend (CuPy): clear refusals without CuPy or a GPU, the accumulator's glue against a
numpy-backed fake CuPy, the real thing on a GPU, and benchmarks.gpu_kernels' CPU-side behaviour."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernels.backends import make_accumulator, probe_devices
from kernels.constants import CUBLAS_INSTALL
from kernels.cuda.cublas import (
    CublasAccumulator,
    CublasUnavailableError,
    cublas_available,
    load_cupy,
)
from pipeline import multiply
from pipeline.errors import BackendUnavailableError, UsageError
from pipeline.run.client import resolve_backend
from tests.helpers import REPO, assert_product, random_matrix, run_cli, write_array

FIX = (
    r"needs CuPy with cuBLAS \(pip install \"\.\[cublas\]\" in the zarr-tilegemm checkout\) "
    r"and a CUDA GPU"
)

no_cublas = pytest.mark.skipif(cublas_available(), reason="CuPy and a GPU are present here")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@no_cublas
def test_accumulator_without_cupy_names_the_fix() -> None:
    with pytest.raises(CublasUnavailableError, match=FIX):
        make_accumulator("cublas", (4, 4), "float32")
    assert issubclass(CublasUnavailableError, RuntimeError)


@no_cublas
def test_probe_reports_cublas_only_when_asked() -> None:
    assert "cublas" not in probe_devices()
    assert probe_devices("cublas")["cublas"] is False


class FakeClient:
    """Just client.run(probe_devices, ...): what each worker would report."""

    def __init__(self, devices: dict[str, dict[str, bool]]) -> None:
        self.devices = devices

    def run(self, fn: Any, *args: Any) -> dict[str, dict[str, bool]]:
        return self.devices


def _workers(*cublas: bool) -> FakeClient:
    base = {"gpu": True, "cuda": True, "simulator": False}
    return FakeClient({f"tcp://w{i}": {**base, "cublas": c} for i, c in enumerate(cublas)})


@pytest.mark.parametrize(
    ("cublas", "dtype", "match"),
    [
        ((True, False), "float32", r"cublas needs CuPy .* 1 of 2 worker\(s\) .*tcp://w1"),  # one
        ((False, False), "float64", r"2 of 2 worker\(s\)"),  # none
        ((True, True), "int32", r"float32 and float64 only, not int32"),  # dtype
    ],
)
def test_resolve_refuses_cublas(cublas: tuple[bool, ...], dtype: str, match: str) -> None:
    with pytest.raises(BackendUnavailableError, match=match):
        resolve_backend(_workers(*cublas), "cublas", dtype)  # type: ignore[arg-type]


def test_resolve_accepts_cublas_everywhere() -> None:
    assert resolve_backend(_workers(True, True), "cublas", "float32") == "cublas"  # type: ignore[arg-type]


def test_api_names_cublas_among_the_backends() -> None:
    with pytest.raises(UsageError, match="choose auto, cuda, cpu, cublas"):
        multiply("a.zarr", "b.zarr", "c.zarr", backend="gpu")


@no_cublas
def test_cli_cublas_without_cupy_exits_2_with_the_fix(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (6, 5), "float32"), (3, 5))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (5, 4), "float32"), (5, 2))
    out = tmp_path / "c.zarr"
    done = run_cli(
        "multiply", a, b, str(out), "--backend", "cublas",
        "--workers", "1", "--threads-per-worker", "1", "--no-progress",
        "--dashboard-address", "127.0.0.1:0", timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = error_lines(done.stderr)
    assert CUBLAS_INSTALL in line and "1 of 1 worker(s)" in line
    assert "Traceback" not in done.stderr


def test_cupy_without_cublas_is_unavailable_and_names_the_ctk_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CuPy 14.2 from plain `pip install cupy-cuda13x`: `import cupy` works, `cupy.cublas` not.
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    with pytest.raises(CublasUnavailableError, match=r"finds no cuBLAS .*\[ctk\]") as caught:
        load_cupy()
    assert CUBLAS_INSTALL in str(caught.value)
    assert cublas_available() is False


@pytest.mark.parametrize("doc", ["README.md", "docs/cluster.md"])
def test_the_documented_install_is_the_one_the_errors_name(doc: str) -> None:
    assert CUBLAS_INSTALL.removeprefix("pip install ") in (REPO / doc).read_text()
    assert "`pip install cupy-cuda13x`" not in (REPO / doc).read_text()


# A numpy stand-in for the few CuPy calls the accumulator makes. "Device" arrays are numpy
# copies tracked by id, so the test sees every host-to-device copy and that gemm (with the
# documented out = alpha * a @ b + beta * out) only ever gets device arrays.
class FakeCupy(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("cupy")
        self.on_device: dict[int, np.ndarray[Any, Any]] = {}
        self.uploads = 0
        self.gemm_calls: list[tuple[str, str, float, float]] = []
        self.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
        self.cublas = types.SimpleNamespace(gemm=self._gemm)

    def _device(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        self.on_device[id(x)] = x
        return x

    def zeros(self, shape: tuple[int, int], dtype: Any) -> np.ndarray[Any, Any]:
        return self._device(np.zeros(shape, dtype=dtype))

    def asarray(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        self.uploads += 1
        return self._device(np.array(x, copy=True))

    def on(self, x: np.ndarray[Any, Any]) -> bool:
        """A device array, or a view of one (a slice of a CuPy array stays on the device)."""
        return id(x) in self.on_device or (x.base is not None and id(x.base) in self.on_device)

    def asnumpy(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        assert self.on(x)
        return np.array(x, copy=True)

    def _gemm(self, ta: str, tb: str, a: Any, b: Any, out: Any, alpha: float, beta: float) -> Any:
        assert all(self.on(x) for x in (a, b, out)), "gemm got a host array"
        assert a.dtype == b.dtype == out.dtype and out.flags.c_contiguous
        self.gemm_calls.append((ta, tb, alpha, beta))
        out[...] = alpha * (a @ b) + beta * out
        return out


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> FakeCupy:
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cublas", fake.cublas)  # type: ignore[arg-type]
    return fake


@pytest.mark.parametrize(
    ("m", "n", "widths"),
    [
        (37, 23, [5, 11, 1]),  # ragged panels
        (1, 50, [30, 30]),  # one row
        (50, 1, [7]),  # one column
        (16, 16, [0, 4]),  # an empty panel is a no-op
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fake_cupy_accumulates_with_beta_one(
    fake_cupy: FakeCupy, m: int, n: int, widths: list[int], dtype: str
) -> None:
    rng = np.random.default_rng(m * 100 + n)
    a, b = random_matrix(rng, (m, sum(widths)), dtype), random_matrix(rng, (sum(widths), n), dtype)
    acc = make_accumulator("cublas", (m, n), dtype)
    start = 0
    for w in widths:
        acc.add(a[:, start : start + w], b[start : start + w])  # views, not contiguous
        start += w
    assert_product(acc.result(), a, b)
    used = [w for w in widths if w]
    assert fake_cupy.uploads == 2 * len(used)  # each panel copied to the device once
    assert fake_cupy.gemm_calls == [("N", "N", 1.0, 1.0)] * len(used)


def test_fake_cupy_bands_write_only_their_rows(fake_cupy: FakeCupy) -> None:
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, (30, 12), "float32"), random_matrix(rng, (12, 7), "float32")
    acc = make_accumulator("cublas", (30, 7), "float32")
    acc.add(a[:, :5], b[:5])
    for r0, r1 in [(0, 16), (16, 30)]:
        acc.add(a[r0:r1, 5:], b[5:], rows=(r0, r1))  # gemm into a device view of the band
    assert_product(acc.result(), a, b)
    assert_product(acc.result((16, 30)), a[16:], b)


def test_fake_cupy_refuses_bad_panels(fake_cupy: FakeCupy) -> None:
    acc = CublasAccumulator((4, 3), np.float32)
    with pytest.raises(TypeError, match=r"panels must be float32 .* got a float64"):
        acc.add(np.ones((4, 2)), np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"need a \(4, w\) and b \(w, 3\)"):
        acc.add(np.ones((4, 2), np.float32), np.ones((3, 3), np.float32))
    with pytest.raises(TypeError, match="float32 and float64, got complex64"):
        CublasAccumulator((4, 3), np.complex64)
    assert fake_cupy.uploads == 0


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "widths"), [(129, 257, [63, 130, 1]), (1000, 37, [513])])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cublas_on_a_gpu(m: int, n: int, widths: list[int], dtype: str) -> None:
    try:
        load_cupy()
    except CublasUnavailableError as e:  # no CuPy, no cuBLAS in it, or no GPU: say which
        pytest.skip(e.reason)
    rng = np.random.default_rng(7)
    a, b = random_matrix(rng, (m, sum(widths)), dtype), random_matrix(rng, (sum(widths), n), dtype)
    acc = CublasAccumulator((m, n), dtype)
    start = 0
    for w in widths:
        acc.add(a[:, start : start + w], b[start : start + w])
        start += w
    assert_product(acc.result(), a, b)


def test_benchmark_help_says_it_needs_a_gpu() -> None:
    done = run_cli("--help", module="benchmarks.gpu_kernels", timeout=300)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "needs a CUDA GPU" in text and "CuPy" in text and "cannot run on CPU-only" in text
    assert "--sizes" in text and "--repeats" in text


@no_cublas
def test_benchmark_without_a_gpu_exits_2() -> None:
    done = run_cli(
        "--sizes", "64", module="benchmarks.gpu_kernels", env={"NUMBA_ENABLE_CUDASIM": None}
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("error:") and "needs a CUDA GPU and CuPy" in line, line


def test_benchmark_table_ratio_to_cublas() -> None:
    from benchmarks.gpu_kernels import Row, format_table, tflops

    rows = [
        Row(4096, "float32", "cublas", True, 0.004, 0.0),
        Row(4096, "float32", "blocked_float32", True, 0.008, 1e-6),
    ]
    table = format_table(rows, "Test GPU")
    assert "| 4096 | float32 | blocked_float32* | 8.000 | 17.18 | 0.50 | 1.0e-06 |" in table
    assert tflops(1000, 1.0) == pytest.approx(2e-3)

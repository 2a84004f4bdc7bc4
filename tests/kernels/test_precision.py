"""--precision at the kernel layer: which backend computes what, the refusals, and cuBLAS's
math mode set for a TF32 call and restored after it (against tests/kernels/test_cublas.py's
numpy-backed fake CuPy)."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from kernels.backends import BACKENDS, check_precision, make_accumulator
from tests.helpers import assert_product, random_matrix
from tests.kernels.test_cublas import FakeCupy

DEFAULT_MATH, TF32_TENSOR_OP_MATH = 0, 3  # cublasMath_t values


@pytest.mark.parametrize(
    ("backend", "dtype", "precision", "message"),
    [
        ("cpu", "float32", "fp32", None),
        ("cpu", "float64", "fp32", None),  # fp32 = the dtype's own arithmetic, as today
        ("cuda", "float32", "tf32", None),
        ("cuda", "float32", "3xtf32", None),
        ("cublas", "float32", "tf32", None),
        (
            "cpu",
            "float32",
            "tf32",
            "the cpu backend computes fp32 only; use --backend cuda or cublas",
        ),
        ("cpu", "float32", "3xtf32", "the cpu backend computes fp32 only; use --backend cuda \\(a"),
        ("cublas", "float32", "3xtf32", "the cublas backend computes fp32 or tf32 only"),
        (
            "cuda",
            "float64",
            "tf32",
            "rounds float32 inputs for tensor cores; the product computes in float64",
        ),
        ("cuda", "float32", "fp16", "unknown precision 'fp16'; choose fp32, tf32, 3xtf32"),
    ],
)
def test_check_precision(backend: str, dtype: str, precision: str, message: str | None) -> None:
    if message is None:
        check_precision(backend, dtype, precision)
        return
    with pytest.raises(ValueError, match=message):
        check_precision(backend, dtype, precision)


def test_cpu_refuses_tensor_precisions_before_allocating() -> None:
    with pytest.raises(ValueError, match="--precision tf32: the cpu backend computes fp32 only"):
        make_accumulator("cpu", (4, 4), "float32", precision="tf32")
    assert BACKENDS["cpu"].precisions == ("fp32",)


class FakeCublasLib(types.ModuleType):
    """cupy_backends.cuda.libs.cublas: the handle's math mode, and a log of every change."""

    CUBLAS_DEFAULT_MATH = DEFAULT_MATH
    CUBLAS_TF32_TENSOR_OP_MATH = TF32_TENSOR_OP_MATH

    def __init__(self) -> None:
        super().__init__("cupy_backends.cuda.libs.cublas")
        self.mode = {7: DEFAULT_MATH}
        self.log: list[int] = []

    def getMathMode(self, handle: int) -> int:  # noqa: N802 - CuPy's name
        return self.mode[handle]

    def setMathMode(self, handle: int, mode: int) -> None:  # noqa: N802 - CuPy's name
        self.mode[handle] = mode
        self.log.append(mode)


@pytest.fixture
def fake_cublas(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCupy, FakeCublasLib]:
    cupy, lib = FakeCupy(), FakeCublasLib()
    cupy.cuda.device = types.SimpleNamespace(get_cublas_handle=lambda: 7)  # type: ignore[attr-defined]
    modes_seen: list[int] = []
    gemm = cupy._gemm

    def gemm_noting_mode(*args: Any, **kwargs: Any) -> Any:
        modes_seen.append(lib.mode[7])
        return gemm(*args, **kwargs)

    cupy.cublas = types.SimpleNamespace(gemm=gemm_noting_mode)
    cupy.modes_seen = modes_seen  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cublas", cupy.cublas)  # type: ignore[arg-type]
    for name in ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setattr(sys.modules["cupy_backends.cuda.libs"], "cublas", lib, raising=False)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.cublas", lib)
    return cupy, lib


@pytest.mark.parametrize(("precision", "during", "log"), [
    ("tf32", [TF32_TENSOR_OP_MATH] * 2, [TF32_TENSOR_OP_MATH, DEFAULT_MATH] * 2),
    ("fp32", [DEFAULT_MATH] * 2, []),  # today's calls: the handle untouched
])  # fmt: skip
def test_cublas_math_mode_is_set_and_restored_per_call(
    fake_cublas: tuple[FakeCupy, FakeCublasLib], precision: str, during: list[int], log: list[int]
) -> None:
    cupy, lib = fake_cublas
    rng = np.random.default_rng(3)
    a, b = random_matrix(rng, (9, 10), "float32"), random_matrix(rng, (10, 6), "float32")
    acc = make_accumulator("cublas", (9, 6), "float32", precision=precision)
    acc.add(a[:, :4], b[:4])
    acc.add(a[:, 4:], b[4:])
    assert cupy.modes_seen == during  # type: ignore[attr-defined]
    assert lib.log == log and lib.mode[7] == DEFAULT_MATH
    assert_product(acc.result(), a, b)


def test_cublas_restores_the_mode_when_gemm_fails(
    fake_cublas: tuple[FakeCupy, FakeCublasLib],
) -> None:
    cupy, lib = fake_cublas
    acc = make_accumulator("cublas", (2, 2), "float32", precision="tf32")
    with pytest.raises(TypeError):  # the panels' dtype is refused before gemm: no mode change
        acc.add(np.ones((2, 2)), np.ones((2, 2)))
    cupy.cublas.gemm = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUBLAS_STATUS_X"))
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_X"):
        acc.add(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))
    assert lib.log == [TF32_TENSOR_OP_MATH, DEFAULT_MATH] and lib.mode[7] == DEFAULT_MATH

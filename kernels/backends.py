"""The backend registry: what each block-product backend is, in one place.

A backend's name, the compute dtypes it takes, where it runs, how its rounding constrains the
plan, how a worker finds out whether it can run it, and how to make its accumulator. The CLI's
choices, the client's backend resolution and the planner all read this table. Pure on import:
numba and CuPy are loaded only inside the probes and factories.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from numpy.typing import NDArray

from kernels import exact
from kernels.constants import CPU_GEMM_BLOCK, CUBLAS_INSTALL, CUDA_INSTALL
from kernels.constants import GPU_DTYPES as GPU_DTYPES

PRECISIONS = ("fp32", "tf32", "3xtf32")
"""What --precision accepts: fp32 (the dtype's own arithmetic: float64 data stays float64),
TF32 tensor cores, or 3xTF32 (three TF32 products per step, float32-class accuracy)."""
PRECISION_UNIT = {"tf32": 2.0**-11, "3xtf32": 2.0**-22}
"""Unit roundoff of a product at a tensor precision: TF32 keeps 10 stored mantissa bits; one
3xTF32 product keeps 22 bits per operand (tests/kernels/test_tf32_emulation.py)."""


class Accumulator(Protocol):
    """``acc += a @ b`` over K panels. ``rows=(r0, r1)`` works on that band of the accumulator
    only (``a`` then holds just those rows), so a finished band can be written out while the
    next one is computed; the bytes are the same as for whole-accumulator calls."""

    def add(
        self, a: NDArray[Any], b: NDArray[Any], rows: tuple[int, int] | None = None
    ) -> None: ...
    def result(self, rows: tuple[int, int] | None = None) -> NDArray[Any]: ...


@dataclass(frozen=True)
class BackendSpec:
    name: str
    dtypes: tuple[str, ...] | None
    """Compute dtypes it multiplies; None: every numeric dtype."""
    device: str
    """"cpu" or "gpu": where the accumulator lives."""
    min_gemm_block: int
    """Smallest gemm block along each axis, in elements (1: rounding ignores the launch)."""
    probe: Callable[[], bool]
    """Runs on a worker: True when this process can run the backend."""
    make_accumulator: Callable[
        [tuple[int, int], str, tuple[int, int] | None, bool, str], Accumulator
    ]
    """(shape, compute dtype, gemm block, upper, precision) -> a zeroed accumulator; ``upper``:
    a Gram product's diagonal tile, whose lower blocks may be skipped (the writer mirrors
    them)."""
    needs: str
    """What a worker must have to run it (for the error that says it lacks it)."""
    fix: str
    """What to do when a worker lacks it."""
    flops_fraction: float | None = None
    """GPU backends: the fraction of the device's peak rate the planner assumes it reaches
    (an assumption until calibrated on a real device; None on the CPU)."""
    make_device: Callable[[dict[str, float]], Any] | None = None
    """Backends driven by the staged engine: (device parameters) -> this process's shared
    device (kernels.device.interface protocol). None: the accumulator is driven panel by panel."""
    explicit_only: bool = False
    """Never chosen by "auto"."""
    calibrates: bool = False
    """A real device: its rates are measured on the workers before planning."""
    modelled: bool = False
    """A modelled device: its figures come from configuration (``tilegemm.emulated.*``), and
    it needs no libraries (nvCOMP for --gpu-decode) on the workers."""
    precisions: tuple[str, ...] = ("fp32",)
    """The --precision values it computes (fp32 everywhere; tensor cores where listed)."""
    packages: tuple[str, ...] = ()
    """Modules it imports that a plain (CPU) install lacks."""
    packages_name: str = ""
    """``packages`` in words, for the error that says they are missing."""
    install: str = ""
    """The command that installs ``packages`` (the extra that brings them)."""
    exact_integers: bool = False
    """Also integer (and bool) accumulators whose panels are read as one of ``dtypes``: exact
    float blocks, each added into the integer accumulator (kernels.exact)."""

    def takes(self, dtype: str, panel_dtype: str = "") -> bool:
        """Computes into a ``dtype`` accumulator from panels read in ``panel_dtype`` (the
        plan's; "": ``dtype``)."""
        if self.dtypes is None or dtype in self.dtypes:
            return True
        return self.exact_integers and exact.is_integer(dtype) and panel_dtype in self.dtypes


def _cpu_accumulator(
    shape: tuple[int, int], dtype: str, block: tuple[int, int] | None, upper: bool, precision: str
) -> Any:
    from kernels.cpu import CpuAccumulator

    return CpuAccumulator(shape, dtype, block, upper)


def _cuda_accumulator(
    shape: tuple[int, int], dtype: str, block: tuple[int, int] | None, upper: bool, precision: str
) -> Any:
    import numpy as np

    from kernels.cuda.host import CudaAccumulator

    return CudaAccumulator(shape, np.dtype(dtype), precision=precision)


def _cublas_accumulator(
    shape: tuple[int, int], dtype: str, block: tuple[int, int] | None, upper: bool, precision: str
) -> Any:
    import numpy as np

    from kernels.cuda.cublas import CublasAccumulator

    return CublasAccumulator(shape, np.dtype(dtype), precision)


def _numba_device(params: dict[str, float]) -> Any:
    from kernels.device.gpu import numba_device

    return numba_device()


def _emulated_device(params: dict[str, float]) -> Any:
    from kernels.device.emulated import DECODE_GBPS
    from kernels.device.shared import shared_device

    memory = int(params["memory_bytes"]) if params.get("memory_bytes") else None
    decode = params.get("decode_gbps") or DECODE_GBPS
    return shared_device(params["tflops"], params["h2d_gbps"], memory, decode)


def _emulated_accumulator(
    shape: tuple[int, int], dtype: str, block: Any, upper: bool, precision: str
) -> Any:
    raise ValueError("the emulated backend runs through the staged engine only (no math)")


def _probe_cuda() -> bool:
    try:
        from kernels.cuda.host import cuda_available

        return cuda_available()
    except Exception:  # noqa: BLE001 - any import or driver failure means "no CUDA"
        return False


def _probe_cublas() -> bool:
    from kernels.cuda.cublas import cublas_available

    return cublas_available()


BACKENDS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec(
            "cuda",
            GPU_DTYPES,
            "gpu",
            # Our kernels sum each element in K order whatever the launch: no fixed blocks.
            1,
            _probe_cuda,
            _cuda_accumulator,
            "a CUDA GPU",
            "use --backend cpu or auto, or start workers with `dask cuda worker`",
            # Our register-blocked kernel: assumed, not measured (no GPU here).
            flops_fraction=0.25,
            make_device=_numba_device,
            calibrates=True,
            precisions=PRECISIONS,
            packages=("numba", "numba_cuda"),
            packages_name="the CUDA packages",
            install=CUDA_INSTALL,
            exact_integers=True,
        ),
        BackendSpec("cpu", None, "cpu", CPU_GEMM_BLOCK, lambda: True, _cpu_accumulator, "", ""),
        BackendSpec(
            "cublas",
            GPU_DTYPES,
            "gpu",
            CPU_GEMM_BLOCK,
            _probe_cublas,
            _cublas_accumulator,
            f"CuPy with cuBLAS ({CUBLAS_INSTALL}) and a CUDA GPU",
            "install CuPy there, or use --backend cuda, cpu or auto",
            flops_fraction=0.92,  # vendor figure: SGEMM ≈ 47 of 51 TFLOP/s on an H100 PCIe
            precisions=("fp32", "tf32"),  # the handle's TF32 math mode; cuBLAS has no 3xTF32
            packages=("cupy",),
            packages_name="CuPy with cuBLAS",
            install=CUBLAS_INSTALL,
            exact_integers=True,
        ),
        BackendSpec(
            "emulated",
            GPU_DTYPES,
            "gpu",
            1,
            lambda: True,
            _emulated_accumulator,
            "",
            "",
            # A modelled device (kernels.device.emulated): kernels and copies take time, do no math;
            # for measuring how well the host feeds a GPU (tilegemm.emulated.* settings).
            flops_fraction=1.0,
            make_device=_emulated_device,
            explicit_only=True,
            modelled=True,
        ),
    )
}
AUTO = "auto"
CHOICES = (AUTO, *BACKENDS)
"""What --backend accepts."""
CPU = "cpu"
"""What "auto" becomes without a GPU on every worker, and what a plan assumes before then."""
AUTO_GPU = "cuda"
"""What "auto" becomes when every worker has a GPU and the dtype suits it."""


def staged_backends() -> tuple[str, ...]:
    """Backends driven by the staged engine (a device of their own)."""
    return tuple(name for name, spec in BACKENDS.items() if spec.make_device is not None)


def get_backend(name: str) -> BackendSpec:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose {', '.join(CHOICES)}")
    return BACKENDS[name]


def check_precision(backend: str, dtype: str, precision: str) -> None:
    """ValueError (one line: what, the numbers, the fix) unless ``backend`` computes ``dtype``
    at ``precision``. The cpu backend refuses tf32 and 3xtf32 rather than emulating them. An
    integer product stays exact at any precision: the tensor-core kernel multiplies the K
    blocks whose values TF32 holds (int8, uint8, bool data), the fp32 one the others."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    spec = get_backend(backend)
    if precision not in spec.precisions:
        raise ValueError(
            f"--precision {precision}: the {backend} backend computes "
            f"{' or '.join(spec.precisions)} only; use --backend "
            f"{' or '.join(n for n, s in BACKENDS.items() if precision in s.precisions)} "
            "(a GPU), or --precision fp32"
        )
    if exact.is_integer(dtype) and spec.exact_integers:
        return  # tensor cores on the blocks whose values they multiply exactly (<= 2**11)
    if dtype != "float32":
        raise ValueError(
            f"--precision {precision} rounds float32 inputs for tensor cores; the product "
            f"computes in {dtype}: use --precision fp32, or float32 inputs (--dtype float32)"
        )


def make_accumulator(
    backend: str,
    shape: tuple[int, int],
    dtype: str,
    block: tuple[int, int] | None = None,
    upper: bool = False,
    precision: str = "fp32",
) -> Accumulator:
    """A zeroed ``shape`` accumulator on a resolved backend (see BACKENDS).

    ``block``: the CPU backend's fixed gemm block (see kernels.cpu); the GPU kernels sum each
    element in K order whatever the launch shape, so they don't need it. ``upper``: a Gram
    product's diagonal tile (``b`` is ``a`` transposed); the CPU computes its upper blocks
    only, the GPU backends the whole tile (the writer mirrors the upper triangle either way).
    """
    check_precision(backend, dtype, precision)
    return get_backend(backend).make_accumulator(shape, dtype, block, upper, precision)


def probe_devices(requested: str = AUTO) -> dict[str, bool]:
    """Runs on a worker: what it can run. "gpu" is a real GPU (not the simulator), "seen" a
    GPU here whether or not it can be used, "NAME installed" backend NAME's packages.

    NVML answers "is there a GPU" cheaply; a GPU backend's probe (numba, slow to import, or
    CuPy) runs only when a GPU is there or that backend was asked for by name, and its
    packages are installed, so a CPU job never imports them.
    """
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    real_gpu = _nvml_gpus() > 0 and not simulator
    # NVML's Python package comes with the cuda extra; without it, the driver lists the GPUs.
    seen = real_gpu or (not simulator and driver_gpus() > 0 and not importable("pynvml"))
    found = {"simulator": simulator, "seen": seen}
    for spec in BACKENDS.values():
        software = spec.device == "cpu" or spec.explicit_only  # cheap: nothing to look for
        if software or spec.name == requested or (seen and spec.name == AUTO_GPU):
            installed = not missing_packages(spec.name)
            found[spec.name] = installed and spec.probe()
            if spec.packages:
                found[f"{spec.name} installed"] = installed
    found["gpu"] = found.get("cuda", False) and not simulator
    return found


def missing_packages(backend: str) -> tuple[str, ...]:
    """The modules of ``backend`` that cannot be imported here, found without importing them
    (numba takes seconds to import)."""
    return tuple(name for name in get_backend(backend).packages if not importable(name))


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed package
        return False


def driver_gpus() -> int:
    """GPUs the NVIDIA driver lists, for when NVML's Python package is not installed."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _nvml_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - no driver or library: no GPU
        return 0

"""Register-blocked kernels: simulator correctness on ragged and interior shapes, and the generator.

Operands are poisoned as in tests/kernels/poisoned.py: an out-of-bounds read (missing zero fill)
or write shows up as NaN, and a skipped output keeps its random start.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from kernels.cuda import host as cuda_host
from kernels.cuda.blocked import kernel as cuda_blocked
from kernels.cuda.blocked.spec import F32_SPEC, F64_SPEC, BlockedSpec
from tests.kernels.poisoned import assert_matmul_close, run_poisoned

SPECS = {"float32": F32_SPEC, "float64": F64_SPEC}

needs_cuda = pytest.mark.skipif(
    not cuda_host.cuda_available(), reason="needs a GPU or NUMBA_ENABLE_CUDASIM=1"
)
# Test shapes are tiny on purpose; on a real GPU numba warns about the small grids.
tiny_grid = pytest.mark.filterwarnings("ignore:Grid size .* under-utilization")


def run_poisoned_spec(spec: BlockedSpec, shape: tuple[int, int, int]) -> None:
    m, _, n = shape
    kernel = cuda_blocked.make_blocked_kernel(spec)
    run_poisoned(kernel, cuda_blocked.launch_for(spec, m, n), shape, np.dtype(spec.dtype))


@needs_cuda
@tiny_grid
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 1),  # smallest: every load but one is zero fill
        (1, 9, 130),  # 1 x N, two block columns for float32, three for float64
        (130, 9, 1),  # N x 1, two or three block rows
        (5, 13, 7),  # K not a multiple of BK, nothing divisible
        (3, 0, 5),  # K = 0: C unchanged, no tile loaded
    ],
)
def test_blocked_kernel_ragged(dtype: str, shape: tuple[int, int, int]) -> None:
    run_poisoned_spec(SPECS[dtype], shape)


@needs_cuda
@tiny_grid
@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        ("float32", (128, 32, 128)),  # one full block: three unchecked K tiles, then the last
        ("float64", (64, 40, 64)),  # one full block, K a multiple of BK
        ("float32", (128, 21, 128)),  # full block, ragged K: unchecked then zero-filled tiles
        ("float64", (70, 19, 66)),  # full block beside edge blocks in both directions
    ],
)
def test_blocked_kernel_interior_path(dtype: str, shape: tuple[int, int, int]) -> None:
    run_poisoned_spec(SPECS[dtype], shape)


@needs_cuda
@tiny_grid
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocked_kernel_mixed_grid(dtype: str) -> None:
    """A 2 x 2 grid of blocks of which only one is full, several K tiles."""
    spec = SPECS[dtype]
    run_poisoned_spec(spec, (spec.block_m + 9, 45, spec.block_n + 3))


@needs_cuda
@tiny_grid
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_default_accumulator_streams_panels(dtype: str) -> None:
    """The cuda backend's default variant, K streamed as panels of uneven width (one empty)."""
    m, n, widths = 70, 33, [8, 0, 13, 1]
    acc = cuda_host.CudaAccumulator((m, n), np.dtype(dtype))
    assert acc.variant.name == f"blocked_{dtype}"
    rng = np.random.default_rng(7)
    panels = [
        (rng.standard_normal((m, w)).astype(dtype), rng.standard_normal((w, n)).astype(dtype))
        for w in widths
    ]
    for a, b in panels:
        acc.add(a, b)
    got = acc.result()
    assert got.dtype == dtype and got.shape == (m, n) and got.flags.c_contiguous
    # The panels' products summed are the product of the panels side by side.
    a_all, b_all = np.hstack([a for a, _ in panels]), np.vstack([b for _, b in panels])
    assert_matmul_close(got, a_all, b_all)


# --- the generator (pure) -----------------------------------------------------------------------


@needs_cuda
@tiny_grid
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_accumulator_bands_give_the_bytes_of_whole_calls(dtype: str) -> None:
    """Tasks add the last panel band by band to write finished bands early; every element is
    summed in K order whatever the launch, so the bytes match whole-accumulator calls."""
    rng = np.random.default_rng(11)
    m, n = 70, 33
    a1, a2 = rng.standard_normal((m, 17)).astype(dtype), rng.standard_normal((m, 6)).astype(dtype)
    b1, b2 = rng.standard_normal((17, n)).astype(dtype), rng.standard_normal((6, n)).astype(dtype)
    whole = cuda_host.CudaAccumulator((m, n), np.dtype(dtype))
    whole.add(a1, b1)
    whole.add(a2, b2)
    banded = cuda_host.CudaAccumulator((m, n), np.dtype(dtype))
    banded.add(a1, b1)
    for r0, r1 in [(0, 32), (32, 64), (64, 70)]:
        banded.add(a2[r0:r1], b2, rows=(r0, r1))
        assert banded.result((r0, r1)).tobytes() == whole.result()[r0:r1].tobytes()
    assert banded.result().tobytes() == whole.result().tobytes()
    with pytest.raises(ValueError, match="outside the accumulator's 70 rows"):
        banded.add(a2[:8], b2, rows=(64, 72))


@pytest.mark.parametrize("spec", [F32_SPEC, F64_SPEC], ids=["f32", "f64"])
def test_generated_source_shape(spec: BlockedSpec) -> None:
    src = cuda_blocked.generate_source(spec)
    compile(src, "<generated>", "exec")  # valid Python
    outputs = (2 * spec.frag) ** 2
    assert src.count(" = zero\n") >= outputs  # typed accumulators
    assert "//" not in src.split("n_tiles =")[0]  # index math with shifts and masks only
    assert " % " not in src
    assert src.count("cuda.syncthreads()") == 3  # tile 0, unchecked loop, checked loop
    per_tile = spec.block_k * outputs
    assert src.count("+= x") == 2 * per_tile  # BK loop written out in both K loops


def test_bad_generator_options_show_in_source() -> None:
    spec = dataclasses.replace(F32_SPEC, index_math="divmod", acc_init="float64")
    src = cuda_blocked.generate_source(spec)
    assert "(tid // 16)" in src and "(tid % 16)" in src
    assert "c0_0 = 0.0" in src


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"dtype": "int32"}, "support float32 and float64"),
        ({"block_m": 96}, "powers of two"),
        ({"threads": 128}, "do not cover a 128x128 tile"),
        ({"block_k": 2}, "does not split over the threads"),
    ],
)
def test_spec_validation(changes: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        dataclasses.replace(F32_SPEC, **changes)


def test_specs_fit_the_targets_on_paper() -> None:
    assert F32_SPEC.shared_bytes <= 48 * 1024
    assert F64_SPEC.shared_bytes <= 48 * 1024
    assert F32_SPEC.launch_bounds == (256, 2)  # 65536 / 512 = 128 registers

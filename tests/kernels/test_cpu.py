"""CPU backend: gemm with beta=1 into the accumulator, against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import make_accumulator
from kernels.cpu import cblas_gemm


@pytest.mark.parametrize(
    ("m", "n", "widths"),
    [
        (37, 23, [5, 11, 1]),  # ragged panels
        (1, 50, [30, 30]),  # one row
        (50, 1, [7]),  # one column
        (16, 16, [0, 4]),  # an empty panel is a no-op
        (0, 5, [3]),  # empty output
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "complex64"])
def test_accumulates_panels(m: int, n: int, widths: list[int], dtype: str) -> None:
    rng = np.random.default_rng(m * 100 + n)
    k = sum(widths)
    a = (rng.uniform(-1, 1, (m, k)) * 10).astype(dtype)
    b = (rng.uniform(-1, 1, (k, n)) * 10).astype(dtype)
    acc = make_accumulator("cpu", (m, n), dtype)
    start = 0
    for w in widths:
        acc.add(a[:, start : start + w], b[start : start + w])  # views, not contiguous
        start += w
    got = acc.result()
    want = a.astype("complex128") @ b.astype("complex128")
    assert got.dtype == np.dtype(dtype) and got.shape == (m, n)
    tol = {"float32": 1e-4, "complex64": 1e-4}.get(dtype, 1e-12) * 100 * max(k, 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


def test_uses_gil_free_blas_for_floats() -> None:
    # numpy >= 2 wheels bundle OpenBLAS; if this fails the slower fallback is in use.
    assert cblas_gemm("float32") is not None
    assert cblas_gemm("float64") is not None


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_bands_give_the_bytes_of_whole_calls(dtype: str) -> None:
    """The last panel added band by band (as tasks do to write while computing) must give the
    very bytes of one whole call: each gemm call is the same block call."""
    rng = np.random.default_rng(3)
    (m, n), block = (70, 45), (16, 20)
    a1, a2 = (
        (rng.uniform(-1, 1, (m, 33)) * 10).astype(dtype),
        (rng.uniform(-1, 1, (m, 9)) * 10).astype(dtype),
    )
    b1, b2 = (
        (rng.uniform(-1, 1, (33, n)) * 10).astype(dtype),
        (rng.uniform(-1, 1, (9, n)) * 10).astype(dtype),
    )
    whole = make_accumulator("cpu", (m, n), dtype, block)
    whole.add(a1, b1)
    whole.add(a2, b2)
    banded = make_accumulator("cpu", (m, n), dtype, block)
    banded.add(a1, b1)
    for r0, r1 in [(0, 32), (32, 48), (48, 70)]:
        banded.add(a2[r0:r1], b2, rows=(r0, r1))
        assert np.array_equal(banded.result((r0, r1)), whole.result()[r0:r1])
    assert banded.result().tobytes() == whole.result().tobytes()


def test_band_must_start_on_a_block_row_and_fit() -> None:
    acc = make_accumulator("cpu", (8, 4), "float32", (4, 4))
    with pytest.raises(ValueError, match="start on a block row of 4"):
        acc.add(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), rows=(2, 4))
    with pytest.raises(ValueError, match="don't fit accumulator rows"):
        acc.add(np.ones((3, 3), np.float32), np.ones((3, 4), np.float32), rows=(4, 8))
    assert not acc.result().any()  # a refused call changes nothing


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_transposed_views_need_no_copy_and_match(dtype: str) -> None:
    """A panel read transposed comes as the transposed view of the stored block: BLAS reads it
    in place (transpose flag), bitwise the same as the C-ordered copy."""
    from kernels.cpu import TRANS, blas_layout

    rng = np.random.default_rng(1)
    stored = rng.uniform(-1, 1, (300, 700)).astype(dtype)  # K x M as stored
    b = rng.uniform(-1, 1, (300, 90)).astype(dtype)
    if dtype.startswith("float"):
        assert blas_layout(stored.T) == (TRANS, 700) and blas_layout(stored.T[256:512]) == (
            TRANS,
            700,
        )
    views, copies = (make_accumulator("cpu", (700, 90), dtype, (256, 256)) for _ in range(2))
    views.add(stored.T, b)
    copies.add(np.ascontiguousarray(stored.T), b)
    np.testing.assert_array_equal(views.result(), copies.result())


def test_upper_accumulator_computes_the_upper_blocks_only() -> None:
    """A Gram product's diagonal tile: blocks on and above the diagonal (diagonal ones by
    ?syrk, upper triangle), band by band as the write path calls it."""
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (400, 600)).astype("float32")
    acc = make_accumulator("cpu", (600, 600), "float32", (256, 256), upper=True)
    for r0, r1 in ((0, 256), (256, 512), (512, 600)):
        acc.add(x.T[r0:r1], x, rows=(r0, r1))
    got, want = acc.result(), x.T.astype("float64") @ x
    upper = np.triu(np.ones((600, 600), dtype=bool))
    assert np.abs(got - want)[upper].max() < 1e-3
    assert (got[512:, :512] == 0).all()  # a block below the diagonal: never computed

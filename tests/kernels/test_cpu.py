"""CPU backend: gemm with beta=1 into the accumulator, against float64 numpy."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kernels import cpu
from kernels.backends import make_accumulator
from kernels.cpu import NO_TRANS, TRANS, CpuAccumulator, blas_layout, cblas_gemm
from tests.helpers import assert_product

Call = tuple[str, int, int, int, int]
"""One BLAS call: (routine, rows, columns, K, address of A's first element)."""


@pytest.fixture
def blas_calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """The BLAS calls of the accumulators made after this fixture, in order."""
    calls: list[Call] = []

    def recording(find: Callable[[str], Any], name: str, where: tuple[int, ...]) -> Any:
        def found(dtype: str) -> Any:
            fn = find(dtype)
            if fn is None:
                return None

            def call(*args: Any) -> None:
                calls.append((name, *(args[i] for i in where)))
                fn(*args)

            return call

        return found

    monkeypatch.setattr(cpu, "cblas_gemm", recording(cpu.cblas_gemm, "gemm", (3, 4, 5, 7)))
    monkeypatch.setattr(cpu, "cblas_syrk", recording(cpu.cblas_syrk, "syrk", (3, 3, 4, 6)))
    return calls


@pytest.mark.parametrize(
    ("m", "n", "widths"),
    [
        (37, 23, [5, 11, 1]),  # ragged panels
        (1, 50, [30, 30]),  # one row
        (50, 1, [7]),  # one column
        (16, 16, [0, 4]),  # an empty panel is a no-op
        (1, 1, [3]),  # one element
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
    acc = make_accumulator("cpu", (8, 4), "float32", (4, 2))
    with pytest.raises(ValueError, match=r"^rows 2:4 must start on a block row of 4$"):
        acc.add(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), rows=(2, 4))
    with pytest.raises(ValueError, match=r"panels \(3, 3\) @ \(3, 4\) don't fit .* \(4, 4\)"):
        acc.add(np.ones((3, 3), np.float32), np.ones((3, 4), np.float32), rows=(4, 8))
    assert not acc.result().any()  # a refused call changes nothing
    whole = make_accumulator("cpu", (8, 4), "float32")  # no block: the accumulator is one
    with pytest.raises(ValueError, match=r"^rows 4:8 must start on a block row of 8$"):
        whole.add(np.ones((4, 3), np.float32), np.ones((3, 4), np.float32), rows=(4, 8))
    one_row = make_accumulator("cpu", (1, 3), "float32")
    one_row.add(np.ones((0, 2), np.float32), np.ones((2, 3), np.float32), rows=(1, 1))  # empty
    assert not one_row.result().any()


@pytest.mark.parametrize(
    ("stored", "view", "layout"),
    [
        ((5, 3), lambda x: x, (NO_TRANS, 3)),  # C-ordered
        ((5, 1), lambda x: x, (NO_TRANS, 1)),  # one column
        ((1, 1), lambda x: x, (NO_TRANS, 1)),
        ((5, 8), lambda x: x[1:, 2:5], (NO_TRANS, 8)),  # a window of a wider block
        ((3, 5), lambda x: x.T, (TRANS, 5)),  # the transposed view of a stored block
        ((5, 1), lambda x: x.T, (TRANS, 1)),  # a stored column, read as a row
        ((8, 5), lambda x: x.T[1:, 2:5], (TRANS, 5)),  # a window of a transposed block
        ((5, 6), lambda x: x[:, ::2], None),  # every other column: copied first
        ((3, 10), lambda x: x[:, ::2].T, None),  # a transposed view of that
        ((6, 5), lambda x: x[::2, ::2], None),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])  # in elements, not bytes
def test_blas_layout(
    stored: tuple[int, int], view: Callable[[Any], Any], layout: Any, dtype: str
) -> None:
    """How row-major BLAS reads a panel in place (transpose flag, leading dimension), or None
    when only a copy can be read."""
    assert blas_layout(view(np.zeros(stored, dtype))) == layout


@pytest.mark.parametrize(
    ("shape", "block", "rows", "cols"),
    [
        ((70, 45), (32, 20), [32, 32, 6], [20, 20, 5]),  # ragged last blocks
        ((4, 4), (2, 2), [2, 2], [2, 2]),  # square, not a Gram tile: the lower blocks too
        ((3, 2), (1, 1), [1, 1, 1], [1, 1]),  # one-element blocks
        ((3, 2), None, [3], [2]),  # no block: one call for the whole accumulator
    ],
)
def test_one_blas_call_per_block_reading_panels_in_place(
    blas_calls: list[Call],
    shape: tuple[int, int],
    block: tuple[int, int] | None,
    rows: list[int],
    cols: list[int],
) -> None:
    """Each ?gemm call is one block of the accumulator (so its rounding, and the bytes, do not
    depend on the tiling), reading A where it lies: no copy of a panel already in the
    accumulator's dtype."""
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (shape[0], 33)).astype("float64")
    b = rng.uniform(-1, 1, (33, shape[1])).astype("float64")
    acc = CpuAccumulator(shape, "float64", block)  # upper=False: the whole product
    acc.add(a[:, :0], b[:0])  # an empty panel: no call
    acc.add(a, b)
    assert_product(acc.result(), a, b)
    starts = np.cumsum([0, *rows[:-1]])
    assert blas_calls == [
        ("gemm", h, w, 33, a.ctypes.data + int(i) * a.strides[0])
        for h, i in zip(rows, starts, strict=True)
        for w in cols
    ]


@pytest.mark.parametrize(
    ("panel_dtype", "dtype"),
    [
        ("float32", "float32"),
        ("float64", "float32"),  # the accumulator in float32: panels converted first
        ("float32", "float64"),
        ("int8", "int32"),  # int8 sums would wrap: converted to int32 first
    ],
)
def test_strided_and_converted_panels_match_numpy(panel_dtype: str, dtype: str) -> None:
    """Panels BLAS cannot read in place (every other column, a transposed view of every other
    row) or of another dtype than the accumulator are multiplied right all the same."""
    rng = np.random.default_rng(4)
    m, k, n = 30, 40, 20

    def values(shape: tuple[int, int]) -> Any:
        if panel_dtype == "int8":
            return rng.choice(np.array([-128, 127], "int8"), size=shape)
        return rng.uniform(-1, 1, shape).astype(panel_dtype)

    a_cols, b_cols = values((m, 2 * k))[:, ::2], values((k, 2 * n))[:, ::2]
    a_t, b_t = values((k, 2 * m))[:, ::2].T, values((n, 2 * k))[:, ::2].T
    a, b = values((m, k)), values((k, n))
    acc = make_accumulator("cpu", (m, n), dtype)
    for x, y in [(a_cols, b), (a, b_cols), (a_t, b_t), (a, b)]:
        acc.add(x, y)
    wide = np.concatenate([a_cols, a, a_t, a], axis=1)
    assert_product(acc.result(), wide, np.concatenate([b, b_cols, b_t, b]), dtype)


@pytest.mark.parametrize("strided", [False, True])  # BLAS, or numpy for what BLAS can't read
def test_non_finite_products_give_inf_and_nan_quietly(strided: bool) -> None:
    """inf and NaN go into the output (verify reports them), with no warning per task."""
    acc = make_accumulator("cpu", (2, 2), "float32")
    ones = np.ones((2, 2), np.float32)

    def panel(value: float) -> Any:
        return np.full((2, 2), value, np.float32)[:, ::2] if strided else ones[:, :1] * value

    acc.add(panel(3e38), ones[:1])
    acc.add(panel(3e38), ones[:1])  # over float32's largest: inf
    assert np.isposinf(acc.result()).all()
    acc.add(panel(-np.inf), ones[:1])  # inf - inf
    assert np.isnan(acc.result()).all()


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


@pytest.mark.parametrize(
    "bands",
    [
        [(0, 256), (256, 512), (512, 600)],  # one block row a band
        [(0, 384), (384, 600)],  # several block rows a band, the second not at row 0
    ],
)
def test_upper_accumulator_computes_the_upper_blocks_only(
    blas_calls: list[Call], bands: list[tuple[int, int]]
) -> None:
    """A Gram product's diagonal tile: blocks on and above the diagonal (diagonal ones by
    ?syrk, upper triangle: half the flops), band by band as the write path calls it, over two
    K panels; the writer mirrors the upper triangle."""
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (400, 600)).astype("float32")
    acc = make_accumulator("cpu", (600, 600), "float32", (128, 128), upper=True)
    for k0, k1 in ((0, 250), (250, 400)):
        for r0, r1 in bands:
            acc.add(x[k0:k1, r0:r1].T, x[k0:k1], rows=(r0, r1))
    got = acc.result()
    assert (np.tril(got, -1) == 0).all()  # below the diagonal: never computed
    assert_product(np.triu(got) + np.triu(got, 1).T, x.T, x)
    # 5 x 5 blocks: 5 on the diagonal, 10 above it, per K panel
    assert Counter(name for name, *_ in blas_calls) == {"syrk": 2 * 5, "gemm": 2 * 10}


@pytest.fixture
def shared_threads() -> Any:
    """Two shared gemm threads for the test, then back to one thread per task."""
    cpu.share_cores(2)
    yield
    cpu.share_cores(1)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_shared_threads_give_the_bytes_of_one_thread(
    upper: bool, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    x = (rng.uniform(-1, 1, (70, 90)) * 10).astype(dtype)
    b = x.T.copy() if upper else (rng.uniform(-1, 1, (90, 45)) * 10).astype(dtype)
    shape = (70, 70) if upper else (70, 45)

    def product() -> tuple[np.ndarray, set[str]]:
        acc = CpuAccumulator(shape, dtype, (16, 16), upper=upper)
        names: set[str] = set()
        # integers take the exact route's blocks (kernels.exact), floats the plain ones
        which = "_exact_block" if dtype == "int64" else "_block"
        block = getattr(acc, which)

        def recorded(*args: Any) -> None:
            names.add(threading.current_thread().name)
            block(*args)

        monkeypatch.setattr(acc, which, recorded)
        for k0, k1 in ((0, 40), (40, 90)):
            acc.add(x[:, k0:k1], b[k0:k1])
        return acc.result().copy(), names

    alone, alone_names = product()
    cpu.share_cores(2)
    try:
        shared, shared_names = product()
    finally:
        cpu.share_cores(1)
    assert alone.tobytes() == shared.tobytes()
    assert alone_names == {threading.current_thread().name}
    assert shared_names and all(n.startswith(f"{cpu.GEMM_THREAD}_") for n in shared_names)


def test_a_failed_block_raises_once_every_block_has_stopped(
    shared_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    acc = CpuAccumulator((64, 64), "float32", (8, 8))
    block, finished = acc._block, []

    def failing(a: Any, b: Any, out: Any, diagonal: bool) -> None:
        if not finished:
            finished.append(None)
            raise RuntimeError("block failed")
        time.sleep(0.001)  # still writing when the first one fails
        block(a, b, out, diagonal)
        finished.append(None)

    monkeypatch.setattr(acc, "_block", failing)
    ones = np.ones((64, 4), np.float32)
    with pytest.raises(RuntimeError, match="block failed"):
        acc.add(ones, ones.T.copy())
    count = len(finished)
    time.sleep(0.05)
    # The other groups of blocks ran to their end before it raised (the failed group stops),
    # and nothing writes into the accumulator after.
    assert len(finished) == count == 64 - (64 // (2 * cpu.GROUPS_PER_THREAD) - 1)


def test_one_shared_thread_is_no_pool() -> None:
    cpu.share_cores(1)
    assert cpu._pool() == (None, 1)
    cpu.share_cores(3)
    try:
        pool, threads = cpu._pool()
        assert threads == 3 and pool is not None and pool._max_workers == 3
        cpu.share_cores(3)
        assert cpu._pool()[0] is pool  # the same size keeps the same pool
    finally:
        cpu.share_cores(1)

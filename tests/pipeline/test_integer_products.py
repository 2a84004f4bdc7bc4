"""Integer and bool products end to end (API and CLI): bit for bit numpy's integer product in
every integer OUT the overflow check allows, with K cut into several panels and unaligned
tiles, the worst case the check allows reached exactly; in float OUTs; refused (before any
work) in every OUT it does not allow."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

import pipeline.plan.search
from pipeline import gram, multiply
from pipeline.errors import IntegerOverflowError
from pipeline.plan.matmul import MatmulPlan, cpu_work
from pipeline.plan.model import INTEGER_SLOWDOWN, resource_seconds
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec, OutputSpec
from tests.child_env import child_env
from tests.helpers import assert_product, write_array

M, N = 13, 11
INTEGER_OUTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
FLOAT_OUTS = ("float16", "float32", "float64")
SIGNIFICAND_BITS = {"float16": 24, "float32": 24, "float64": 53}
"""Of each float OUT's accumulator (float16 sums in float32)."""
CLI = ("--workers", "1", "--threads-per-worker", "1", "--dashboard-address", "127.0.0.1:0",
       "--no-progress")  # fmt: skip

CASES = [
    # (A's dtype, B's dtype, K, the OUT dtypes the overflow check allows)
    ("int8", "int8", 1, {"int16", "int32", "int64", *FLOAT_OUTS}),  # (-128)² fits int16
    ("int8", "int8", 2, {"int32", "int64", *FLOAT_OUTS}),  # 2·(-128)² = 32768: not int16
    ("int8", "bool", 256, {"int16", "int32", "int64", *FLOAT_OUTS}),  # -32768: int16's bottom
    ("uint8", "uint8", 1, {"uint16", "int32", "uint32", "int64", "uint64", *FLOAT_OUTS}),
    ("uint8", "bool", 257, {"uint16", "int32", "uint32", "int64", "uint64", "float32",
                            "float64"}),  # 257·255 = 65535: uint16's top, past float16's
    ("int16", "int16", 1, {"int32", "int64", "float32", "float64"}),
    ("int16", "int16", 2, {"int64", "float32", "float64"}),  # 2·2**30 = 2**31
    ("uint16", "uint16", 1, {"uint32", "int64", "uint64", "float32", "float64"}),
    ("uint16", "uint8", 257, {"uint32", "int64", "uint64", "float32", "float64"}),
    ("int32", "int32", 1, {"int64", "float32", "float64"}),
    ("int32", "bool", 300, {"int64", "float32", "float64"}),
    ("bool", "bool", 127, {*INTEGER_OUTS, *FLOAT_OUTS}),  # path counts up to int8's top
    ("bool", "bool", 128, {*INTEGER_OUTS, *FLOAT_OUTS} - {"int8"}),
    ("bool", "bool", 256, {*INTEGER_OUTS, *FLOAT_OUTS} - {"int8", "uint8"}),
]  # fmt: skip


@pytest.fixture
def narrow_panels(monkeypatch: pytest.MonkeyPatch) -> None:
    """K panels one chunk wide (the planner merges chunks into panels of at least 512), so a
    short K is cut into several panels, each added into the integer accumulator."""
    monkeypatch.setattr(pipeline.plan.search, "MIN_PANEL_WIDTH", 1)


def extremes(dtype: str) -> list[int]:
    if dtype == "bool":
        return [0, 1]
    info = np.iinfo(dtype)
    return [int(info.min), int(info.max)]


def operands(a_dtype: str, b_dtype: str, k: int) -> tuple[Any, Any]:
    """Mostly the dtypes' extreme values, and no sum zero (OUT's integer fill is 0: an
    unwritten element must not look right): A's values positive, each column of B of one sign.
    A's row 0 times B's column 0 is the largest sum the dtypes allow, row 1 times column 1 the
    smallest where it is negative."""
    rng = np.random.default_rng(k)

    def draw(shape: tuple[int, int], dtype: str, negative: Any) -> Any:
        if dtype == "bool":
            return rng.random(shape) < 0.9
        lo, hi = extremes(dtype)
        pools = [np.array(p, dtype) for p in ([hi, 1, 7], [lo, -1, -7] if lo else [hi, 1, 7])]
        picks = rng.integers(0, 3, shape)
        return np.where(negative, pools[1][picks], pools[0][picks])

    a = draw((M, k), a_dtype, False)
    b = draw((k, N), b_dtype, rng.random(N) < 0.5)
    x, y = worst_pair(a_dtype, b_dtype, max)
    a[0], b[:, 0] = x, y
    x, y = worst_pair(a_dtype, b_dtype, min)
    if x * y < 0:
        a[1], b[:, 1] = x, y
    return a, b


def worst_pair(a_dtype: str, b_dtype: str, pick: Any) -> tuple[int, int]:
    """The dtypes' extreme values whose product is the largest (``max``) or smallest."""
    pairs = [(x, y) for x in extremes(a_dtype) for y in extremes(b_dtype)]
    return pick(pairs, key=lambda p: p[0] * p[1])  # type: ignore[no-any-return]


def exact_product(a: Any, b: Any) -> Any:
    """numpy's integer product, wide enough for any of CASES (unsigned: uint64)."""
    wide = "uint64" if {a.dtype.kind, b.dtype.kind} <= set("ub") else "int64"
    return a.astype(wide) @ b.astype(wide)


def exact_in_float(a_dtype: str, b_dtype: str, k: int, out: str) -> bool:
    """Whether a float OUT's accumulator holds every partial sum (then OUT is the exact
    product rounded once, as numpy's conversion does)."""
    top = [max(abs(x) for x in extremes(d)) for d in (a_dtype, b_dtype)]
    limit = 2 ** SIGNIFICAND_BITS[out]
    return k * top[0] * top[1] <= limit or (k == 1 and max(top) <= limit)


@pytest.mark.usefixtures("narrow_panels")
@pytest.mark.parametrize(("a_dtype", "b_dtype", "k", "allowed"), CASES)
def test_every_allowed_out_is_numpys_product(
    tmp_path: Path, client: Client, a_dtype: str, b_dtype: str, k: int, allowed: set[str]
) -> None:
    a, b = operands(a_dtype, b_dtype, k)
    want = exact_product(a, b)
    assert (want != 0).all(), "an unwritten element (0) would pass"
    x, y = worst_pair(a_dtype, b_dtype, max)
    assert int(want.max()) == k * x * y, "the largest sum the dtypes allow, reached"
    x, y = worst_pair(a_dtype, b_dtype, min)
    assert int(want.min()) == k * x * y or x * y >= 0, "the smallest, where negative"
    chunk = k // 5 + 1  # K cut unaligned: 5 or 6 panels
    a_url = write_array(tmp_path / "a.zarr", a, (5, chunk))
    b_url = write_array(tmp_path / "b.zarr", b, (chunk, 4))
    for out in INTEGER_OUTS + FLOAT_OUTS:
        path = tmp_path / f"{out}.zarr"
        if out not in allowed:
            with pytest.raises(IntegerOverflowError, match=r"^integer overflow: "):
                multiply(a_url, b_url, str(path), client=client, dtype=out)
            assert not path.exists(), "refused before any work"
            continue
        result = multiply(a_url, b_url, str(path), client=client, dtype=out)
        assert len(result.plan.k_panels) == -(-k // chunk)
        got = zarr.open_array(str(path))[:]
        assert got.dtype == np.dtype(out)
        if out in INTEGER_OUTS or exact_in_float(a_dtype, b_dtype, k, out):
            np.testing.assert_array_equal(got, want.astype(out), strict=True)
        else:  # the panels or the sums round in float32: within its bound
            assert_product(got, a, b, out)


def test_a_bool_product_into_bool_is_or_of_ands(tmp_path: Path, client: Client) -> None:
    """bool @ bool's default OUT is bool (numpy.result_type): allowed for K = 1 only."""
    rng = np.random.default_rng(3)
    a, b = rng.random((M, 1)) < 0.5, rng.random((1, N)) < 0.5
    a_url = write_array(tmp_path / "a.zarr", a, (5, 1))
    b_url = write_array(tmp_path / "b.zarr", b, (1, 4))
    multiply(a_url, b_url, str(tmp_path / "c.zarr"), client=client)
    got = zarr.open_array(str(tmp_path / "c.zarr"))[:]
    np.testing.assert_array_equal(got, a @ b, strict=True)


@pytest.mark.parametrize(
    ("dtype", "k", "out"),
    [
        ("int8", 600, "int32"),  # K over MIN_PANEL_WIDTH: panels as planned, diagonal ?syrk
        ("bool", 127, "int8"),  # path counts up to int8's top
        ("int16", 3, "int64"),  # 3·2**30: past int32
        ("uint8", 1, "uint16"),
    ],
)
@pytest.mark.parametrize("rows", [False, True])
def test_gram_is_numpys_product(
    tmp_path: Path, client: Client, dtype: str, k: int, out: str, rows: bool
) -> None:
    """G = Xᵀ·X (rows: X·Xᵀ): diagonal tiles computed in their upper triangle and mirrored."""
    x, _ = operands(dtype, dtype, k)  # (13, k)
    x = x if rows else np.ascontiguousarray(x.T)  # K along the axis summed over
    x_url = write_array(tmp_path / "x.zarr", x, (5, 128) if rows else (128, 5))
    gram(x_url, str(tmp_path / "g.zarr"), rows=rows, client=client, dtype=out)
    got = zarr.open_array(str(tmp_path / "g.zarr"))[:]
    want = exact_product(x, x.T) if rows else exact_product(x.T, x)
    np.testing.assert_array_equal(got, want.astype(out), strict=True)


def test_gram_refuses_a_sum_past_out(tmp_path: Path, client: Client) -> None:
    x_url = write_array(tmp_path / "x.zarr", np.ones((128, 4), bool), (64, 4))
    with pytest.raises(IntegerOverflowError, match=r"over K=128 can sum to 0\.\.128"):
        gram(x_url, str(tmp_path / "g.zarr"), client=client, dtype="int8")
    assert not (tmp_path / "g.zarr").exists()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip


def test_cli_multiplies_to_int16s_bottom_and_refuses_one_more(tmp_path: Path) -> None:
    """int8 @ bool over K = 256 into int16 reaches -32768 exactly; over K = 257 it is refused
    with one ``error:`` line and exit 2, before any work."""
    a, b = operands("int8", "bool", 257)
    out = tmp_path / "c.zarr"
    urls = [write_array(tmp_path / f"{n}.zarr", x, c) for n, x, c in
            (("a", a[:, :256], (5, 50)), ("b", b[:256], (50, 4)))]  # fmt: skip
    done = run_cli("multiply", *urls, str(out), "--dtype", "int16", *CLI)
    assert done.returncode == 0, done.stderr
    want = exact_product(a[:, :256], b[:256])
    assert int(want.min()) == -32768
    np.testing.assert_array_equal(zarr.open_array(str(out))[:], want.astype("int16"), strict=True)

    wide = [write_array(tmp_path / f"{n}257.zarr", x, c) for n, x, c in
            (("a", a, (5, 50)), ("b", b, (50, 4)))]  # fmt: skip
    refused = tmp_path / "refused.zarr"
    done = run_cli("multiply", *wide, str(refused), "--dtype", "int16", *CLI)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors[0].startswith(
        "error: integer overflow: int8 @ bool over K=257 can sum to -32,896..32,639"
    )
    assert not refused.exists()


def test_int64_out_past_2_53_is_exact(tmp_path: Path, client: Client) -> None:
    """int16 @ int32 over K = 20,000 into int64 (allowed: K·2**46 < 2**63): blocks of 127 are
    each exact in float64, but the running sum passes 2**53 and ends odd."""
    k = 20_000
    a = np.full((2, k), -(2**15), "int16")
    b = np.full((k, 3), -(2**31), "int32")
    a[:, -1], b[-1] = 1, 1
    want = exact_product(a, b)
    assert (want > 2**53).all() and (want % 2 == 1).all()
    a_url = write_array(tmp_path / "a.zarr", a, (2, 4096))
    b_url = write_array(tmp_path / "b.zarr", b, (4096, 3))
    multiply(a_url, b_url, str(tmp_path / "c.zarr"), client=client, dtype="int64")
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "c.zarr"))[:], want)


def modelled(a_dtype: str, b_dtype: str, out: str) -> tuple[float, MatmulPlan]:
    """The product's modelled thread-seconds of a 4096³ CPU plan, and the plan: int8 @ int8's
    with the dtypes swapped in, as cpu_work reads them (the planner refuses 64-bit integer
    inputs over K = 4096, whose sums could wrap)."""
    spec = ArraySpec((4096, 4096), (1024, 1024), "int8")
    plan = plan_matmul(
        spec, spec, workers=1, threads_per_worker=1, memory_limit_bytes=2**34,
        output=OutputSpec(dtype="float32" if out == "float32" else "int32"),
        tile_shape=(2048, 2048), panel_width=1024,
    )  # fmt: skip
    plan = replace(
        plan, a=replace(plan.a, dtype=a_dtype), b=replace(plan.b, dtype=b_dtype),
        compute_dtype=out, out=replace(plan.out, dtype=out),
    )  # fmt: skip
    return resource_seconds(cpu_work(plan), plan.costs)["product"], plan


def test_an_int64_product_is_modelled_far_slower_than_an_int8_one() -> None:
    """int64 inputs take numpy's integer matmul (no float holds them): about INTEGER_SLOWDOWN
    times float32 BLAS, and twice the bytes; int8 -> int32 runs as float32 BLAS."""
    int64, plan = modelled("int64", "int64", "int64")
    int8, _ = modelled("int8", "int8", "int32")
    float32, _ = modelled("float32", "float32", "float32")
    work = cpu_work(plan)
    assert work.integer_product and work.compute_itemsize == 8
    assert not cpu_work(modelled("int8", "int8", "int32")[1]).integer_product
    assert int8 == pytest.approx(float32)  # float32 panels, float32 BLAS
    assert int64 > INTEGER_SLOWDOWN * int8  # the flops alone are 2 x 60 times as slow
    flops = plan.flops / plan.costs.flops_per_second
    assert int64 - int8 == pytest.approx(flops * (2 * INTEGER_SLOWDOWN - 1), rel=0.05)


@pytest.mark.parametrize(
    ("a", "b", "out", "like"),
    [
        ("int8", "int8", "int32", "float32"),
        ("uint8", "uint8", "uint32", "float32"),
        ("int16", "int16", "int64", "float64"),  # float32 blocks would be 0 long: float64
        ("int32", "int32", "int64", "float64"),
        ("int64", "int64", "int64", "int64"),
    ],
)
def test_integer_products_are_modelled_as_the_float_they_run_in(
    a: str, b: str, out: str, like: str
) -> None:
    work = cpu_work(modelled(a, b, out)[1])
    assert work.compute_itemsize == np.dtype(like).itemsize
    assert work.integer_product == (like == "int64")

"""OUT's dtype (--dtype), the accumulator that follows it, and the refusal of integer products
that could wrap: tables, a property against exact Python integers, and runs against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import multiply
from pipeline.errors import IntegerOverflowError, PipelineError, UsageError
from pipeline.plan import output_dtypes
from pipeline.plan.dtypes import sum_range
from tests.helpers import assert_product, run_cli, write_array

INTEGERS = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


@pytest.mark.parametrize(
    ("a", "b", "k", "asked", "out", "acc"),
    [
        ("float32", "float32", 100, None, "float32", "float32"),  # default: result_type
        ("float64", "float64", 100, "float32", "float32", "float32"),  # narrower float asked
        ("float32", "float32", 100, "float16", "float16", "float32"),  # half sums in single
        ("float32", "float32", 100, "float64", "float64", "float64"),  # wider float asked
        ("float32", "float32", 100, "complex64", "complex64", "complex64"),  # real into complex
        ("int8", "int8", 1, "int16", "int16", "int16"),  # 1 x 128 x 128 = 16384 fits int16
        ("int8", "int8", 300, "int32", "int32", "int32"),  # the suggested fix
        ("int16", "int16", 1000, "int64", "int64", "int64"),  # int64 accumulates in int64
        ("uint8", "uint8", 10, "uint32", "uint32", "uint32"),  # unsigned stays non-negative
        ("bool", "bool", 1, None, "bool", "bool"),  # K=1: one AND, no sum
        ("bool", "bool", 127, "int8", "int8", "int8"),  # counts up to K
        ("int8", "int8", 0, None, "int8", "int8"),  # K=0: the sum is 0
        ("int32", "int32", 1000, "float64", "float64", "float64"),  # floats round, never wrap
        ("int8", "float32", 100, None, "float32", "float32"),  # a float input: no range check
        ("int8", "int8", 100, ">f8", "float64", "float64"),  # byte order: written native
    ],
)
def test_accepted(a: str, b: str, k: int, asked: str | None, out: str, acc: str) -> None:
    assert output_dtypes(a, b, k, asked) == (out, acc)


@pytest.mark.parametrize(
    ("a", "b", "k", "asked", "message"),
    [
        # int8 x int8 wrapped silently before: refused, with the smallest dtype that holds it
        ("int8", "int8", 300, None, r"integer overflow: int8 @ int8 over K=300 can sum to "
         r"-4,876,800\.\.4,915,200 .* the default output dtype int8 .* holds -128\.\.127; "
         r"pass --dtype int32"),
        ("int8", "int8", 2, "int16", r"can sum to -32,512\.\.32,768 .* --dtype int16 holds "
         r"-32,768\.\.32,767"),  # one past int16's top
        ("bool", "bool", 2, None, r"bool @ bool over K=2 can sum to 0\.\.2 .* holds 0\.\.1; "
         r"pass --dtype int8"),  # numpy's bool matmul would saturate (logical or)
        ("uint8", "int8", 2, None, r"default output dtype int16 .*pass --dtype int32"),
        ("int8", "int8", 5, "uint32", r"can sum to -81,280\.\.81,920 .* holds "
         r"0\.\.4,294,967,295"),  # negative sums can't be unsigned
        ("uint8", "uint8", 10, "int8", r"--dtype int8 holds -128\.\.127; pass --dtype int32"),
        ("int64", "int64", 2, "int64", r"no integer dtype holds it: pass --dtype float64"),
        # sums exactly at a suggestion's edges: 0..65,025 fits uint16, 0..255 fits uint8
        ("uint8", "uint8", 1, "uint8", r"pass --dtype uint16 \(the smallest integer dtype"),
        ("bool", "bool", 255, "int8", r"0\.\.255 .* pass --dtype uint8 \(the smallest"),
        ("int32", "int32", 2, "float16", r"--dtype float16 holds ±6\.55e\+04"),  # to inf
        ("float32", "float32", 10, "int32", r"would truncate .* choose a float dtype"),
        ("complex64", "float32", 10, "float64", r"would drop the imaginary part"),
        ("float32", "float32", 10, "float128", r"'float128' is not an output dtype"),
        ("float32", "float32", 10, "bool", r"'bool' is not an output dtype; choose one of int8"),
        ("float32", "float32", 10, "banana", r"'banana' is not an output dtype"),
    ],
)  # fmt: skip
def test_refused(a: str, b: str, k: int, asked: str | None, message: str) -> None:
    with pytest.raises(PipelineError, match=message) as caught:
        output_dtypes(a, b, k, asked)
    overflow = not any(w in message for w in ("truncate", "imaginary", "not an output dtype"))
    kind = (IntegerOverflowError, OverflowError) if overflow else (UsageError,)
    assert all(isinstance(caught.value, c) for c in kind), type(caught.value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("a", "b", "k", "want"),
    [
        ("int8", "uint8", 3, (3 * -128 * 255, 3 * 127 * 255)),  # mixed signs: lo from a_lo * b_hi
        ("uint8", "int8", 2, (2 * 255 * -128, 2 * 255 * 127)),  # lo from a_hi * b_lo
        ("int8", "int8", 2, (2 * -128 * 127, 2 * -128 * -128)),  # hi from a_lo * b_lo
        ("bool", "int16", 4, (4 * -32768, 4 * 32767)),
    ],
)
def test_sum_range_takes_every_corner(a: str, b: str, k: int, want: tuple[int, int]) -> None:
    assert sum_range(a, b, k) == want


@settings(max_examples=300, deadline=None)
@given(
    a=st.sampled_from(INTEGERS),
    b=st.sampled_from(INTEGERS),
    out=st.sampled_from(INTEGERS[1:]),
    k=st.integers(0, 40),
)
def test_accepted_integer_products_never_wrap(a: str, b: str, out: str, k: int) -> None:
    """Accepted: K products of the dtypes' extreme values, summed by numpy in the accumulator,
    equal the exact sum. Refused: one such sum really leaves OUT's range."""
    lo, hi = sum_range(a, b, k)
    info = np.iinfo(out)
    try:
        _, acc = output_dtypes(a, b, k, out)
    except IntegerOverflowError:
        assert lo < info.min or hi > info.max
        return
    for x in _extremes(a):
        for y in _extremes(b):
            row = np.full((1, k), x, dtype=a).astype(acc)
            col = np.full((k, 1), y, dtype=b).astype(acc)
            assert int((row @ col)[0, 0]) == k * int(x) * int(y)


def _extremes(dtype: str) -> list[int]:
    if dtype == "bool":
        return [0, 1]
    info = np.iinfo(dtype)
    return [int(info.min), int(info.max)]


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype", "dtype"),
    [
        ("int8", "int8", "int32"),  # the dtypes' extremes: int16 would have wrapped
        ("uint8", "uint8", "uint32"),  # unsigned
        ("bool", "bool", "int16"),  # adjacency matrices: path counts, not logical or
        ("float64", "float64", "float32"),  # accumulate in float32
        ("int16", "float32", "float64"),  # mixed into a wider float
    ],
)
def test_products_against_numpy(
    tmp_path: Path, client: Client, a_dtype: str, b_dtype: str, dtype: str
) -> None:
    rng = np.random.default_rng(7)
    a, b = _extreme_matrix(rng, (37, 300), a_dtype), _extreme_matrix(rng, (300, 29), b_dtype)
    out = str(tmp_path / "c.zarr")
    result = multiply(
        write_array(tmp_path / "a.zarr", a, (10, 64)),
        write_array(tmp_path / "b.zarr", b, (64, 8)),
        out,
        client=client,
        dtype=dtype,
    )
    c = zarr.open_array(out)
    assert result.dtype == dtype and result.plan.compute_dtype == dtype
    assert_product(c[:], a, b, dtype)


def _extreme_matrix(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> object:
    """Mostly the dtype's extreme values, so a too-narrow accumulator would wrap."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.9
    info = np.iinfo(dt)
    return rng.choice(np.array([info.min, info.max, 0, 1], dtype=dt), size=shape)


def test_cli_refuses_a_wrapping_product_before_any_work(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a_url = write_array(tmp_path / "a.zarr", rng.integers(-128, 128, (6, 300), np.int8), (6, 50))
    b_url = write_array(tmp_path / "b.zarr", rng.integers(-128, 128, (300, 4), np.int8), (50, 4))
    out = tmp_path / "c.zarr"
    done = run_cli("multiply", a_url, b_url, str(out), "--no-progress")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "integer overflow" in errors[0] and "--dtype int32" in errors[0]
    assert not out.exists()

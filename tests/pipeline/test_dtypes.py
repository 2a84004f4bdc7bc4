"""OUT's dtype (--dtype), the accumulator that follows it, and the refusal of integer products
that could wrap: tables, a property against exact Python integers, and runs against numpy."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import multiply
from pipeline.errors import InputError, IntegerOverflowError, PipelineError, UsageError
from pipeline.plan.dtypes import check_accumulation, output_dtypes, result_dtype, sum_range
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
        ("complex64", "float32", 100, None, "complex64", "complex64"),  # a complex input
        ("complex64", "complex64", 100, "complex128", "complex128", "complex128"),  # wider
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


RANGE = "(K x the extreme products of the dtypes' ranges; no data is read)"
FLOAT64_ONLY = (
    "no integer dtype holds it: pass --dtype float64 (exact while sums stay below 2**53), or "
    "store the inputs in narrower integer dtypes when their values allow"
)
WIDER = "; accumulate into a wider C (e.g. int64 or float64)"
INT8_AT_300 = (
    f"integer overflow: int8 @ int8 over K=300 can sum to -4,876,800..4,915,200 {RANGE}, but "
    "the default output dtype int8 (numpy.result_type) holds -128..127; pass --dtype int32 (the "
    "smallest integer dtype that holds it) or float64"
)


@pytest.mark.parametrize(
    ("a", "b", "k", "asked", "message"),
    [
        ("int8", "int8", 300, None, INT8_AT_300),  # the default, and the smallest fix
        ("int64", "int64", 2, "int64", "integer overflow: int64 @ int64 over K=2 can sum to "
         f"-1.7e+38..1.7e+38 {RANGE}, but --dtype int64 holds -9.22e+18..9.22e+18; "
         f"{FLOAT64_ONLY}"),  # past ten digits: three significant ones
        ("int32", "int32", 2, "float16", "integer overflow: int32 @ int32 over K=2 can sum to "
         f"-9.22e+18..9.22e+18 {RANGE}, but --dtype float16 holds ±6.55e+04; {FLOAT64_ONLY}"),
        # 10**10 is the first sum written in three digits; one less reads whole
        ("bool", "bool", 10**10, "int32", "integer overflow: bool @ bool over K=10,000,000,000 "
         f"can sum to 0..1e+10 {RANGE}, but --dtype int32 holds -2,147,483,648..2,147,483,647; "
         "pass --dtype int64 (the smallest integer dtype that holds it) or float64"),
        ("bool", "bool", 10**10 - 1, "int32", "integer overflow: bool @ bool over "
         f"K=9,999,999,999 can sum to 0..9,999,999,999 {RANGE}, but --dtype int32 holds "
         "-2,147,483,648..2,147,483,647; pass --dtype int64 (the smallest integer dtype that "
         "holds it) or float64"),
        ("float32", "float32", 10, "int32", "--dtype int32 would truncate a float32 @ float32 "
         "product to integers; choose a float dtype (float32 or float64)"),
        ("complex64", "float32", 10, "float64", "--dtype float64 would drop the imaginary part "
         "of a complex64 @ float32 product; choose complex64 or complex128"),
        ("float32", "complex128", 10, "int8", "--dtype int8 would drop the imaginary part of a "
         "float32 @ complex128 product; choose complex64 or complex128"),  # the first refusal
        ("float32", "float32", 10, "banana", "--dtype 'banana' is not an output dtype; choose one "
         "of int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, "
         "float64, complex64, complex128"),
        ("<U3", "float32", 10, None, "A has dtype <U3, which is not numeric; convert it to a "
         "float, integer or complex dtype"),
        ("float32", "M8[s]", 10, "float32", "B has dtype datetime64[s], which is not numeric; "
         "convert it to a float, integer or complex dtype"),
    ],
)  # fmt: skip
def test_refusal_messages_word_for_word(
    a: str, b: str, k: int, asked: str | None, message: str
) -> None:
    """The one line a user reads after ``error:``: what was asked, the numbers, the fix."""
    with pytest.raises(PipelineError) as caught:
        output_dtypes(a, b, k, asked)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ("float16", "float16", ("float16", "float32")),  # half sums in single
        ("int8", "uint8", ("int16", "int16")),
        ("bool", "float64", ("float64", "float64")),
        ("complex64", "float64", ("complex128", "complex128")),
    ],
)
def test_result_dtype_follows_numpy(a: str, b: str, out: tuple[str, str]) -> None:
    assert result_dtype(a, b) == out


@pytest.mark.parametrize("dtype", ["object", "<U3", "M8[s]", "m8[s]", "V4"])
def test_result_dtype_refuses_non_numeric(dtype: str) -> None:
    with pytest.raises(InputError, match=re.escape(f"B has dtype {np.dtype(dtype)}, which")):
        result_dtype("float32", dtype)


@pytest.mark.parametrize(
    ("a", "b", "k", "c", "alpha", "beta"),
    [
        ("float32", "float32", 10, "float64", 0.5, 0.25),  # a float C takes any factors
        ("float32", "float32", 10, "complex64", 1.0, 1.0),  # real into complex
        ("int8", "int8", 10**9, "float32", 2.5, 1.0),  # floats round, they never wrap
        ("int8", "int8", 10, "int32", 3, -2),  # integral factors into an integer C
        ("int8", "int8", 10, "int32", 3.0, -2.0),  # whole floats are whole numbers
        ("bool", "bool", 127, "int8", 1, 1),  # 0..127: exactly int8's top
        ("bool", "bool", 128, "int8", -1, 1),  # -128..0: exactly int8's bottom
        ("bool", "bool", 255, "uint8", 1, 0),  # 0..255: exactly uint8's top
        ("int8", "int8", 10**6, "int32", 0, 1),  # alpha 0: the product adds nothing
    ],
)
def test_accumulation_accepted(a: str, b: str, k: int, c: str, alpha: float, beta: float) -> None:
    check_accumulation(a, b, k, c, alpha, beta)


@pytest.mark.parametrize(
    ("a", "b", "k", "c", "alpha", "beta", "error", "message"),
    [
        # C's dtype is kept (--dtype is refused with --accumulate): the fix is another C
        ("float32", "float32", 10, "int32", 1, 0, UsageError, "C (int32) would truncate a "
         "float32 @ float32 product to integers; accumulate into a float C"),
        ("complex64", "float32", 10, "float64", 1, 0, UsageError, "C (float64) would drop the "
         "imaginary part of a complex64 @ float32 product; accumulate into a complex C"),
        ("int8", "int8", 10, "int32", 0.5, 1, UsageError, "--alpha 0.5 is not a whole number, "
         "and C is int32: an integer C takes a whole --alpha only (or accumulate into a float64 "
         "C)"),
        ("int8", "int8", 10, "uint16", 2, 1.5, UsageError, "--beta 1.5 is not a whole number, "
         "and C is uint16: an integer C takes a whole --beta only (or accumulate into a float64 "
         "C)"),
        ("int8", "int8", 10, "bool", 1, 0.5, UsageError, "--beta 0.5 is not a whole number, "
         "and C is bool: an integer C takes a whole --beta only (or accumulate into a float64 "
         "C)"),  # bool is an integer C
        ("int8", "int8", 10**6, "int32", 3, 1, IntegerOverflowError, "integer overflow: "
         "3·(int8 @ int8 over K=1,000,000) can reach -4.88e+10..4.92e+10 (no data read), but C "
         f"(int32) holds -2,147,483,648..2,147,483,647{WIDER}"),
        ("int8", "int8", 10**6, "int32", -3, 1, IntegerOverflowError, "integer overflow: "
         "-3·(int8 @ int8 over K=1,000,000) can reach -4.92e+10..4.88e+10 (no data read), but C "
         f"(int32) holds -2,147,483,648..2,147,483,647{WIDER}"),  # a negative alpha swaps ends
        ("bool", "bool", 128, "int8", 1, 1, IntegerOverflowError, "integer overflow: "
         "1·(bool @ bool over K=128) can reach 0..128 (no data read), but C (int8) holds "
         f"-128..127{WIDER}"),  # one past the top
        ("bool", "bool", 129, "int8", -1, 1, IntegerOverflowError, "integer overflow: "
         "-1·(bool @ bool over K=129) can reach -129..0 (no data read), but C (int8) holds "
         f"-128..127{WIDER}"),  # one past the bottom
        ("bool", "bool", 2, "uint8", -1, 1, IntegerOverflowError, "integer overflow: "
         f"-1·(bool @ bool over K=2) can reach -2..0 (no data read), but C (uint8) holds "
         f"0..255{WIDER}"),  # negative into unsigned
        ("uint8", "bool", 1, "bool", 1, 1, IntegerOverflowError, "integer overflow: "
         f"1·(uint8 @ bool over K=1) can reach 0..255 (no data read), but C (bool) holds "
         f"0..1{WIDER}"),
    ],
)  # fmt: skip
def test_accumulation_refused(
    a: str,
    b: str,
    k: int,
    c: str,
    alpha: float,
    beta: float,
    error: type[PipelineError],
    message: str,
) -> None:
    """``--accumulate`` into C: the refusal before any work, word for word."""
    with pytest.raises(error) as caught:
        check_accumulation(a, b, k, c, alpha, beta)
    assert str(caught.value) == message
    assert caught.value.exit_code == 2


def test_cli_refuses_a_wrapping_product_before_any_work(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a_url = write_array(tmp_path / "a.zarr", rng.integers(-128, 128, (6, 300), np.int8), (6, 50))
    b_url = write_array(tmp_path / "b.zarr", rng.integers(-128, 128, (300, 4), np.int8), (50, 4))
    out = tmp_path / "c.zarr"
    done = run_cli("multiply", a_url, b_url, str(out), "--no-progress")
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors == [f"error: {INT8_AT_300}"]
    assert not out.exists()

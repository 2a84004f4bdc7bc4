"""Inputs holding NaN or ±inf: C must be non-finite exactly on the rows of A and the columns of
B that hold one (a term with a non-finite factor is non-finite, inf·0 = NaN), and the finite
part is verified as usual, against float64 numpy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, Future

from pipeline import multiply, verify_product
from pipeline.errors import JobError
from tests.helpers import product_error_bound, random_matrix, run_cli, write_array

M, K, N, CHUNK = 120, 90, 100, 32


def poison(x: Any, cells: list[tuple[int, int]], values: list[complex]) -> Any:
    x = x.copy()
    for (i, j), v in zip(cells, values, strict=True):
        x[i, j] = v
    return x


def inputs(case: str, dtype: str) -> tuple[Any, Any]:
    rng = np.random.default_rng(len(case))
    a, b = random_matrix(rng, (M, K), dtype), random_matrix(rng, (K, N), dtype)
    nan, inf = np.nan, np.inf
    if case in ("a", "both"):  # NaN, +inf and -inf in 3 rows of A; row 7 holds two
        a = poison(a, [(7, 0), (7, 50), (64, 89), (119, 3)], [nan, inf, -inf, nan])
    if case in ("b", "both"):  # and in 2 columns of B; column 31 holds three
        b = poison(b, [(0, 99), (40, 31), (45, 31), (89, 31)], [inf, nan, nan, -inf])
    if case == "inf-times-zero":
        # Row 5 of A is zero but for an inf at k=3; row 3 of B is zero on columns 0-9: C[5, :10]
        # is inf·0 + 0 = NaN, the rest of row 5 ±inf. Column 8 of B: -inf where A's column 2
        # is zero, so C[:, 8] = 0·-inf = NaN on every row.
        a[5], a[:, 2] = 0, 0
        a, b = poison(a, [(5, 3)], [inf]), b.copy()
        b[3, :10] = 0
        b = poison(b, [(2, 8)], [-inf])
    return a, b


def implied(a: Any, b: Any) -> Any:
    """Where C must be non-finite: rows of A and columns of B holding a non-finite value."""
    return ~np.isfinite(a).all(axis=1)[:, None] | ~np.isfinite(b).all(axis=0)[None, :]


def assert_product(c: Any, a: Any, b: Any) -> None:
    """Non-finite exactly where implied (float64 numpy agrees), the rest as numpy's float64."""
    wide = "complex128" if np.iscomplexobj(c) else "float64"
    pattern = implied(a, b)
    with np.errstate(invalid="ignore"):  # numpy's complex matmul warns on inf·0
        reference = a.astype(wide) @ b.astype(wide)
    np.testing.assert_array_equal(~np.isfinite(reference), pattern)
    np.testing.assert_array_equal(~np.isfinite(c), pattern)
    a0, b0 = (np.where(np.isfinite(x), x, 0).astype(wide) for x in (a, b))
    if c.dtype.kind in "iu":
        np.testing.assert_array_equal(c, (a0 @ b0).astype(c.dtype))
        return
    error = np.abs(c.astype(wide) - a0 @ b0)[~pattern]
    assert (error <= product_error_bound(a0, b0, c.dtype)[~pattern]).all()


def product(tmp_path: Path, client: Client, a: Any, b: Any) -> tuple[str, str, str]:
    urls = (
        write_array(tmp_path / "a.zarr", a, (CHUNK, CHUNK)),
        write_array(tmp_path / "b.zarr", b, (CHUNK, CHUNK)),
        str(tmp_path / "c.zarr"),
    )
    integers = a.dtype.kind in "iu" and b.dtype.kind in "iu"
    multiply(*urls, client=client, dtype="int64" if integers else None)
    return urls


class Recording:
    """A Client that remembers the keys of the tasks submitted through it."""

    def __init__(self, client: Client) -> None:
        self.client, self.keys = client, list[str]()

    def submit(self, *args: Any, key: str, **kwargs: Any) -> Future[Any]:
        self.keys.append(key)
        return self.client.submit(*args, key=key, **kwargs)

    def gather(self, *args: Any, **kwargs: Any) -> Any:
        return self.client.gather(*args, **kwargs)


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        ("a", "float32"),  # NaN and ±inf in rows of A
        ("a", "float64"),
        ("b", "float32"),  # in columns of B: B·r is recomputed with r masked on them
        ("both", "float64"),  # both: whole rows and whole columns of C
        ("both", "complex64"),  # complex: NaN or inf in either part
        ("inf-times-zero", "float32"),  # inf·0 = NaN where the other factor is zero
        ("none", "float32"),  # all finite: no second pass over B
        ("none", "int16"),  # integers are always finite (into int64: int16 could overflow)
    ],
)
def test_inputs_with_nonfinite_values_pass(
    tmp_path: Path, client: Client, case: str, dtype: str
) -> None:
    a, b = inputs(case, dtype)
    urls = product(tmp_path, client, a, b)
    c = zarr.open_array(urls[2])[:]
    assert_product(c, a, b)
    if case == "inf-times-zero":
        assert np.isnan(c[5, :10]).all() and np.isinf(c[5, 10:]).all()
        assert np.isnan(c[:, 8]).all()
    recording = Recording(client)
    result = verify_product(recording, *urls)  # type: ignore[arg-type]
    assert result.passed and result.pattern_matches, result
    assert result.worst_ratio < 0.5 and result.worst_row >= 0, result
    bad_a, bad_b = ~np.isfinite(a), ~np.isfinite(b)
    assert (result.a_nonfinite, result.a_nonfinite_rows) == (bad_a.sum(), bad_a.any(1).sum())
    assert (result.b_nonfinite, result.b_nonfinite_columns) == (bad_b.sum(), bad_b.any(0).sum())
    masked = [key for key in recording.keys if key.startswith("verify-b-masked-")]
    assert len(masked) == (-(-K // CHUNK) if bad_b.any() else 0)


def test_mixed_integer_and_float_inputs(tmp_path: Path, client: Client) -> None:
    a = np.random.default_rng(1).integers(-5, 5, (M, K)).astype("int32")
    b = poison(random_matrix(np.random.default_rng(2), (K, N), "float64"), [(4, 4)], [np.nan])
    urls = product(tmp_path, client, a, b)
    assert_product(zarr.open_array(urls[2])[:], a, b)
    result = verify_product(client, *urls)
    assert result.passed and (result.a_nonfinite, result.b_nonfinite_columns) == (0, 1), result


@pytest.fixture
def poisoned(tmp_path: Path, client: Client) -> tuple[tuple[str, str, str], Any]:
    """A correct product of inputs with non-finite rows of A and columns of B, and its C."""
    a, b = inputs("both", "float64")
    urls = product(tmp_path, client, a, b)
    return urls, zarr.open_array(urls[2], mode="r+")


def test_a_wrong_finite_element_next_to_nonfinite_rows_is_caught(
    client: Client, poisoned: tuple[tuple[str, str, str], Any]
) -> None:
    urls, c = poisoned
    i, j = 8, 40  # row 7 of A and column 31 of B are not finite; row 8 and column 40 are
    c[i, j] = c[i, j] * (1 + 1e-3)
    result = verify_product(client, *urls, rounds=1)
    assert not result.passed and result.pattern_matches, result
    assert result.worst_row == i and (0, 32) in result.failing_row_blocks
    assert (result.a_nonfinite_rows, result.b_nonfinite_columns) == (3, 2)


def test_an_extra_nan_where_none_is_implied_fails(
    client: Client, poisoned: tuple[tuple[str, str, str], Any]
) -> None:
    urls, c = poisoned
    c[50, 60] = np.nan
    result = verify_product(client, *urls)
    assert not result.passed and not result.pattern_matches, result
    assert (result.c_unexpected, result.c_overflow, result.c_missing) == (1, 0, 0)
    assert result.first_mismatch == (50, 60) and result.failing_row_blocks == ((32, 64),)


@pytest.mark.parametrize(
    ("cell", "why"),
    [
        ((64, 10), "a row of A holds -inf"),
        ((20, 99), "a column of B holds inf"),
    ],
)
def test_a_finite_value_where_nan_is_implied_fails(
    client: Client, poisoned: tuple[tuple[str, str, str], Any], cell: tuple[int, int], why: str
) -> None:
    urls, c = poisoned
    c[cell] = 1.0
    result = verify_product(client, *urls)
    assert not result.passed, why
    assert (result.c_unexpected, result.c_missing, result.first_mismatch) == (0, 1, cell)


def test_an_overflow_is_reported_as_one(tmp_path: Path, client: Client) -> None:
    a, b = inputs("none", "float32")
    a[30], b[:, 70] = 1e20, 1e20  # C[30, 70] = 90e40 overflows float32; the rest of both fits
    urls = product(tmp_path, client, a, b)
    c = zarr.open_array(urls[2])[:]
    assert np.isinf(c[30, 70]) and np.isfinite(c).sum() == c.size - 1
    result = verify_product(client, *urls)
    assert not result.passed, result
    assert (result.c_unexpected, result.c_overflow, result.first_mismatch) == (1, 1, (30, 70))


def test_cli_reports_the_counts_and_stays_quiet(
    tmp_path: Path, poisoned: tuple[tuple[str, str, str], Any]
) -> None:
    urls, c = poisoned
    options = ("--dashboard-address", "127.0.0.1:0", "--no-progress")
    done = run_cli("verify", *urls, *options)
    assert done.returncode == 0, done.stderr
    assert (
        "; A has 4 non-finite value(s) in 3 row(s), B has 4 non-finite value(s) in 2 "
        "column(s); C's non-finite pattern matches; the finite part verified"
    ) in done.stdout
    assert "Warning" not in done.stderr and "error" not in done.stderr, done.stderr
    c[50, 60] = np.inf
    done = run_cli("verify", *urls, *options)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: C != A @ B in row block(s) 32:64: C has 1 non-finite value(s) where A and B "
        "imply finite ones, none of them an overflow (|A_i|·|B_j| is inside C's range): wrong "
        "elements; first at row 50, column 60; recompute C with `python -m pipeline multiply A "
        "B C --overwrite`"
    ], done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_multiply_verify_passes_on_nonfinite_inputs(tmp_path: Path) -> None:
    a, b = inputs("both", "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (CHUNK, CHUNK))
    b_url = write_array(tmp_path / "b.zarr", b, (CHUNK, CHUNK))
    out = str(tmp_path / "c.zarr")
    done = run_cli("multiply", a_url, b_url, out, "--verify", "--dashboard-address", "127.0.0.1:0")
    assert done.returncode == 0, done.stderr
    assert "verify passed" in done.stdout
    assert "Warning" not in done.stderr and "error" not in done.stderr, done.stderr
    assert_product(zarr.open_array(out)[:], a, b)


def test_a_failed_pass_over_b_is_a_job_error(tmp_path: Path, client: Client) -> None:
    """The count of B's non-finite columns is awaited before the row checks: a task failing
    there is reported like any failed verification task."""
    a, b = inputs("none", "float32")
    urls = product(tmp_path, client, a, b)
    (tmp_path / "b.zarr" / "c" / "1" / "0").write_bytes(b"not a chunk")
    with pytest.raises(JobError, match=r"verification task failed: .*c/1/0"):
        verify_product(client, *urls)


RECOMPUTE = "recompute C with `python -m pipeline multiply A B C --overwrite`"


@pytest.mark.parametrize(
    ("fields", "line", "error"),
    [
        (  # all finite and correct: the plain line
            {"passed": True, "worst_ratio": 0.173, "worst_row": 131},
            "verify ok: 2 round(s), worst residual/tolerance 0.173 at row 131",
            None,
        ),
        (  # all finite, one row off
            {"passed": False, "worst_ratio": 3.2, "worst_row": 17, "blocks": ((0, 128),)},
            "verify FAILED: 2 round(s), worst residual/tolerance 3.2 at row 17",
            "C != A @ B in row block(s) 0:128: worst residual/tolerance 3.2 at row 17; "
            + RECOMPUTE,
        ),
        (  # an overflow next to non-finite rows of A
            {"passed": False, "worst_ratio": 0.1, "worst_row": 3, "blocks": ((0, 64),),
             "a_nonfinite": 5, "a_nonfinite_rows": 2, "c_unexpected": 1, "c_overflow": 1,
             "first_mismatch": (30, 70)},
            "verify FAILED: 2 round(s), worst residual/tolerance 0.1 at row 3; A has 5 non-finite "
            "value(s) in 2 row(s), B has 0; C's non-finite pattern differs; the finite part "
            "verified",
            "C != A @ B in row block(s) 0:64: C has 1 non-finite value(s) where A and B imply "
            "finite ones: 1 where |A_i|·|B_j| reaches the range of C's dtype, maybe overflows "
            f"(store A and B as float64 to avoid them); first at row 30, column 70; {RECOMPUTE}",
        ),
        (  # every row of A non-finite, and C finite in one of them
            {"passed": False, "worst_ratio": 0.0, "worst_row": -1, "blocks": ((0, 4),),
             "a_nonfinite": 4, "a_nonfinite_rows": 4, "c_missing": 1, "first_mismatch": (2, 0)},
            "verify FAILED: 2 round(s), no finite row to check; A has 4 non-finite value(s) in 4 "
            "row(s), B has 0; C's non-finite pattern differs; the finite part verified",
            "C != A @ B in row block(s) 0:4: C has 1 finite value(s) where a non-finite row of A "
            f"or column of B makes the product non-finite; first at row 2, column 0; {RECOMPUTE}",
        ),
    ],
)  # fmt: skip
def test_verify_lines(fields: dict[str, Any], line: str, error: str | None) -> None:
    from pipeline.summary import format_verify, format_verify_error
    from pipeline.verify.check import VerifyResult

    blocks = fields.pop("blocks", ())
    result = VerifyResult(rounds=2, failing_row_blocks=blocks, **fields)
    assert format_verify(result) == line
    assert error is None or format_verify_error(result) == error


def test_resume_keeps_tiles_whose_product_is_nan(tmp_path: Path, client: Client) -> None:
    """Completeness comes from the journal, never from NaN (OUT's fill): a resumed job skips
    finished tiles holding real NaN and redoes only a tile whose journal entry is gone."""
    rng = np.random.default_rng(9)
    a, b = random_matrix(rng, (1100, 50), "float32"), random_matrix(rng, (50, 1000), "float32")
    a, b = poison(a, [(3, 7), (900, 0)], [np.nan, np.inf]), poison(b, [(10, 600)], [np.nan])
    urls = (
        write_array(tmp_path / "a.zarr", a, (256, 25)),
        write_array(tmp_path / "b.zarr", b, (25, 250)),
        str(tmp_path / "c.zarr"),
    )
    multiply(*urls, client=client)
    out = Path(urls[2])
    before = zarr.open_array(urls[2], mode="r")[:]
    assert np.isnan(before).any()
    journal = sorted((out / "journal").iterdir())
    assert len(journal) >= 2
    journal[0].unlink()
    resumed = multiply(*urls, client=client, resume=True)
    assert (resumed.tiles_computed, resumed.tiles_skipped) == (1, len(journal) - 1)
    after = zarr.open_array(urls[2], mode="r")[:]
    assert after.tobytes() == before.tobytes()
    assert_product(after, a, b)

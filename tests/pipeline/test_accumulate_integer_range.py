"""``--accumulate`` into an integer C: α·A·B + β·C_old is checked against C's range at run time
(C's values are unknown before a task reads them; pipeline/accumulate/tasks.py), at both ends
of the dtype: exactly reaching C's largest or smallest value is written, one beyond is refused
and C is put back as it was, bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply
from pipeline.accumulate.state import SIDECAR
from pipeline.errors import InputError, IntegerOverflowError
from tests.helpers import write_array

UP = [[127, 127], [1, 0], [7, 1], [64, -1]]
"""int8 rows whose sums with B all True are >= 0 (254, 1, 8, 63)."""
DOWN = [[-128, -128], [-1, 0], [-7, -1], [-64, 1]]
"""... and < 0 (-256, -1, -8, -63)."""
BOOLS = [[True, True], [True, False], [False, True], [True, True]]

CASES = [
    # (C's dtype, A (4 x 2; B is 2 x 3 of True), α, β, the end of C's range reached)
    ("int16", UP, 1, 1, 32767),  # C_old near the top, the product pushes it up
    ("int16", DOWN, 1, 1, -32768),  # C_old near the bottom, pushed down
    ("int16", DOWN, -3, -1, 32767),  # α and β negative: -3·P - C_old
    ("int16", DOWN, 2, -1, -32768),  # 2·P - C_old
    ("uint8", BOOLS, 1, 1, 255),
    ("uint8", BOOLS, 1, -1, 0),  # P - C_old: below 0 when C_old > P
    ("uint16", BOOLS, 1, -1, 0),
    ("uint16", BOOLS, 2, 1, 65535),
]


def setup(
    tmp_path: Path, c_dtype: str, rows: list[list[Any]], alpha: int, beta: int, end: int
) -> tuple[str, str, str, Any]:
    """A, B and C, whose C_old makes α·A·B + β·C_old exactly ``end`` everywhere."""
    a = np.array(rows, "bool" if isinstance(rows[0][0], bool) else "int8")
    b = np.ones((2, 3), bool)
    product = a.astype(np.int64) @ b.astype(np.int64)
    c0 = (end - alpha * product) // beta
    assert (beta * c0 + alpha * product == end).all()
    a_url = write_array(tmp_path / "a.zarr", a, (2, 1))
    b_url = write_array(tmp_path / "b.zarr", b, (1, 3))
    c_url = str(tmp_path / "c.zarr")
    zarr.create_array(c_url, data=c0.astype(c_dtype), chunks=(2, 2))
    return a_url, b_url, c_url, c0.astype(c_dtype)


@pytest.mark.parametrize(("c_dtype", "rows", "alpha", "beta", "end"), CASES)
def test_reaching_the_end_of_cs_range_is_written(
    tmp_path: Path, client: Client, c_dtype: str, rows: Any, alpha: int, beta: int, end: int
) -> None:
    a_url, b_url, c_url, c0 = setup(tmp_path, c_dtype, rows, alpha, beta, end)
    assert (c0 != end).any(), "C's old values differ from the result somewhere"
    multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=alpha, beta=beta)
    got = zarr.open_array(c_url)[:]
    np.testing.assert_array_equal(got, np.full((4, 3), end, c_dtype), strict=True)


def stored(folder: Path) -> dict[str, bytes]:
    """C's stored chunks, by key."""
    chunks = folder / "c"
    return {str(p.relative_to(folder)): p.read_bytes() for p in chunks.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("c_dtype", "rows", "alpha", "beta", "end"), CASES)
@pytest.mark.parametrize("cell", [(0, 0), (3, 2)])  # the first tile, the last
def test_one_beyond_is_refused_and_cs_values_are_kept(
    tmp_path: Path,
    client: Client,
    c_dtype: str,
    rows: Any,
    alpha: int,
    beta: int,
    end: int,
    cell: tuple[int, int],
) -> None:
    a_url, b_url, c_url, c0 = setup(tmp_path, c_dtype, rows, alpha, beta, end)
    beyond = c0.copy()
    beyond[cell] += 1 if (end > 0) == (beta > 0) else -1  # one past ``end`` in that cell
    zarr.open_array(c_url)[:] = beyond
    before = stored(Path(c_url))
    with pytest.raises(InputError, match=rf"integer overflow: α·A·B \+ β·C reaches .*beyond "
                       rf"C's {c_dtype} range; the job stops and C is put back"):  # fmt: skip
        multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=alpha, beta=beta)
    # C is put back: every stored object as it was, bit for bit, the folder gone.
    assert stored(Path(c_url)) == before
    assert not (Path(c_url) / SIDECAR).exists()


def test_c_reads_unchanged_after_a_refused_accumulation(tmp_path: Path, client: Client) -> None:
    a_url, b_url, c_url, c0 = setup(tmp_path, "int16", UP, 1, 1, 32767)
    c0[0, 0] += 1
    zarr.open_array(c_url)[:] = c0
    with pytest.raises(InputError, match="integer overflow"):
        multiply(a_url, b_url, c_url, client=client, accumulate=True)
    np.testing.assert_array_equal(zarr.open_array(c_url)[:], c0, strict=True)
    assert not (Path(c_url) / SIDECAR).exists()


@pytest.mark.parametrize("c_dtype", ["uint8", "uint16"])
def test_a_product_that_may_be_negative_is_refused_into_unsigned_c(
    tmp_path: Path, client: Client, c_dtype: str
) -> None:
    """α = -1 makes any bool product <= 0: refused before any work (the dtypes' worst case),
    whatever C holds; C untouched."""
    a_url, b_url, c_url, _ = setup(tmp_path, c_dtype, BOOLS, 1, 1, 200)
    before = stored(Path(c_url))
    with pytest.raises(IntegerOverflowError, match=rf"can reach -2\.\.0 .* C \({c_dtype}\)"):
        multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=-1)
    assert stored(Path(c_url)) == before and not (Path(c_url) / SIDECAR).exists()

"""Freivalds verification: passes correct products of many kinds, catches one wrong element."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply, verify_product
from tests.helpers import random_matrix, write_array


def matrices(kind: str, m: int, k: int, n: int, dtype: str, seed: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    if kind == "positive":  # same-sign data: rounding errors add up (the Higham bound is tight)
        a, b = rng.random((m, k)), rng.random((k, n))
    elif kind == "symmetric":  # zero-mean data: errors cancel (the bound is ~√k too loose)
        a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    elif kind == "integers":  # exactly representable: an exact product
        a, b = rng.integers(-8, 8, (m, k)), rng.integers(-8, 8, (k, n))
    elif kind == "mixed-rows":  # half the rows sparse and huge, half dense and tiny
        a = rng.uniform(-1, 1, (m, k)) * 1e-3
        a[::2] = 0.0
        a[::2, ::37] = rng.uniform(-1e3, 1e3, (len(a[::2]), len(range(0, k, 37))))
        b = rng.uniform(-1, 1, (k, n))
    else:  # "scaled": rows and columns over orders of magnitude (fewer for float16's range)
        span = 1 if dtype == "float16" else 3
        a = rng.uniform(-1, 1, (m, k)) * np.logspace(-span, span, m)[:, None]
        b = rng.uniform(-1, 1, (k, n)) * np.logspace(span, -span, n)[None, :]
    return a.astype(dtype), b.astype(dtype)


def product(tmp_path: Path, client: Client, a: Any, b: Any, chunks: int) -> tuple[str, str, str]:
    a_url = write_array(tmp_path / "a.zarr", a, (chunks, chunks))
    b_url = write_array(tmp_path / "b.zarr", b, (chunks, chunks))
    out = str(tmp_path / "c.zarr")
    multiply(a_url, b_url, out, client=client)
    return a_url, b_url, out


@pytest.mark.parametrize("kind", ["positive", "symmetric", "integers", "mixed-rows", "scaled"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_correct_products_pass(tmp_path: Path, client: Client, kind: str, dtype: str) -> None:
    a, b = matrices(kind, 200, 700, 150, dtype, seed=len(kind))
    urls = product(tmp_path, client, a, b, chunks=64)
    for seed in range(3):
        result = verify_product(client, *urls, rounds=2, seed=seed)
        assert result.passed, (kind, dtype, seed, result)
        assert result.worst_ratio < 0.5, f"too little margin: {result.worst_ratio:.3f}"


@pytest.mark.parametrize("kind", ["positive", "symmetric"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_element_off_by_a_thousandth_is_caught(
    tmp_path: Path, client: Client, kind: str, dtype: str
) -> None:
    """One element of a 600x400 product 0.1 % off, at typical magnitudes."""
    a, b = matrices(kind, 600, 300, 400, dtype, seed=7)
    urls = product(tmp_path, client, a, b, chunks=128)
    c = zarr.open_array(urls[2], mode="r+")
    good = c[:]
    magnitude = np.abs(good)
    rng = np.random.default_rng(3)
    typical = np.argwhere(magnitude >= np.median(magnitude))
    for i, j in typical[rng.choice(len(typical), size=5, replace=False)]:
        c[i, j] = good[i, j] * (1 + 1e-3)
        result = verify_product(client, *urls, rounds=1, seed=int(i))
        assert not result.passed, (i, j, result)
        assert any(r0 <= i < r1 for r0, r1 in result.failing_row_blocks)
        assert result.worst_row == i
        c[i, j] = good[i, j]
    assert verify_product(client, *urls).passed


def test_nan_and_unwritten_output_fail(tmp_path: Path, client: Client) -> None:
    a, b = matrices("symmetric", 50, 40, 30, "float32", seed=1)
    urls = product(tmp_path, client, a, b, chunks=16)
    c = zarr.open_array(urls[2], mode="r+")
    c[10, 10] = np.nan
    result = verify_product(client, *urls)
    assert not result.passed and (0, 16) in result.failing_row_blocks


def test_empty_products_pass(tmp_path: Path, client: Client) -> None:
    for m, k, n in ((0, 5, 4), (4, 0, 3)):
        a, b = np.ones((m, k), "float32"), np.ones((k, n), "float32")
        root = tmp_path / f"{m}-{k}"
        root.mkdir()
        assert verify_product(client, *product(root, client, a, b, chunks=2)).passed


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype"), [("float32", "complex64"), ("complex64", "float64")]
)
def test_real_times_complex_products_are_checked(
    tmp_path: Path, client: Client, a_dtype: str, b_dtype: str
) -> None:
    """One real operand, one complex: A·(B·r) is complex (with a real A, it once failed the
    row tasks, which streamed A·(B·r) in A's dtype); a wrong element is still caught."""
    rng = np.random.default_rng(9)
    a, b = (random_matrix(rng, shape, dtype) for shape, dtype in (((40, 30), a_dtype),
            ((30, 20), b_dtype)))  # fmt: skip
    urls = product(tmp_path, client, a, b, chunks=16)
    assert verify_product(client, *urls).passed
    c = zarr.open_array(urls[2], mode="r+")
    c[5, 7] = c[5, 7] + 1e-2j
    result = verify_product(client, *urls)
    assert not result.passed and result.worst_row == 5

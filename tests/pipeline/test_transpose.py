"""Transposed operands read in place: op(A) @ op(B) against float64 numpy, the plan on the
operands as used, the refusals, OUT's record of the operation and verify reading it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply, prepare, verify_product
from pipeline.errors import InputError, UsageError
from pipeline.facts.job_plan import fingerprint
from pipeline.plan.operands import check_contraction
from pipeline.plan.search import plan_matmul
from pipeline.plan.spec import ArraySpec
from pipeline.store.record import of_array
from tests.helpers import assert_product, random_matrix, run_cli, write_array

GiB = 2**30


def _op(x: Any, transposed: bool) -> Any:
    return x.T if transposed else x


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "a_chunks", "b_chunks", "ta", "tb", "dtype"),
    [
        ((97, 61), (97, 53), (20, 17), (23, 11), True, False, "float32"),  # Xᵀ Y, ragged
        ((61, 97), (53, 97), (17, 20), (11, 23), False, True, "float64"),  # X Yᵀ
        ((61, 97), (53, 61), (17, 20), (11, 23), True, True, "float32"),  # Aᵀ Bᵀ
        ((300, 260), (300, 270), (128, 128), (100, 90), True, False, "float32"),  # many blocks
        ((40, 30), (40, 20), (7, 9), (11, 6), True, False, "int16"),  # integers into int64
        ((40, 30), (20, 30), (7, 9), (11, 6), False, True, "complex64"),  # complex
        ((1, 300), (1, 7), (1, 13), (1, 7), True, False, "float32"),  # K = 1 after transposing
    ],
)
def test_transposed_products_match_numpy(
    tmp_path: Path,
    client: Client,
    a_shape: tuple[int, int],
    b_shape: tuple[int, int],
    a_chunks: tuple[int, int],
    b_chunks: tuple[int, int],
    ta: bool,
    tb: bool,
    dtype: str,
) -> None:
    rng = np.random.default_rng(sum(a_shape) + 7 * sum(b_shape))
    a, b = random_matrix(rng, a_shape, dtype), random_matrix(rng, b_shape, dtype)
    a_url = write_array(tmp_path / "a.zarr", a, a_chunks)
    b_url = write_array(tmp_path / "b.zarr", b, b_chunks)
    out = str(tmp_path / "c.zarr")
    wide = {"dtype": "int64"} if dtype.startswith("int") else {}  # the overflow guard holds
    result = multiply(a_url, b_url, out, client=client, transpose_a=ta, transpose_b=tb, **wide)
    c = zarr.open_array(out, mode="r")
    assert_product(c[:], _op(a, ta), _op(b, tb), wide.get("dtype"))
    # the plan is on op(A), op(B): OUT's chunks are op(A)'s row chunk by op(B)'s column chunk
    assert c.chunks == (_op_chunks(a_chunks, ta)[0], _op_chunks(b_chunks, tb)[1])
    assert result.plan.a.shape == _op(a, ta).shape and result.plan.transposed == (ta, tb)
    record = of_array(c)
    assert record is not None and (record.transpose_a, record.transpose_b) == (ta, tb)
    assert verify_product(client, a_url, b_url, out).passed  # reads the transposes from C


def _op_chunks(chunks: tuple[int, int], transposed: bool) -> tuple[int, int]:
    return (chunks[1], chunks[0]) if transposed else chunks


def test_sharded_out_and_v2_inputs(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(3)
    x, y = random_matrix(rng, (90, 70), "float32"), random_matrix(rng, (90, 50), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (30, 20), zarr_format=2)
    y_url = write_array(tmp_path / "y.zarr", y, (45, 25), zarr_format=2)
    out = str(tmp_path / "c.zarr")
    multiply(x_url, y_url, out, client=client, transpose_a=True, chunks=(10, 25), shards=(20, 50))
    c = zarr.open_array(out, mode="r")
    assert c.shards == (20, 50)
    assert_product(c[:], x.T, y)


def test_dimension_names_follow_the_operands_as_used(tmp_path: Path, client: Client) -> None:
    """Xᵀ Y: X's second dimension by Y's second."""
    rng = np.random.default_rng(4)
    for name, cols, dims in (("x", 6, ("sample", "feature")), ("y", 4, ("sample", "target"))):
        zarr.create_array(
            tmp_path / f"{name}.zarr", data=random_matrix(rng, (9, cols), "float32"),
            chunks=(3, 3), dimension_names=dims,
        )  # fmt: skip
    out = str(tmp_path / "c.zarr")
    multiply(str(tmp_path / "x.zarr"), str(tmp_path / "y.zarr"), out, client=client,
             transpose_a=True)  # fmt: skip
    assert zarr.open_array(out, mode="r").metadata.dimension_names == ("feature", "target")


@pytest.mark.parametrize(
    ("a", "b", "given", "match"),
    [
        # the plain product suggests the transposes that would contract, with the shapes
        (
            (32768, 4096),
            (32768, 4096),
            (False, False),
            r"A is 32768x4096 and B is 32768x4096; .*; --transpose-a would contract them "
            r"\(Aᵀ is 4096x32768\); --transpose-b would contract them \(Bᵀ is 4096x32768\)",
        ),
        ((6, 4), (6, 2), (False, False), r"--transpose-a would contract them \(Aᵀ is 4x6\)$"),
        # a transpose that still does not contract names op(A)'s shape
        (
            (6, 4),
            (5, 2),
            (True, False),
            r"Aᵀ is 4x6 and B is 5x2 \(A is 6x4 and B is 5x2 as stored\); Aᵀ's columns \(6\) "
            r"must equal B's rows \(5\); no transpose of A or B would contract them either",
        ),
        ((4, 6), (2, 6), (True, False), r"--transpose-b would contract them \(Bᵀ is 6x2\)"),
    ],
)
def test_contraction_refusals_suggest_the_transpose(
    a: tuple[int, int], b: tuple[int, int], given: tuple[bool, bool], match: str
) -> None:
    with pytest.raises(InputError, match=match):
        check_contraction(a, b, given)


def test_prepare_refuses_a_transpose_that_does_not_contract(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    a_url = write_array(tmp_path / "a.zarr", random_matrix(rng, (6, 4), "float32"), (3, 3))
    b_url = write_array(tmp_path / "b.zarr", random_matrix(rng, (5, 2), "float32"), (3, 3))
    with pytest.raises(InputError, match=r"^shapes do not contract: Aᵀ is 4x6"):
        prepare(a_url, b_url, str(tmp_path / "c.zarr"), transpose_a=True)
    assert not (tmp_path / "c.zarr").exists()


def test_fingerprint_includes_the_transposes() -> None:
    """A square X: X·X and Xᵀ·X have the same specs; --resume must still tell them apart."""
    x = ArraySpec((512, 512), (256, 256), "float32")
    plans = [
        plan_matmul(x, x, workers=1, threads_per_worker=1, memory_limit_bytes=GiB, transposed=t)
        for t in ((False, False), (True, False), (False, True))
    ]
    assert len({fingerprint(p) for p in plans}) == 3
    assert fingerprint(plans[0]) == fingerprint(
        plan_matmul(x, x, workers=1, threads_per_worker=1, memory_limit_bytes=GiB)
    )  # plans without transposes keep their old digests


def test_resume_refuses_another_operation(tmp_path: Path, client: Client) -> None:
    rng = np.random.default_rng(6)
    x_url = write_array(tmp_path / "x.zarr", random_matrix(rng, (40, 40), "float32"), (20, 20))
    out = str(tmp_path / "c.zarr")
    multiply(x_url, x_url, out, client=client)
    flag = r"(--transpose-a|transpose_a=True)"  # the flag, or the keyword that a caller gave
    with pytest.raises(UsageError, match=rf"was started without {flag} and this run has {flag}"):
        multiply(x_url, x_url, out, client=client, resume=True, transpose_a=True)


def test_verify_flags_against_c(tmp_path: Path, client: Client) -> None:
    """verify takes the transposes from C; a C without our attributes takes them as given;
    one that differs from C's record is refused; a wrong C fails."""
    rng = np.random.default_rng(8)
    x, y = random_matrix(rng, (50, 30), "float32"), random_matrix(rng, (50, 20), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (25, 10))
    y_url = write_array(tmp_path / "y.zarr", y, (25, 10))
    foreign = write_array(tmp_path / "f.zarr", (x.T @ y).astype("float32"), (10, 10))
    assert verify_product(client, x_url, y_url, foreign, transpose_a=True).passed
    with pytest.raises(InputError, match="shapes do not contract"):
        verify_product(client, x_url, y_url, foreign)  # no record, no flag: X @ Y
    out = str(tmp_path / "c.zarr")
    multiply(x_url, y_url, out, client=client, transpose_a=True)
    with pytest.raises(UsageError, match=r"records the product Aᵀ·B .* not Aᵀ·Bᵀ"):
        verify_product(client, x_url, y_url, out, transpose_b=True)
    c = zarr.open_array(out, mode="r+")
    c[3, 4] = c[3, 4] + 1.0
    assert not verify_product(client, x_url, y_url, out).passed


def test_cli_multiply_transpose_and_verify(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    x, y = random_matrix(rng, (60, 24), "float32"), random_matrix(rng, (60, 16), "float32")
    x_url = write_array(tmp_path / "x.zarr", x, (20, 8))
    y_url = write_array(tmp_path / "y.zarr", y, (20, 8))
    out = str(tmp_path / "c.zarr")
    common = ["--workers", "1", "--threads-per-worker", "1", "--dashboard-address", ":0"]
    plain = run_cli("multiply", x_url, y_url, out, "--dry-run")
    assert (
        plain.returncode == 2 and "--transpose-a would contract them (Aᵀ is 24x60)" in plain.stderr
    )
    dry = run_cli("multiply", x_url, y_url, out, "--transpose-a", "--dry-run")
    assert dry.returncode == 0 and "Aᵀ @ B: 24x60 @ 60x16 -> 24x16" in dry.stdout
    done = run_cli("multiply", x_url, y_url, out, "--transpose-a", "--verify", *common)
    assert done.returncode == 0, done.stderr
    assert_product(zarr.open_array(out, mode="r")[:], x.T, y)
    checked = run_cli("verify", x_url, y_url, out, *common)
    assert checked.returncode == 0 and "verify ok" in checked.stdout, checked.stderr


def test_gpu_decode_with_a_transposed_operand_is_decoded_on_the_host(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    x_url = write_array(tmp_path / "x.zarr", random_matrix(rng, (40, 20), "float32"), (20, 10))
    with pytest.raises(UsageError, match="A is read transposed; B is read transposed"):
        prepare(x_url, x_url, str(tmp_path / "c.zarr"), backend="emulated", gpu_decode=True,
                transpose_a=True, transpose_b=True)  # fmt: skip
    job = prepare(x_url, x_url, str(tmp_path / "c.zarr"), backend="emulated", gpu_decode=True,
                  transpose_a=True)  # fmt: skip
    assert job.store.transposed == (True, False)


def test_staged_transposing_copy_is_in_the_memory_model() -> None:
    from pipeline.plan.gpu_candidate import decode_buffer_bytes

    a, b = (
        ArraySpec((4096, 8192), (1024, 1024), "float32"),
        ArraySpec((8192, 4096), (1024, 1024), "float32"),
    )
    kw: dict[str, Any] = {"workers": 1, "threads_per_worker": 1, "memory_limit_bytes": 64 * GiB,
                          "tile_shape": (2048, 2048)}  # fmt: skip
    plain, flipped = (
        plan_matmul(a, b, transposed=t, **kw) for t in ((False, False), (True, False))
    )
    extra = decode_buffer_bytes(flipped, 2) - decode_buffer_bytes(plain, 2)
    assert extra == 2 * 2048 * flipped.panel_width * 4  # a stored panel per fill in flight

"""Stores AnnData writes (``write_zarr``, Zarr v2 and v3) as inputs: its dense arrays (X, a
layer, obsm) multiply like any array; its sparse X, and a group named where an array belongs,
are refused (exit 2) before any work, naming what to give instead."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

import pipeline
from pipeline.errors import InputError
from pipeline.store import input_groups, inputs
from tests.helpers import assert_product, run_cli, write_array

anndata = pytest.importorskip("anndata")
sparse = pytest.importorskip("scipy.sparse")  # anndata's own dependency

OBS, VARS, PCS = 300, 40, 12
"""Cells, genes and principal components of the stores written here."""
CLI_CLUSTER = ("--dashboard-address", "127.0.0.1:0", "--no-progress")


@dataclass(frozen=True)
class Store:
    path: str
    x: Any
    """X as written (a numpy array, or a scipy sparse matrix)."""
    counts: Any
    pca: Any


def write_store(path: Path, zarr_format: int, x: Any) -> Store:
    """An AnnData store as ``write_zarr`` writes it: X, ``layers['counts']`` and
    ``obsm['X_pca']``, with the obs and var dataframes."""
    rng = np.random.default_rng(zarr_format)
    counts = rng.integers(0, 20, (OBS, VARS)).astype("float32")
    pca = rng.standard_normal((OBS, PCS)).astype("float32")
    adata = anndata.AnnData(X=x, layers={"counts": counts}, obsm={"X_pca": pca})
    with anndata.settings.override(zarr_write_format=zarr_format), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's notes on consolidated metadata and sharding
        adata.write_zarr(str(path))
    return Store(str(path), x, counts, pca)


@pytest.fixture(params=[2, 3], ids=["zarr2", "zarr3"])
def dense(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    x = np.random.default_rng(7).uniform(-1, 1, (OBS, VARS)).astype("float32")
    return write_store(tmp_path / "cells.zarr", request.param, x)


def snapshot(root: str) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: its bytes and mtime."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            found[path] = (Path(path).read_bytes(), os.stat(path).st_mtime_ns)
    return found


def test_gram_and_verify_of_x_on_the_command_line(dense: Store, tmp_path: Path) -> None:
    g = str(tmp_path / "g.zarr")
    done = run_cli("gram", f"{dense.path}/X", g, *CLI_CLUSTER)
    assert done.returncode == 0, done.stderr
    assert_product(zarr.open_array(g)[:], dense.x.T, dense.x)
    checked = run_cli("verify", f"{dense.path}/X", f"{dense.path}/X", g, *CLI_CLUSTER)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("verify ok"), checked.stdout


def test_a_layer_transposed_on_the_command_line(dense: Store, tmp_path: Path) -> None:
    b = np.random.default_rng(1).uniform(-1, 1, (OBS, 8)).astype("float32")
    b_url = write_array(tmp_path / "b.zarr", b, (100, 8))
    out = str(tmp_path / "out.zarr")
    done = run_cli(
        "multiply", f"{dense.path}/layers/counts", b_url, out, "--transpose-a", *CLI_CLUSTER
    )
    assert done.returncode == 0, done.stderr
    assert_product(zarr.open_array(out)[:], dense.counts.T, b)


@pytest.mark.parametrize("rows", [False, True], ids=["columns", "rows"])
def test_python_api(dense: Store, tmp_path: Path, client: Client, rows: bool) -> None:
    g = tmp_path / "pca_gram.zarr"
    pipeline.gram(f"{dense.path}/obsm/X_pca", g, rows=rows, client=client)
    x = dense.pca
    assert_product(zarr.open_array(str(g))[:], *((x, x.T) if rows else (x.T, x)))
    out = tmp_path / "out.zarr"
    pipeline.multiply(
        f"{dense.path}/layers/counts", f"{dense.path}/X", out, transpose_a=True, client=client
    )
    assert_product(zarr.open_array(str(out))[:], dense.counts.T, dense.x)
    checked = pipeline.verify_product(
        client, f"{dense.path}/layers/counts", f"{dense.path}/X", str(out)
    )
    assert checked.passed
    assert re.fullmatch(
        r"<VerifyResult ok: worst residual/tolerance \S+ at row \d+, 2 round\(s\)>", repr(checked)
    )


SPARSE_LINE = (
    r"error: X \((?P<url>.*/X)\) is a sparse matrix \(AnnData (?P<kind>cs[rc])_matrix, 300x40, "
    r"(?P<stored>\d+) stored values\): sparse input is not supported; write it dense, e\.g\. "
    r"adata\.X = adata\.X\.toarray\(\) before write_zarr, or chunk by chunk, never all of it in "
    r"memory: `(?P<open>[^`]+)`, `(?P<create>[^`]+)`, then `(?P<loop>[^`]+)`; give X_dense\.zarr "
    r"as X"
)


@pytest.mark.parametrize("kind", ["csr", "csc"])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_sparse_x_is_refused_with_a_recipe_that_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, zarr_format: int
) -> None:
    x = sparse.random(OBS, VARS, density=0.1, format=kind, dtype="float32", random_state=3)
    store = write_store(tmp_path / "cells.zarr", zarr_format, x)
    before = snapshot(store.path)
    g = tmp_path / "g.zarr"
    done = run_cli("gram", f"{store.path}/X", str(g), *CLI_CLUSTER)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    said = re.fullmatch(SPARSE_LINE, done.stderr.strip())
    assert said, done.stderr
    assert (said["url"], said["kind"], int(said["stored"])) == (f"{store.path}/X", kind, x.nnz)
    assert not g.exists()
    assert snapshot(store.path) == before
    # The recipe, run as given: a dense copy, never the whole dense matrix at once.
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"anndata": anndata, "zarr": zarr}
    for statement in (said["open"], said["create"], said["loop"]):
        exec(statement, scope)
    np.testing.assert_array_equal(zarr.open_array("X_dense.zarr")[:], x.toarray())
    assert snapshot(store.path) == before


def test_a_sparse_layer_names_its_attribute(tmp_path: Path) -> None:
    spliced = sparse.random(OBS, VARS, density=0.1, format="csr", dtype="float32")
    adata = anndata.AnnData(X=np.zeros((OBS, VARS), "float32"), layers={"spliced": spliced})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adata.write_zarr(str(tmp_path / "cells.zarr"))
    fix = r"adata\.layers\['spliced'\] = adata\.layers\['spliced'\]\.toarray\(\)"
    with pytest.raises(InputError, match=fix):
        inputs.open_input(str(tmp_path / "cells.zarr/layers/spliced"), None, "A")


def test_groups_named_as_inputs(dense: Store, tmp_path: Path) -> None:
    """Each command names the input (A, B, C, X), says it is a group, and lists arrays inside
    it that can be given; nothing is written and the store is unchanged."""
    root = dense.path
    before = snapshot(root)
    out = tmp_path / "out.zarr"
    cases = [
        (
            ["gram", root, str(out)],
            f"error: X ({root}) is a Zarr group (an AnnData store), not an array; arrays inside "
            f"it that can be multiplied: {root}/X (300x40 float32), {root}/layers/counts "
            f"(300x40 float32), {root}/obsm/X_pca (300x12 float32); give the path of one of them",
        ),
        (
            ["multiply", f"{root}/X", f"{root}/obs", str(out)],
            f"error: B ({root}/obs) is a Zarr group (AnnData dataframe), not an array, and holds "
            "no 2-D numeric array; give the path of a 2-D Zarr array",
        ),
        (
            ["verify", f"{root}/obsm", f"{root}/X", str(out)],
            f"error: A ({root}/obsm) is a Zarr group (AnnData dict), not an array; arrays inside "
            f"it that can be multiplied: {root}/obsm/X_pca (300x12 float32); give the path of "
            "one of them",
        ),
        (
            ["verify", f"{root}/obsm/X_pca", f"{root}/obsm/X_pca", f"{root}/layers"],
            f"error: C ({root}/layers) is a Zarr group (AnnData dict), not an array; arrays "
            f"inside it that can be multiplied: {root}/layers/counts (300x40 float32); give the "
            "path of one of them",
        ),
    ]
    for args, line in cases:
        done = run_cli(*args, *CLI_CLUSTER)
        assert (done.returncode, done.stderr) == (2, line + "\n"), args
        assert not out.exists()
    assert snapshot(root) == before


def test_a_group_lists_a_handful_of_arrays(tmp_path: Path) -> None:
    group = zarr.create_group(str(tmp_path / "many.zarr"))
    for i in range(8):
        group.create_array(f"m{i}", shape=(3, 4), dtype="float64")
    group.create_array("vector", shape=(5,), dtype="float64")  # 1-D: not listed
    with pytest.raises(InputError) as refused:
        inputs.open_input(str(tmp_path / "many.zarr"), None, "A")
    listed = re.findall(r"many\.zarr/(\w+) \(3x4 float64\)", str(refused.value))
    assert listed == ["m0", "m1", "m2", "m3", "m4"]


def test_a_group_is_looked_at_within_bounds(tmp_path: Path) -> None:
    """A large group is not read whole, and a FIFO where a member's metadata should be is
    never opened (it would block)."""
    root = tmp_path / "wide.zarr"
    group = zarr.create_group(str(root))
    for i in range(input_groups.NODES_LOOKED_AT + 10):
        group.create_group(f"g{i:03d}")
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "zarr.json")
    with pytest.raises(InputError, match=r"holds no 2-D numeric array among the first 64 entries"):
        inputs.open_input(str(root), None, "A")


@pytest.mark.parametrize("encoding", [["csr_matrix"], {"x": 1}, 3])
def test_an_encoding_that_is_no_name_is_a_plain_group(tmp_path: Path, encoding: Any) -> None:
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.attrs["encoding-type"] = encoding
    inner = group.create_group("inner")
    inner.attrs["encoding-type"] = encoding  # looked into, not taken for a sparse matrix
    inner.create_array("M", shape=(4, 3), dtype="f4")
    with pytest.raises(
        InputError, match=r"is a Zarr group, not an array; .*g\.zarr/inner/M \(4x3 float32\)"
    ):
        inputs.open_input(str(tmp_path / "g.zarr"), None, "A")

"""The moments pass (pipeline/run/moments.py) without a cluster: X cut into blocks of whole
chunks, measured and merged in a fixed tree by a client that runs each task at once, against
numpy; its refusals name the variable as X numbers it, whichever band holds it
(benchmarks/mutate.py, target moments)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.plan.standardize import Moments, Standardize, block_moments, merge
from pipeline.run import moments
from tests.helpers import write_array


class EagerClient:
    """distributed.Client's submit and gather, each task run when submitted."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.blocks: list[Any] = []
        self.merges = 0

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if fn is merge:
            assert kwargs == {"pure": False}  # two merges of equal parts are two tasks
            self.merges += 1
        else:
            self.keys.append(kwargs.pop("key"))
            self.blocks.append(args[3])
            assert not kwargs
        return fn(*args)

    def gather(self, futures: list[Any]) -> list[Any]:
        return list(futures)


# blocks: (shape, chunks, axis, BLOCK_ELEMENTS) -> bands of (rows, cols)
BLOCKS = [
    # per column, 30 elements per chunk column > 24: one chunk wide, 4 chunks (8 rows) high
    ((10, 7), (2, 3), 1, 24, [
        [((0, 8), (0, 3)), ((8, 10), (0, 3))],
        [((0, 8), (3, 6)), ((8, 10), (3, 6))],
        [((0, 8), (6, 7)), ((8, 10), (6, 7))],
    ]),
    # per row: the same, transposed
    ((7, 10), (3, 2), 0, 24, [
        [((0, 3), (0, 8)), ((0, 3), (8, 10))],
        [((3, 6), (0, 8)), ((3, 6), (8, 10))],
        [((6, 7), (0, 8)), ((6, 7), (8, 10))],
    ]),
    # 64 elements hold 8 chunk columns (of 8): every variable in one band, one block
    ((4, 10), (2, 2), 1, 64, [[((0, 4), (0, 10))]]),
    # 32 elements: 2 chunk columns (4 variables) per band, 32 // 8 = 4 chunk rows: all 3
    ((6, 10), (2, 2), 1, 32, [
        [((0, 6), (0, 4))], [((0, 6), (4, 8))], [((0, 6), (8, 10))],
    ]),
    # per row: 20 elements per chunk row (32 // 20 = 1), the whole row's length in one block
    ((6, 10), (2, 2), 0, 32, [
        [((0, 2), (0, 10))], [((2, 4), (0, 10))], [((4, 6), (0, 10))],
    ]),
    # blocks of 3 chunks high over a narrow X: height from the band's own width (3 < 4)
    ((12, 3), (1, 4), 1, 9, [[((0, 3), (0, 3)), ((3, 6), (0, 3)), ((6, 9), (0, 3)),
                              ((9, 12), (0, 3))]]),
    # one value per variable: 24 variables a band
    ((1, 50), (1, 1), 1, 24, [
        [((0, 1), (0, 24))], [((0, 1), (24, 48))], [((0, 1), (48, 50))],
    ]),
    # one variable of one-value chunks: 24 values a block
    ((50, 1), (1, 1), 1, 24, [[((0, 24), (0, 1)), ((24, 48), (0, 1)), ((48, 50), (0, 1))]]),
    # nothing summed over many variables: bands as wide as the elements allow
    ((0, 50), (1, 1), 1, 24, [
        [((0, 0), (0, 24))], [((0, 0), (24, 48))], [((0, 0), (48, 50))],
    ]),
    # nothing summed: one empty block per band (its moments: count 0)
    ((0, 5), (1, 5), 1, 24, [[((0, 0), (0, 5))]]),
    # no variables: no bands
    ((5, 0), (5, 1), 1, 24, []),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "chunks", "axis", "elements", "expected"), BLOCKS)
def test_blocks_are_whole_chunks_grouped_by_variables(
    shape: tuple[int, int],
    chunks: tuple[int, int],
    axis: int,
    elements: int,
    expected: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(moments, "BLOCK_ELEMENTS", elements)
    assert moments.blocks(shape, chunks, axis) == expected


def test_blocks_of_the_default_size_hold_32_mib_of_float64() -> None:
    assert moments.BLOCK_ELEMENTS * 8 == 32 << 20
    # a 4096 x 4096 X in 512 x 512 chunks: 2 chunk columns per band, whole height
    bands = moments.blocks((4096, 4096), (512, 512), 1)
    assert len(bands) == 4 and bands[0] == [((0, 4096), (0, 1024))]


def x_url(tmp_path: Path, x: Any, chunks: tuple[int, int]) -> str:
    return write_array(tmp_path / "x.zarr", x, chunks)


def balanced(parts: list[Moments]) -> Moments:
    """The fixed tree the pass promises: neighbours paired, an odd last one carried up."""
    while len(parts) > 1:
        pairs = [merge(p, q) for p, q in zip(parts[::2], parts[1::2], strict=False)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


@pytest.mark.parametrize("axis", [1, 0])
def test_the_pass_gives_numpys_moments_merged_in_the_fixed_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, axis: int
) -> None:
    """Three bands of variables, five blocks each (an odd one carried up twice): the means
    and spreads are numpy's, to the bit those of the promised tree."""
    monkeypatch.setattr(moments, "BLOCK_ELEMENTS", 4)  # one 2 x 2 chunk per block
    rng = np.random.default_rng(5)
    x = 280.0 + 3.0 * rng.standard_normal((10, 6))  # a large mean, a small spread
    x = x if axis == 1 else x.T.copy()
    url = x_url(tmp_path, x, (2, 2))
    client = EagerClient()
    got = moments.measure(client, url, {}, Standardize("scale", axis), "X")  # type: ignore[arg-type]
    bands = moments.blocks(x.shape, (2, 2), axis)
    assert [len(b) for b in bands] == [5, 5, 5]
    assert client.merges == 3 * 4
    summed = 0 if axis == 1 else 1
    np.testing.assert_allclose(got.shift, x.mean(axis=summed), rtol=1e-14)  # type: ignore[arg-type]
    m2 = ((x - x.mean(axis=summed, keepdims=True)) ** 2).sum(axis=summed)
    np.testing.assert_allclose(got.scale, 1 / np.sqrt(m2), rtol=1e-10)  # type: ignore[arg-type]
    assert got.count == 10 and got.used == 6 and got.constant == 0
    expected = [
        balanced([block_moments(x[r0:r1, c0:c1], axis) for (r0, r1), (c0, c1) in band])
        for band in bands
    ]
    np.testing.assert_array_equal(got.shift, np.concatenate([e.mean for e in expected]))  # type: ignore[arg-type]
    m2s = np.concatenate([e.m2 for e in expected])
    np.testing.assert_array_equal(got.scale, 1 / np.sqrt(m2s))  # type: ignore[arg-type]


def test_each_block_task_has_its_own_key_in_this_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(moments, "BLOCK_ELEMENTS", 4)
    url = x_url(tmp_path, np.ones((10, 6)), (2, 2))
    client = EagerClient()
    moments.measure(client, url, {}, Standardize("center", 1), "X")  # type: ignore[arg-type]
    assert len(set(client.keys)) == len(client.keys) == 15
    run = client.keys[0].split("-")[1]
    assert len(run) == 8
    expected = [f"moments-{run}-{b}-{i}" for b in range(3) for i in range(5)]
    assert client.keys == expected
    again = EagerClient()
    moments.measure(again, url, {}, Standardize("center", 1), "X")  # type: ignore[arg-type]
    assert not set(again.keys) & set(client.keys), "a second pass reused a key"


def test_one_band_of_one_block_is_measured_without_merging(tmp_path: Path) -> None:
    x = np.arange(12.0).reshape(4, 3)
    url = x_url(tmp_path, x, (4, 3))
    client = EagerClient()
    got = moments.measure(client, url, {}, Standardize("center", 1, ddof=0), "X")  # type: ignore[arg-type]
    assert client.merges == 0 and len(client.keys) == 1
    np.testing.assert_array_equal(got.shift, x.mean(axis=0))  # type: ignore[arg-type]
    np.testing.assert_array_equal(got.scale, np.full(3, 0.5))  # type: ignore[arg-type]
    assert got.count == 4


def test_a_nan_is_named_by_its_column_of_x_in_a_later_band(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(moments, "BLOCK_ELEMENTS", 12)
    x = np.ones((10, 6))
    x[7, 4] = np.nan
    x[1, 5] = np.nan
    url = x_url(tmp_path, x, (2, 2))
    with pytest.raises(InputError, match=r"^X holds 2 NaN value\(s\) in 2 column\(s\) \(the "
                       r"first in column 4\); --center needs a policy"):  # fmt: skip
        moments.measure(EagerClient(), url, {}, Standardize("center", 1), "X")  # type: ignore[arg-type]


def test_a_dosage_out_of_range_is_named_by_its_variant_and_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kinship's variants are X's rows (per row): the one holding a 3 is row 4, in the
    third band, and its values run 0 to 3."""
    monkeypatch.setattr(moments, "BLOCK_ELEMENTS", 12)
    x = np.ones((6, 10))
    x[4, 3], x[4, 8] = 3.0, 0.0
    x[1, 2] = 0.5  # an earlier row's values stay inside 0..2
    url = x_url(tmp_path, x, (2, 2))
    with pytest.raises(InputError, match=r"G's variant row 4 holds values from 0 to 3;"):
        moments.measure(EagerClient(), url, {}, Standardize("kinship", 0), "G")  # type: ignore[arg-type]
    x[4, 3] = -1.0
    url = write_array(tmp_path / "y.zarr", x, (2, 2))
    with pytest.raises(InputError, match=r"G's variant row 4 holds values from -1 to 1;"):
        moments.measure(EagerClient(), url, {}, Standardize("kinship", 0), "G")  # type: ignore[arg-type]


def test_a_kinship_over_bands_uses_every_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(moments, "BLOCK_ELEMENTS", 12)
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, (6, 10)).astype(np.float64)
    x[:, 0] = 2.0  # one sample: no matter; a variant (row) all 2 is left out
    x[3] = 2.0
    url = x_url(tmp_path, x, (2, 2))
    got = moments.measure(EagerClient(), url, {}, Standardize("kinship", 0), "X")  # type: ignore[arg-type]
    np.testing.assert_allclose(got.shift, x.mean(axis=1), rtol=1e-14)  # type: ignore[arg-type]
    assert got.used == 5 and got.constant == 1 and got.count == 10


def test_the_pass_logs_what_it_measures(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = x_url(tmp_path, np.ones((4, 3)), (4, 3))
    with caplog.at_level(logging.INFO, logger="pipeline"):
        moments.measure(EagerClient(), url, {}, Standardize("kinship", 1), "G")  # type: ignore[arg-type]
    assert "measuring the allele frequencies of G (one pass over it)" in caplog.messages


def test_a_block_task_reads_its_block_of_x(tmp_path: Path) -> None:
    x = np.arange(30.0).reshape(5, 6)
    url = x_url(tmp_path, x, (2, 2))
    got = moments.block_task(url, {}, "X", ((2, 4), (0, 6)), 0)
    assert got.count == 6
    np.testing.assert_array_equal(got.mean, x[2:4].mean(axis=1))
    got = moments.block_task(url, {}, "X", ((2, 4), (0, 6)), 1)
    assert got.count == 2
    np.testing.assert_array_equal(got.mean, x[2:4].mean(axis=0))


def test_blocks_follow_xs_own_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 2 rows x 3 columns: the tasks read whole chunks of X, two bands of variables."""
    monkeypatch.setattr(moments, "BLOCK_ELEMENTS", 24)
    x = np.arange(60.0).reshape(10, 6) % 7
    url = x_url(tmp_path, x, (2, 3))
    client = EagerClient()
    got = moments.measure(client, url, {}, Standardize("center", 1))  # type: ignore[arg-type]
    expected = moments.blocks((10, 6), (2, 3), 1)
    assert len(expected) == 2 and expected[0][0] == ((0, 8), (0, 3))
    assert client.blocks == [at for band in expected for at in band]
    np.testing.assert_allclose(got.shift, x.mean(axis=0), rtol=1e-14)  # type: ignore[arg-type]


def test_the_operand_is_named_x_unless_told(tmp_path: Path) -> None:
    x = np.ones((4, 3))
    x[2, 1] = np.nan
    url = x_url(tmp_path, x, (4, 3))
    with pytest.raises(InputError, match=r"^X holds 1 NaN"):
        moments.measure(EagerClient(), url, {}, Standardize("scale", 1))  # type: ignore[arg-type]


def test_storage_options_and_the_name_reach_every_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's open and each worker's: the same URL, fsspec options and operand name
    (what an object store's credentials and every refusal's words depend on)."""
    url = x_url(tmp_path, np.ones((4, 6)), (4, 2))
    seen = []
    real_open, real_worker = moments.inputs.open_input, moments.inputs.open_on_worker

    def open_input(u: str, options: Any, name: str) -> Any:
        seen.append(("client", u, options, name))
        return real_open(u, {}, name)

    def open_on_worker(u: str, options: Any, name: str) -> Any:
        seen.append(("worker", u, options, name))
        return real_worker(u, {}, name)

    monkeypatch.setattr(moments.inputs, "open_input", open_input)
    monkeypatch.setattr(moments.inputs, "open_on_worker", open_on_worker)
    options = {"anon": True}
    moments.measure(EagerClient(), url, options, Standardize("center", 0), "G")  # type: ignore[arg-type]
    assert seen[0] == ("client", url, options, "G")
    assert ("worker", url, options, "G") in seen  # (the worker's open calls open_input too)


def test_a_corrupt_chunk_is_named_with_the_fix_for_a_moments_pass(tmp_path: Path) -> None:
    url = x_url(tmp_path, np.ones((4, 6)), (4, 2))
    (tmp_path / "x.zarr" / "c" / "0" / "1").write_bytes(b"not a chunk")
    with pytest.raises(InputError) as refused:
        moments.block_task(url, {}, "G", ((0, 4), (0, 6)), 1)
    text = str(refused.value)
    assert text.startswith(f"G ({url}) has a chunk that cannot be read: {url}/c/0/1 (rows 0:4")
    assert text.endswith("restore that chunk from a good copy or rewrite G, then rerun")

"""C's original objects are moved aside as they are (no byte decoded or rewritten) before a
tile's first write, for every layout of someone else's C, and a tile stopped halfway through
moving them still adds its product once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.accumulate.state import ORIGINAL, SIDECAR
from pipeline.errors import UsageError
from tests.pipeline.test_accumulate import ALPHA, BETA, assert_once, expected, setup

LAYOUTS = {
    "v3": {},
    "v3-sharded-zstd": {"shards": (256, 260), "compressors": zarr.codecs.ZstdCodec(level=3)},
    "v2-dots": {"zarr_format": 2, "chunk_key_encoding": {"name": "v2", "separator": "."}},
    "v2-slashes": {"zarr_format": 2, "chunk_key_encoding": {"name": "v2", "separator": "/"}},
}


def _rewrite_c(c_url: str, c0: np.ndarray, chunks: tuple[int, int], **layout: Any) -> None:
    zarr.create_array(c_url, data=c0, chunks=chunks, attributes={"owner": "someone else"},
                      overwrite=True, **layout)  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_every_layout_of_c(tmp_path: Path, client: Client, layout: str) -> None:
    a_url, b_url, c_url, c0 = setup(tmp_path)
    chunks = (128, 130) if "shards" in LAYOUTS[layout] else (256, 256)
    _rewrite_c(c_url, c0, chunks, **LAYOUTS[layout])
    multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=ALPHA, beta=BETA)
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))


def test_unwritten_chunks_are_c_fill_value(tmp_path: Path, client: Client) -> None:
    """Chunks C never stored hold its fill value, in C and in the moved-aside originals."""
    a_url, b_url, c_url, _ = setup(tmp_path)
    c = zarr.create_array(c_url, shape=(600, 520), chunks=(256, 256), dtype="f8",
                          fill_value=7.0, attributes={"owner": "someone else"},
                          overwrite=True)  # fmt: skip
    c[:256, :256] = 1.0  # one chunk stored, eight never written
    c0 = np.full((600, 520), 7.0)
    c0[:256, :256] = 1.0
    multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=ALPHA, beta=BETA)
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))


def test_objects_are_renamed_not_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local C's objects keep their inodes in ``original/`` (no byte of C is read or written
    to keep them), and again when a failed accumulation moves them home."""
    import pipeline.accumulate.tasks as acc

    a_url, b_url, c_url, _ = setup(tmp_path)
    inodes = _inodes(Path(c_url) / "c", Path(c_url))
    moved = Path(c_url) / SIDECAR / ORIGINAL
    kept: dict[Path, int] = {}

    def stop(*args: Any) -> Any:
        kept.update(_inodes(moved / "c", moved))
        raise RuntimeError("stopped after the originals moved")

    monkeypatch.setattr(acc, "combine", stop)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c, \
            pytest.raises(Exception, match="originals moved"):  # fmt: skip
        multiply(a_url, b_url, c_url, client=c, accumulate=True)
    assert kept, "a tile moved its objects"
    assert all(inodes[key] == ino for key, ino in kept.items())
    assert _inodes(Path(c_url) / "c", Path(c_url)) == inodes, "moved home, as they were"


def _inodes(folder: Path, root: Path) -> dict[Path, int]:
    return {p.relative_to(root): p.stat().st_ino for p in folder.rglob("*") if p.is_file()}


def test_a_tile_stopped_while_moving_its_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 client: Client) -> None:  # fmt: skip
    """A task that fails after moving some of a tile's objects (no marker yet): the rollback
    moves them home, so C reads as before, and the next run adds each product once."""
    import pipeline.accumulate.tasks as acc

    a_url, b_url, c_url, c0 = setup(tmp_path)
    real = acc.save_tile

    def halfway(out: Any, index: Any, keys: list[str]) -> None:
        real(out, index, keys[: len(keys) // 2 + 1])
        raise RuntimeError("killed halfway through the moves")

    monkeypatch.setattr(acc, "save_tile", halfway)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c, \
            pytest.raises(Exception, match="halfway"):  # fmt: skip
        multiply(a_url, b_url, c_url, client=c, accumulate=True, alpha=ALPHA, beta=BETA)
    monkeypatch.undo()
    assert not (Path(c_url) / SIDECAR).exists(), "rolled back"
    np.testing.assert_array_equal(zarr.open_array(c_url)[:], c0, strict=True)
    with pytest.raises(UsageError, match="no unfinished accumulation"):
        multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=ALPHA, beta=BETA,
                 resume=True)  # fmt: skip
    multiply(a_url, b_url, c_url, client=client, accumulate=True, alpha=ALPHA, beta=BETA)
    assert_once(c_url, expected(a_url, b_url, c0, ALPHA, BETA))

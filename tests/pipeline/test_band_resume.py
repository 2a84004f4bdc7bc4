"""--resume keeps the bands a tile in flight had written: the tile computes only the rows after
them (checked by their chained crc32, so a band changed since is computed again), the result
is exact, and the band entries are gone once the job completes; accumulation too."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.store import record
from tests.helpers import assert_product, random_matrix, run_cli, write_array
from tests.pipeline.test_accumulate import assert_once, expected
from tests.pipeline.test_accumulate import setup as accumulate_setup
from tests.pipeline.test_crash import job, multiply_argv

M, K, N = 2048, 64, 256  # one tile of 8 bands of 256 rows (OUT chunks of 128 rows)


def _inputs(tmp_path: Path) -> tuple[str, str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, (M, K), "float32"), random_matrix(rng, (K, N), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (128, 64))
    b_url = write_array(tmp_path / "b.zarr", b, (64, 128))
    return a_url, b_url, a, b


def _bands(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_bytes()) for p in sorted((out / "journal").glob("band-*.json"))]


def _fail_after_bands(monkeypatch: pytest.MonkeyPatch, bands: int, journaled: bool = False) -> None:
    """The task dies once ``bands`` bands are written (a kill between two bands), as the next
    band is journaled: before its entry, or (``journaled``) after it and before its write."""
    from pipeline.store.output import Output

    real, calls = Output.journal_band, {"n": 0}

    def journal_band(self: Output, *args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == bands + 1 and not journaled:
            raise RuntimeError("killed between two bands")
        real(self, *args)
        if calls["n"] == bands + 1:
            raise RuntimeError("killed between two bands")

    monkeypatch.setattr(Output, "journal_band", journal_band)


def _computed_rows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record the rows each tile task multiplies."""
    import pipeline.run.worker as worker

    seen: list[tuple[int, int]] = []
    real = worker._multiply

    def multiply_(spec: Any, tile: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(tile.rows)
        return real(spec, tile, *args, **kwargs)

    monkeypatch.setattr(worker, "_multiply", multiply_)
    return seen


def _stopped_after_3_bands(
    a_url: str, b_url: str, out: Path, monkeypatch: pytest.MonkeyPatch, client: Client
) -> Path:
    """OUT of a job whose one tile task died right after journaling its third band."""
    _fail_after_bands(monkeypatch, 3)
    with pytest.raises(Exception, match="between two bands"):
        multiply(a_url, b_url, str(out), client=client, chunks=(128, 128))
    monkeypatch.undo()
    return out


@pytest.fixture
def one_worker() -> Any:
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:  # fmt: skip
        yield client


def test_resume_computes_only_the_unwritten_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_worker: Client
) -> None:
    a_url, b_url, a, b = _inputs(tmp_path)
    out = _stopped_after_3_bands(a_url, b_url, tmp_path / "c.zarr", monkeypatch, one_worker)
    written = sorted(e["rows"] for e in _bands(out))
    assert written == [[0, 256], [256, 512], [512, 768]], written
    seen = _computed_rows(monkeypatch)
    result = multiply(a_url, b_url, str(out), client=one_worker, chunks=(128, 128), resume=True)
    assert result.plan.n_tiles == 1 and seen == [(written[-1][1], M)], "the unwritten rows only"
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)
    assert _bands(out) == [], "band entries are dropped once the job completes"
    assert record.of_array(zarr.open_array(str(out))).complete is True


def test_a_band_journaled_but_not_written_is_computed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_worker: Client
) -> None:
    """A band's entry is recorded before its write: a task killed between the two leaves an
    entry whose crc32 the stored rows do not give; the resume keeps the bands before it."""
    a_url, b_url, a, b = _inputs(tmp_path)
    out = tmp_path / "c.zarr"
    _fail_after_bands(monkeypatch, 3, journaled=True)
    with pytest.raises(Exception, match="between two bands"):
        multiply(a_url, b_url, str(out), client=one_worker, chunks=(128, 128))
    monkeypatch.undo()
    assert sorted(e["rows"] for e in _bands(out))[-1] == [768, 1024], "the entry went first"
    assert np.isnan(zarr.open_array(str(out), mode="r")[768:1024]).all(), "and no write"
    seen = _computed_rows(monkeypatch)
    multiply(a_url, b_url, str(out), client=one_worker, chunks=(128, 128), resume=True)
    assert seen == [(768, M)], seen
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)
    assert _bands(out) == []


def test_a_completed_resume_leaves_no_temporary_chunk_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_worker: Client
) -> None:
    """A writer SIGKILLed mid-chunk leaves its temporary file (c/I/J.<uuid>.partial) in OUT;
    the job that completes OUT removes it."""
    a_url, b_url, a, b = _inputs(tmp_path)
    out = _stopped_after_3_bands(a_url, b_url, tmp_path / "c.zarr", monkeypatch, one_worker)
    partial = out / "c" / "7" / f"1.{'ab' * 16}.partial"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"half a chunk")
    multiply(a_url, b_url, str(out), client=one_worker, chunks=(128, 128), resume=True)
    assert not partial.exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".partial")]
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)


def test_a_band_changed_since_is_computed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_worker: Client
) -> None:
    a_url, b_url, a, b = _inputs(tmp_path)
    out = _stopped_after_3_bands(a_url, b_url, tmp_path / "c.zarr", monkeypatch, one_worker)
    c = zarr.open_array(str(out), mode="r+")
    c[300, 5] = c[300, 5] + 1  # inside the second band: the first still counts
    seen = _computed_rows(monkeypatch)
    multiply(a_url, b_url, str(out), client=one_worker, chunks=(128, 128), resume=True)
    assert seen == [(256, M)]
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)


@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_band_whose_chunk_cannot_be_read_is_computed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_worker: Client, damage: str
) -> None:
    """A written chunk of OUT that no longer decodes (cut short, or overwritten by something
    else) is a band to compute again, with a warning, not a crash of --resume."""
    a_url, b_url, a, b = _inputs(tmp_path)
    out = _stopped_after_3_bands(a_url, b_url, tmp_path / "c.zarr", monkeypatch, one_worker)
    chunk = out / "c" / "2" / "1"  # rows 256:384 (the second band), columns 128:256
    if damage == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:1000])
    else:
        chunk.write_bytes(b"not a chunk")
    seen = _computed_rows(monkeypatch)
    with caplog_at_warning() as logged:
        multiply(a_url, b_url, str(out), client=one_worker, chunks=(128, 128), resume=True)
    assert seen == [(256, M)], "the first band still counts; the rest is computed again"
    assert "rows 256:512, columns 0:256 cannot be read back" in logged.getvalue()
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)


@contextlib.contextmanager
def caplog_at_warning() -> Any:
    """The pipeline logger's warnings, as text."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("pipeline")
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)


def test_accumulation_resumed_mid_tile_adds_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_worker: Client
) -> None:
    """A tile stopped between two bands with the accumulation left for --resume (as a kill,
    or a task still running when the job stopped, leaves it): the resumed tile keeps the
    written rows and each product is added once."""
    import pipeline.job

    a_url, b_url, c_url, c0 = accumulate_setup(tmp_path, m=M, k=K, n=N, c_chunks=(128, 128))
    _fail_after_bands(monkeypatch, 2)
    monkeypatch.setattr(pipeline.job, "roll_back_after_failure", lambda *args: False)
    with pytest.raises(Exception, match="between two bands"):
        multiply(a_url, b_url, c_url, client=one_worker, accumulate=True, alpha=2.0, beta=-0.5)
    monkeypatch.undo()
    seen = _computed_rows(monkeypatch)
    multiply(a_url, b_url, c_url, client=one_worker, accumulate=True, alpha=2.0, beta=-0.5,
             resume=True)  # fmt: skip
    assert seen and all(rows[0] > 0 for rows in seen), seen
    assert_once(c_url, expected(a_url, b_url, c0, 2.0, -0.5))


def test_kill_9_mid_tile_then_resume(tmp_path: Path) -> None:
    """Real processes: the CLI SIGKILLed once a tile has journaled two bands (so its first is
    written: entries go ahead of their writes); the resumed run keeps the written bands (the
    log says how many rows) and the product is exact."""
    rng = np.random.default_rng(6)
    a, b = random_matrix(rng, (4096, 512), "float32"), random_matrix(rng, (512, 1024), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (256, 256))
    b_url = write_array(tmp_path / "b.zarr", b, (256, 256))
    out = tmp_path / "c.zarr"
    argv = multiply_argv(a_url, b_url, out, "--chunks", "128x128")
    with job(argv, tmp_path / "killed") as proc:
        deadline = time.monotonic() + 240
        while max(_entries_per_tile(out).values(), default=0) < 2:
            assert proc.poll() is None, (tmp_path / "killed.err").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    done = run_cli(*argv[3:], "--resume", timeout=240)
    assert done.returncode == 0, done.stderr
    assert "written row(s)" in done.stderr, done.stderr
    assert_product(zarr.open_array(str(out), mode="r")[:], a, b)
    assert not list((out / "journal").glob("band-*.json"))


def _entries_per_tile(out: Path) -> dict[str, int]:
    """Band entries in OUT's journal, by tile (band-I-J-ROW.json)."""
    count: dict[str, int] = {}
    for p in (out / "journal").glob("band-*.json"):
        tile = p.name.rsplit("-", 1)[0]
        count[tile] = count.get(tile, 0) + 1
    return count

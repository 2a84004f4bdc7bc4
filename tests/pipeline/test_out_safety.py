"""Never destroy data that is not ours: OUT is one resolved location, created exclusively,
replaced only where it is our own array, and a resume knows its inputs changed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply, prepare
from pipeline.errors import JobError, OutputExistsError, UnsafeOutputError, UsageError
from pipeline.generate import write_random
from pipeline.store.record import of_array
from tests.helpers import assert_product, random_matrix, run_cli, write_array


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, (40, 30), "float32"), random_matrix(rng, (30, 20), "float32")
    return (
        write_array(tmp_path / "a.zarr", a, (20, 10)),
        write_array(tmp_path / "b.zarr", b, (10, 10)),
        a,
        b,
    )


def victim(tmp_path: Path) -> Path:
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    return folder


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "spelling",
    [
        # through a folder that does not exist
        "missing/../victim",
        # through one that does, twice
        "victim/../victim/./",
        # through a symlink to the folder
        "link-to-victim",
    ],
)
def test_out_spelled_another_way_never_deletes_a_foreign_folder(
    tmp_path: Path, inputs: tuple, spelling: str
) -> None:
    a_url, b_url, _, _ = inputs
    folder = victim(tmp_path)
    (tmp_path / "link-to-victim").symlink_to(folder)
    before = listing(folder)
    out = str(tmp_path / spelling)
    for argv in (
        ("multiply", a_url, b_url, out, "--no-progress"),
        ("multiply", a_url, b_url, out, "--no-progress", "--overwrite"),
        ("random", out, "--shape", "4x4", "--chunks", "2x2"),
        ("random", out, "--shape", "4x4", "--chunks", "2x2", "--overwrite"),
    ):
        done = run_cli(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        refused = ("is not a Zarr array written by this tool", "is a symbolic link (to")
        assert any(why in done.stderr for why in refused), done.stderr
        assert listing(folder) == before, f"{argv} changed the victim"
    assert not (tmp_path / "missing").exists(), "nothing created on the way"


@pytest.mark.parametrize(
    "intruder",
    [
        # a file of the user's beside our array
        "notes.txt",
        # a child array of someone else's
        "child/zarr.json",
        # a file in our chunk folder that is no chunk key of ours
        "c/readme",
        # a symlink where a chunk folder would be (deleting through it reaches elsewhere)
        "symlink:c/9",
    ],
)
def test_overwrite_refuses_out_holding_foreign_files(
    tmp_path: Path, client: Client, inputs: tuple, intruder: str
) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    elsewhere = victim(tmp_path)
    if intruder.startswith("symlink:"):
        (out / intruder.removeprefix("symlink:")).symlink_to(elsewhere)
    else:
        (out / intruder).parent.mkdir(parents=True, exist_ok=True)
        (out / intruder).write_text("not yours")
    before, theirs = listing(out), listing(elsewhere)
    for flag in ("overwrite", "resume"):  # resume would write through a link
        with pytest.raises(UnsafeOutputError, match=rf"did not write .*{flag}=True writes only"):
            multiply(a_url, b_url, str(out), client=client, **{flag: True})
    assert listing(out) == before and listing(elsewhere) == theirs
    assert_product(zarr.open_array(str(out))[:], a, b)


def test_overwrite_removes_exactly_our_files(tmp_path: Path, client: Client, inputs: tuple) -> None:
    """Old chunks and journal entries of a different layout do not survive an overwrite."""
    a_url, b_url, a, b = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client, chunks=(5, 5))
    (out / "journal" / "tile-0-0.json.0123456789abcdef0123456789abcdef.partial").write_text("")
    result = multiply(a_url, b_url, str(out), client=client, overwrite=True, chunks=(40, 20))
    keys = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert keys == [
        "c/0/0",
        "inputs.json",
        *[f"journal/tile-{i}-{j}.json" for i, j in _tiles(result)],
        "zarr.json",
    ]
    assert_product(zarr.open_array(str(out))[:], a, b)


def _tiles(result: Any) -> list[tuple[int, int]]:
    return sorted(t.index for t in result.plan.tiles())


def test_array_appearing_between_prepare_and_execute_is_kept(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "c.zarr"
    job = prepare(a_url, b_url, str(out), overwrite=True)
    theirs = zarr.create_array(str(out), data=np.arange(6.0).reshape(2, 3), chunks=(1, 3))
    with pytest.raises(UnsafeOutputError, match="not a Zarr array written by this tool"):
        job.execute(client)
    np.testing.assert_array_equal(theirs[:], np.arange(6.0).reshape(2, 3))


def test_our_array_appearing_between_prepare_and_execute_is_refused(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "c.zarr"
    job = prepare(a_url, b_url, str(out), overwrite=True)
    multiply(a_url, b_url, str(out), client=client)  # another job got there first
    with pytest.raises(UnsafeOutputError, match="changed after this job was planned"):
        job.execute(client)
    assert of_array(zarr.open_array(str(out))).complete is True


def test_empty_folder_is_a_new_out(tmp_path: Path, client: Client, inputs: tuple) -> None:
    a_url, b_url, a, b = inputs
    out = tmp_path / "made-by-hand.zarr"
    out.mkdir()
    multiply(a_url, b_url, str(out), client=client)
    assert_product(zarr.open_array(str(out))[:], a, b)


def test_failed_job_leaves_no_new_folder(tmp_path: Path, inputs: tuple) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "c.zarr"
    done = run_cli("multiply", a_url, b_url, str(out), "--scheduler", "tcp://127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    assert not out.exists(), "a folder the job created and never wrote is removed"


@pytest.mark.parametrize(
    "how, stale_rows",
    [
        # same metadata, new values everywhere: every tile
        ("values", None),
        # one chunk of A's first row band rewritten in place with the same bytes
        ("touched", 0),
        # one chunk of A's second row band removed (it reads as the fill value now)
        ("chunk-removed", 1),
    ],
)
def test_resume_recomputes_tiles_that_read_changed_chunks(
    tmp_path: Path, client: Client, how: str, stale_rows: int | None
) -> None:
    rng = np.random.default_rng(8)
    a, b = random_matrix(rng, (768, 30), "float32"), random_matrix(rng, (30, 20), "float32")
    a_url = write_array(tmp_path / "a.zarr", a, (256, 10))  # tiles: whole 256-row bands
    b_url = write_array(tmp_path / "b.zarr", b, (10, 10))
    out = tmp_path / "c.zarr"
    first = multiply(a_url, b_url, str(out), client=client)
    assert first.plan.grid[0] >= 2, "A's row bands must be in different tiles"
    if how == "values":
        zarr.open_array(a_url, mode="r+")[:] = a + 1
    elif how == "touched":
        chunk = Path(a_url) / "c" / "0" / "0"
        chunk.write_bytes(chunk.read_bytes())
    else:
        (Path(a_url) / "c" / "1" / "0").unlink()
    new_a = np.asarray(zarr.open_array(a_url, mode="r")[:])
    result = multiply(a_url, b_url, str(out), client=client, resume=True)
    tiles = {t.index for t in result.plan.tiles()}
    band = (stale_rows or 0) * 256
    expected = tiles if stale_rows is None else {
        t.index for t in result.plan.tiles() if t.rows[0] < band + 256 and band < t.rows[1]
    }  # fmt: skip
    assert 0 < len(expected) <= len(tiles)
    assert (result.tiles_computed, result.tiles_skipped) == (
        len(expected),
        len(tiles) - len(expected),
    )
    assert_product(zarr.open_array(str(out))[:], new_a, b)


def test_resume_refuses_an_out_without_an_input_record(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    (out / "inputs.json").unlink()  # as an OUT of an older version has none
    with pytest.raises(UsageError, match=r"no record of its inputs.*overwrite=True"):
        multiply(a_url, b_url, str(out), client=client, resume=True)


def test_resume_with_unchanged_inputs_skips_every_tile(
    tmp_path: Path, client: Client, inputs: tuple
) -> None:
    a_url, b_url, _, _ = inputs
    out = tmp_path / "c.zarr"
    multiply(a_url, b_url, str(out), client=client)
    result = multiply(a_url, b_url, str(out), client=client, resume=True)
    assert result.tiles_skipped == result.plan.n_tiles and result.tiles_computed == 0


def test_input_changing_during_the_job_fails_it(
    tmp_path: Path, client: Client, inputs: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.store.resume

    a_url, b_url, _, _ = inputs
    real = pipeline.store.resume.data_listing
    calls: list[str] = []

    def drifting(url: str, options: Any) -> dict[str, str]:
        calls.append(url)
        found = real(url, options)
        return {**found, "c/0/0": "rewritten"} if len(calls) > 2 and url == b_url else found

    monkeypatch.setattr(pipeline.store.resume, "data_listing", drifting)
    out = tmp_path / "c.zarr"
    with pytest.raises(JobError, match=r"input B changed while the job ran .*resume=True"):
        multiply(a_url, b_url, str(out), client=client)
    assert of_array(zarr.open_array(str(out))).complete is False


@pytest.mark.parametrize(
    "where",
    [
        # input A's metadata: the original report
        "a.zarr/zarr.json",
        # inside OUT
        "c.zarr/report.html",
        # OUT itself
        "c.zarr",
        # a file that is no report of ours
        "notes.html",
        # a folder
        "folder",
    ],
)
def test_report_never_lands_on_data(tmp_path: Path, inputs: tuple, where: str) -> None:
    a_url, b_url, _, _ = inputs
    (tmp_path / "notes.html").write_text("<html>my notes</html>")
    (tmp_path / "folder").mkdir()
    before = listing(tmp_path)
    done = run_cli(
        "multiply", a_url, b_url, str(tmp_path / "c.zarr"), "--report", str(tmp_path / where)
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --report"), done.stderr
    assert listing(tmp_path) == before, "nothing written or replaced"


def test_report_of_ours_is_replaced(tmp_path: Path, inputs: tuple) -> None:
    a_url, b_url, _, _ = inputs
    report = tmp_path / "report.html"
    report.write_text("<html><head><title>Dask Performance Report</title></head></html>")
    job = prepare(a_url, b_url, str(tmp_path / "c.zarr"), report=str(report))
    assert job.options.report == str(report)


def test_random_target_is_claimed(tmp_path: Path) -> None:
    out = tmp_path / "r.zarr"
    write_random(str(out), (4, 4), (2, 2), "float32", 1)
    with pytest.raises(OutputExistsError):
        write_random(str(out), (4, 4), (2, 2), "float32", 1)
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(UnsafeOutputError, match="did not write"):
        write_random(str(out), (4, 4), (2, 2), "float32", 2, overwrite=True)
    assert (out / "mine.txt").read_text() == "keep me"
    os.remove(out / "mine.txt")
    again = write_random(str(tmp_path / "x" / ".." / "r.zarr"), (6, 2), (3, 2), "float32", 2,
                         overwrite=True)  # fmt: skip
    assert again.shape == (6, 2) and zarr.open_array(str(out)).shape == (6, 2)


@pytest.mark.parametrize(
    "key, encoding, index",
    [
        ("c/1/0", ("default", "/"), (1, 0)),  # zarr v3's default
        ("c.12.3", ("default", "."), (12, 3)),
        ("4.5", ("v2", "."), (4, 5)),  # zarr v2
        ("4/5", ("v2", "/"), (4, 5)),
        ("zarr.json", ("default", "/"), None),  # metadata: the fingerprint's to catch
        ("c/1", ("default", "/"), None),  # not 2-D
        ("c/1/0", ("v2", "."), None),  # another encoding's key
        ("notes.txt", ("v2", "."), None),
        ("c/1/0.0123.partial", ("default", "/"), None),
    ],
)
def test_chunk_index(key: str, encoding: tuple[str, str], index: tuple[int, int] | None) -> None:
    from pipeline.store.signature import chunk_index

    assert chunk_index(key, encoding) == index


def test_stale_tiles_follow_shards(tmp_path: Path) -> None:
    """A changed shard of A stales every tile over its rows; one of B, every tile over its
    columns."""
    from pipeline.plan.search import plan_matmul
    from pipeline.plan.spec import ArraySpec
    from pipeline.store.journal import stale_tiles

    a = ArraySpec((1024, 64), (128, 64), "float32", shards=(512, 64))
    b = ArraySpec((64, 1024), (64, 256), "float32")
    plan = plan_matmul(a, b, workers=1, threads_per_worker=1, memory_limit_bytes=2**30,
                       tile_shape=(256, 256))  # fmt: skip
    by_a = stale_tiles(plan, {(1, 0)}, set())
    assert by_a == {t.index for t in plan.tiles() if t.rows[0] >= 512}
    by_b = stale_tiles(plan, set(), {(0, 2)})
    assert by_b == {t.index for t in plan.tiles() if t.cols == (512, 768)}


def test_stale_tiles_follow_transposed_operands() -> None:
    """Aᵀ: a changed stored A object (k, i) stales op(A)'s row band i; Bᵀ: B's (j, k) stales
    op(B)'s column band j."""
    from dataclasses import replace

    from pipeline.plan.search import plan_matmul
    from pipeline.plan.spec import ArraySpec
    from pipeline.store.journal import stale_tiles

    a = ArraySpec((1024, 64), (256, 64), "float32")  # op(A), as the planner sees it
    b = ArraySpec((64, 1024), (64, 256), "float32")
    plan = plan_matmul(a, b, workers=1, threads_per_worker=1, memory_limit_bytes=2**30,
                       tile_shape=(256, 256))  # fmt: skip
    plan = replace(plan, transposed=(True, True))
    assert stale_tiles(plan, {(0, 2)}, set()) == {t.index for t in plan.tiles() if t.index[0] == 2}
    assert stale_tiles(plan, set(), {(3, 0)}) == {t.index for t in plan.tiles() if t.index[1] == 3}

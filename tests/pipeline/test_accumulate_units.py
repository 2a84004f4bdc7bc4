"""The accumulation's protocol step by step, without a cluster: the combination of a band
(exact integers), the moves of C's objects and their way home, the state's phases and what each
leftover makes the next run do, the crash points, C's room and the flags."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import zarr
from numcodecs import Delta

from pipeline import prepare
from pipeline.accumulate import crash, originals, state
from pipeline.accumulate.flags import check_flags
from pipeline.accumulate.room import check_room_for_c, describe_room_for_c, room_for_c
from pipeline.accumulate.tasks import combine, integer_sum
from pipeline.errors import InputError, UnsafeOutputError, UsageError
from pipeline.plan.spec import OutputSpec
from pipeline.store.output import Output
from pipeline.store.owned import SIDECAR
from pipeline.store.resume import listings
from pipeline.store.space import Room
from tests.helpers import write_array
from tests.pipeline.test_accumulate_protocol import FakeStatvfs

# -- combine and integer_sum ------------------------------------------------------------------


def task(out_dtype: str, alpha: float = 1.0, beta: float = 1.0, url: str = "/c") -> Any:
    options = SimpleNamespace(alpha=alpha, beta=beta, accumulate=True)
    return SimpleNamespace(options=options, out_dtype=out_dtype, output=Output(url, {}))


@pytest.mark.parametrize(
    "dtype, terms, want",
    [
        # (C's dtype, [(factor, values)], the exact sums or None: refused)
        ("int64", [(1, [4]), (1, [2**63 - 5])], [2**63 - 1]),
        ("int64", [(1, [4]), (1, [2**63 - 4])], None),  # 2**63: float64 says it fits
        ("int64", [(-1, [4]), (1, [-(2**63) + 4])], [-(2**63)]),
        ("int64", [(-1, [4]), (1, [-(2**63) + 3])], None),
        ("uint64", [(1, [4]), (1, [2**64 - 5])], [2**64 - 1]),
        ("uint64", [(1, [4]), (1, [2**64 - 4])], None),
        ("uint64", [(1, [4]), (-1, [4])], [0]),
        ("uint64", [(1, [4]), (-1, [5])], None),
        ("int16", [(2, [3, -4]), (-1, [32761, -32760])], [-32755, 32752]),
        ("int16", [(2**31, [0]), (1, [7])], [7]),  # a large factor takes the exact path
        ("uint8", [(1, [200]), (1, [55])], [255]),
        ("uint8", [(1, [200]), (1, [56])], None),
        ("bool", [(1, [1, 0]), (1, [False, True])], [True, True]),
        ("bool", [(1, [0]), (1, [False])], [False]),
        ("bool", [(1, [1]), (1, [True])], None),
        ("int64", [(2**31, [2**32]), (1, [0])], None),  # 2**63: int64 would wrap
        ("int64", [(2**40, [2**30]), (1, [0])], None),  # small values, a factor too large
        ("int64", [(3, [2**62]), (1, [1])], None),  # a large first term, a small last one
        ("int64", [(2**30, [2**30]), (1, [1])], [2**60 + 1]),  # float64 would round
    ],
)
def test_integer_sum_is_exact(dtype: str, terms: list[Any], want: list[int] | None) -> None:
    arrays = [(f, np.array(v, dtype=dtype if i else np.int64)) for i, (f, v) in enumerate(terms)]
    value, found = integer_sum(arrays, np.dtype(dtype))
    if want is None:
        exact = [sum(f * int(x[i]) for f, x in arrays) for i in range(len(terms[0][1]))]
        assert found == (min(exact), max(exact))
        return
    assert found is None
    np.testing.assert_array_equal(value, np.array(want, dtype=dtype), strict=True)


def test_integer_sum_mixes_both_paths_element_by_element() -> None:
    """Small elements in int64, large ones in Python's integers, each where it belongs."""
    product = np.array([[1, 2], [3, 2**40]], np.int64)
    old = np.array([[10, 2**62], [30, 5]], np.int64)
    value, found = integer_sum([(1, product), (1, old)], np.dtype("int64"))
    assert found is None
    np.testing.assert_array_equal(value, [[11, 2**62 + 2], [33, 2**40 + 5]], strict=True)
    _, found = integer_sum([(3, product), (2, old)], np.dtype("int64"))
    assert found == (23, 2**63 + 6)


def test_combine_floats_and_integers() -> None:
    product, old = np.array([[1.0, 2.0]]), np.array([[10.0, 20.0]])
    np.testing.assert_array_equal(
        combine(task("float64", 2.0, -0.5), product, old), [[-3.0, -6.0]], strict=True
    )
    np.testing.assert_array_equal(combine(task("float32", 3.0), product, None), [[3.0, 6.0]])
    assert combine(task("float32", 3.0), product, None).dtype == np.float32
    same = combine(task("float64"), product, None)
    np.testing.assert_array_equal(same, product)
    got = combine(task("int16", 2, 3), np.array([[5]], np.int64), np.array([[7]], np.int16))
    np.testing.assert_array_equal(got, np.array([[31]], np.int16), strict=True)
    with pytest.raises(InputError, match=r"reaches 32768\.\.32768, beyond C's int16 range; the"):
        combine(task("int16", 1, 1), np.array([[1]], np.int64), np.array([[32767]], np.int16))


def test_combine_writes_out_s_dtype_and_scales_an_integer_product() -> None:
    """Without C_old (a plain product, or --alpha alone) the values come in OUT's dtype, and
    an integer product scaled by α is checked too."""
    half = combine(task("float16"), np.array([[1.5]], np.float32), None)
    assert half.dtype == np.float16
    scaled = combine(task("int16", 3), np.array([[5, -7]], np.int64), None)
    np.testing.assert_array_equal(scaled, np.array([[15, -21]], np.int16), strict=True)
    with pytest.raises(InputError, match=r"reaches -32769\.\.32766, beyond C's int16"):
        combine(task("int16", -1), np.array([[32769, -32766]], np.int64), None)
    with pytest.raises(InputError, match=r"reaches 32768\.\.32770, beyond"):
        combine(task("int16"), np.array([[1, 3]], np.int64), np.array([[32767, 32767]], "i2"))


def test_combine_scales_floats_in_the_products_dtype() -> None:
    """α·P and β·C_old in the accumulator's float32, as sgemm's alpha and beta would: 3 times
    (1 + 2**-24) is 3 in float32 (α rounds to 1), 3.0000002 in float64."""
    alpha = 1 + 2**-24
    got = combine(task("float32", alpha, alpha), np.array([[3.0]], np.float32),
                  np.array([[3.0]], np.float32))  # fmt: skip
    np.testing.assert_array_equal(got, np.array([[6.0]], np.float32), strict=True)
    got = combine(task("float32", alpha), np.array([[3.0]], np.float32), None)
    np.testing.assert_array_equal(got, np.array([[3.0]], np.float32), strict=True)


def test_combine_leaves_a_reused_product_buffer_alone() -> None:
    product = np.array([[1.0, 2.0]])
    combine(task("float64", 2.0, 1.0), product, np.array([[1.0, 1.0]]))
    np.testing.assert_array_equal(product, [[1.0, 2.0]])


# -- C's objects: moved aside, moved home ---------------------------------------------------


def tile_task(out: Output, accumulate: bool = True) -> Any:
    options = SimpleNamespace(alpha=1.0, beta=1.0, accumulate=accumulate)
    return SimpleNamespace(options=options, out_dtype="float64", output=out, lock_token="",
                           fingerprint="fp", store=SimpleNamespace(storage_options={}))  # fmt: skip


def test_a_task_moves_its_tile_once_and_reads_c_old_from_the_originals(tmp_path: Path) -> None:
    from pipeline.accumulate.tasks import original
    from pipeline.plan.spec import Tile

    out, c = make_c(tmp_path)
    state._write_state(out, {"fingerprint": "fp", "phase": "running"})
    (Path(out.url) / SIDECAR / "original").mkdir()
    shutil_copy(Path(out.url) / "zarr.json", Path(out.url) / SIDECAR / "original/zarr.json")
    tile = Tile((0, 1), (0, 4), (2, 4))
    assert original(tile_task(out, accumulate=False), tile) is None
    assert (Path(out.url) / "c/0/1").exists(), "nothing moves unless accumulating"
    kept = original(tile_task(out), tile)
    assert kept is not None and originals.is_saved(out, (0, 1))
    assert not (Path(out.url) / "c/0/1").exists() and (Path(out.url) / "c/0/0").exists()
    c[0:2, 2:4] = 100.0  # the task's write; C_old still reads from the originals
    np.testing.assert_array_equal(kept.rows(0, 2), [[2.0, 3.0], [6.0, 7.0]])
    np.testing.assert_array_equal(kept.rows(1, 4), [[6.0, 7.0], [-1.0, -1.0], [-1.0, -1.0]])
    again = original(tile_task(out), tile)  # a retry: the marker says they are all moved
    assert again is not None
    np.testing.assert_array_equal(again.rows(0, 1), [[2.0, 3.0]])


def shutil_copy(source: Path, target: Path) -> None:
    target.write_bytes(source.read_bytes())


def make_c(tmp_path: Path, **layout: Any) -> tuple[Output, Any]:
    url = str(tmp_path / "c.zarr")
    c = zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8", fill_value=-1.0,
                          **layout)  # fmt: skip
    c[:2, :] = np.arange(8.0).reshape(2, 4)  # the first chunk row stored, the second not
    return Output(url, {}), c


def files(out: Output) -> dict[str, bytes]:
    root = Path(out.url)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "layout, keys",
    [
        ({}, ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]),
        ({"zarr_format": 2}, ["0.0", "0.1", "1.0", "1.1"]),
    ],
)
def test_object_keys_of_a_tile(tmp_path: Path, layout: dict[str, Any], keys: list[str]) -> None:
    _, c = make_c(tmp_path, **layout)
    assert originals.object_keys(c, (0, 4), (0, 4)) == keys
    assert originals.object_keys(c, (2, 4), (0, 2)) == keys[2:3]
    with pytest.raises(AssertionError, match="not made of whole 2-objects"):
        originals.object_keys(c, (1, 4), (0, 4))
    with pytest.raises(AssertionError, match="not made of whole"):
        originals.object_keys(c, (0, 3), (0, 4))


def test_a_tile_saved_written_and_put_back(tmp_path: Path) -> None:
    out, c = make_c(tmp_path)
    before = files(out)
    keys = originals.object_keys(c, (0, 4), (0, 4))
    originals.save_tile(out, (0, 0), keys)
    side = Path(out.url) / SIDECAR
    assert not (Path(out.url) / "c/0/0").exists()
    assert (side / "original/c/0/0").read_bytes() == before["c/0/0"]
    marker = json.loads((side / "saved/tile-0-0.json").read_text())
    assert marker == {"index": [0, 0], "absent": ["c/1/0", "c/1/1"]}
    assert originals.is_saved(out, (0, 0)) and not originals.is_saved(out, (0, 1))
    assert originals.marker_name((3, 5)) == "saved/tile-3-5.json"
    originals.save_tile(out, (0, 0), keys)  # a rerun: nothing moves twice
    assert json.loads((side / "saved/tile-0-0.json").read_text())["absent"] == ["c/1/0", "c/1/1"]
    c[:] = 5.0  # the tile written: every object of it now stored in C
    assert originals.restore(out) == 2
    originals.restore(out)  # safe to repeat
    after = files(out)
    assert {k: v for k, v in after.items() if not k.startswith(SIDECAR)} == before
    assert not [k for k in after if k.startswith(f"{SIDECAR}/saved")]


def test_on_an_object_store_a_move_is_a_copy_and_a_delete(tmp_path: Path) -> None:
    """fsspec's memory file system stands for an object store: no rename, no folders. The same
    steps (save, write, put back, clean) end with C's objects as they were."""
    import uuid

    import fsspec

    url = f"memory://acc-{uuid.uuid4().hex}/c.zarr"
    c = zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8", fill_value=-1.0)
    c[:2, :] = np.arange(8.0).reshape(2, 4)
    fs, root = fsspec.filesystem("memory"), url[len("memory:/") :]
    before = {p: fs.cat_file(p) for p in fs.find(root)}
    out = Output(url + "/", {})
    keys = originals.object_keys(c, (0, 4), (0, 4))
    fs.copy(f"{root}/c/0/1", f"{root}/{SIDECAR}/original/c/0/1")  # a copy whose delete was lost
    originals.save_tile(out, (0, 0), keys)
    assert sorted(p[len(root) + 1 :] for p in fs.find(root)) == [
        f"{SIDECAR}/original/c/0/0", f"{SIDECAR}/original/c/0/1",
        f"{SIDECAR}/saved/tile-0-0.json", "zarr.json",
    ]  # fmt: skip
    assert originals.is_saved(out, (0, 0))
    assert originals.Files(out).files("nowhere") == []
    c[:] = 5.0
    assert originals.restore(out) == 2
    originals.clean(out)
    assert {p: fs.cat_file(p) for p in fs.find(root)} == before
    state._write_state(out, {"fingerprint": "f", "phase": "running"})
    assert state.read_state(out) == {"fingerprint": "f", "phase": "running", "complete": False}
    originals.save_tile(out, (0, 0), keys)
    c[:] = 6.0
    assert state.roll_back(out) == 2 and state.read_state(out) is None
    assert {p: fs.cat_file(p) for p in fs.find(root)} == before
    fs.pipe_file(f"{root}/{SIDECAR}/rolling-back", b"")  # a rollback stopped after its flag
    assert state.read_state(out) == {"phase": "rolling-back"}
    originals.clean(out)
    assert state.read_state(out) is None


def test_moves_are_on_disk_before_the_marker_and_before_the_state_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut must not leave a marker whose moves were lost: the folders the renames
    touched are synced first, then the marker is written synced; a rollback syncs C's
    folders before the state can go."""
    from pipeline.store.door import Door

    out, c = make_c(tmp_path)
    events: list[tuple[str, str]] = []
    real_sync, real_write = Door.sync_folder, Door.write

    def sync(self: Door, relpath: str = "") -> None:
        events.append(("sync", relpath))
        real_sync(self, relpath)

    def write(self: Door, name: str, data: Any, **kw: Any) -> None:
        events.append(("write" + (" synced" if kw.get("durable") else ""), name))
        real_write(self, name, data, **kw)

    monkeypatch.setattr(Door, "sync_folder", sync)
    monkeypatch.setattr(Door, "write", write)
    originals.save_tile(out, (0, 0), ["c/0/0", "c/0/1"])
    side = f"{SIDECAR}/original/c/0"
    assert sorted(events[:2]) == [("sync", side), ("sync", "c/0")]
    assert events[2] == ("write synced", f"{SIDECAR}/saved/tile-0-0.json")
    events.clear()
    originals.restore(out)
    assert ("sync", "c/0") in events


def test_a_move_killed_between_link_and_unlink(tmp_path: Path) -> None:
    """Both names one file: the rerun drops C's name and keeps the saved one; two different
    files under both names cannot be told apart and are refused."""
    out, _ = make_c(tmp_path)
    root, side = Path(out.url), Path(out.url) / SIDECAR / "original"
    (side / "c/0").mkdir(parents=True)
    os.link(root / "c/0/0", side / "c/0/0")
    originals.save_tile(out, (0, 0), ["c/0/0"])
    assert not (root / "c/0/0").exists() and (side / "c/0/0").exists()
    (side / "c/0/1").write_bytes(b"not C's")
    words = "c/0/1 and its saved original differ; the accumulation cannot tell which is C's"
    with pytest.raises(UnsafeOutputError, match=f"{words}: restore C from a copy$"):
        originals.save_tile(out, (0, 0), ["c/0/1"])


def test_an_older_versions_marker_is_refused_not_guessed(tmp_path: Path) -> None:
    """A marker that does not name the objects C did not hold (the version before wrote its
    index only, and a planted one may): guessing them from what is aside would remove C's
    own objects, so the rollback stops with the words to restore C from a copy."""
    out, c = make_c(tmp_path)
    originals.save_tile(out, (0, 1), originals.object_keys(c, (0, 4), (2, 4)))
    (Path(out.url) / SIDECAR / "saved/tile-0-1.json").write_text('{"index": [0, 1]}')
    with pytest.raises(UnsafeOutputError, match="tile-0-1.json is not a record of ours"):
        originals.restore(out)
    assert (Path(out.url) / SIDECAR / "original/c/0/1").exists()


def test_a_rollback_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No data block left: the rollback's flag is an empty file, and the rest are renames and
    removals, so C comes back as it was; the chunk folder the accumulation made goes too."""
    from pipeline.store.door import Door

    job, out, _ = begin(tmp_path)
    before = {k: v for k, v in files(out).items() if not k.startswith(SIDECAR)}
    c = zarr.open_array(out.url)
    originals.save_tile(out, (0, 0), originals.object_keys(c, (0, 4), (0, 4)))
    c[:] = 9.0  # writes c/1/0 and c/1/1, which C did not hold, in a folder c/1 it did not have
    real = Door.write

    def full(self: Door, name: str, data: Any, **kw: Any) -> None:
        if len(data):
            raise OSError(28, "No space left on device")
        real(self, name, data, **kw)

    monkeypatch.setattr(Door, "write", full)
    assert state.roll_back(out) == 2
    assert files(out) == before
    assert not (Path(out.url) / "c/1").exists()


def test_the_steps_cross_their_crash_points_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, c = make_c(tmp_path)
    steps: list[str] = []
    monkeypatch.setattr(crash, "point", steps.append)
    originals.save_tile(out, (0, 0), originals.object_keys(c, (0, 4), (0, 4)))
    assert steps == ["move.object"] * 4 + ["move.marker"]
    steps.clear()
    assert originals.restore(out) == 2
    assert steps == ["rollback.tile", "rollback.object", "rollback.object"]
    steps.clear()
    (Path(out.url) / SIDECAR / "state.json").write_text("{}")
    (Path(out.url) / SIDECAR / "inputs.json").write_text("{}")
    originals.clean(out)
    assert steps == ["clean.file", "clean.state", "clean.state"]  # the state, then the flag
    assert set(steps) | {"move.object", "rollback.tile"} <= set(crash.STEPS)


def spy_options(monkeypatch: pytest.MonkeyPatch, module: Any, names: tuple[str, ...]) -> list[Any]:
    """Each call's storage options (its last argument), passed on as none: the memory file
    system would not tell them apart."""
    seen: list[Any] = []
    for name in names:
        real = getattr(module, name)

        def spy(*args: Any, _real: Any = real, **kw: Any) -> Any:
            seen.append(args[-1])
            return _real(*args[:-1], {}, **kw)

        monkeypatch.setattr(module, name, spy)
    return seen


def test_the_users_storage_options_reach_every_read_and_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object store's credentials travel with every call (None would read anonymously)."""
    import uuid

    url = f"memory://opts-{uuid.uuid4().hex}/c.zarr"
    c = zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8")
    c[:] = 1.0
    options = {"token": "secret"}
    names = ("read_small", "write_bytes", "url_to_fs", "open_output")
    seen = spy_options(monkeypatch, originals, names)
    out = Output(url, options)
    originals.save_tile(out, (0, 0), originals.object_keys(c, (0, 4), (0, 4)))
    assert originals.is_saved(out, (0, 0))
    c[:] = 2.0
    originals.restore(out)
    assert seen and all(s is options for s in seen)


def test_a_link_in_c_is_refused_in_cs_name(tmp_path: Path) -> None:
    out, _ = make_c(tmp_path)
    (tmp_path / "elsewhere").write_bytes(b"not C's")
    (Path(out.url) / "c/0/0").unlink()
    (Path(out.url) / "c/0/0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeOutputError, match=r"^C \(.*c/0/0 is a symbolic link"):
        originals.save_tile(out, (0, 0), ["c/0/0"])
    assert (tmp_path / "elsewhere").read_bytes() == b"not C's"


def test_a_v2_c_and_a_url_ending_in_a_slash(tmp_path: Path) -> None:
    """Zarr v2's metadata (.zarray, listed first) is skipped on the way home, not the end of
    it; a C named with a trailing slash keeps its folder's names."""
    out, c = make_c(tmp_path, zarr_format=2)
    before = files(out)
    slashed = Output(out.url + "/", {})
    keys = originals.object_keys(c, (0, 4), (0, 4))
    originals.save_tile(slashed, (0, 0), keys)
    side = Path(out.url) / SIDECAR
    assert (side / "saved/tile-0-0.json").exists() and originals.is_saved(slashed, (0, 0))
    (side / "original/.zarray").write_bytes(before[".zarray"])
    c[:] = 3.0
    assert originals.restore(slashed) == 2
    assert {k: v for k, v in files(out).items() if not k.startswith(SIDECAR)} == before


def test_a_half_moved_tile_goes_home_without_a_marker(tmp_path: Path) -> None:
    out, c = make_c(tmp_path)
    before = files(out)
    originals.save_tile(out, (0, 0), ["c/0/0"])
    (Path(out.url) / SIDECAR / "saved/tile-0-0.json").unlink()  # killed before the marker
    assert originals.restore(out) == 1
    assert {k: v for k, v in files(out).items() if not k.startswith(SIDECAR)} == before


def test_a_marker_that_is_not_ours_stops_the_rollback(tmp_path: Path) -> None:
    out, _ = make_c(tmp_path)
    planted = (
        b"[1]", b'{"absent": []}', b"not json", b'{"index": [0, 0], "absent": "c/0/0"}',
        b'{"index": [0, 0], "absent": [1]}', b'{"index": [0, 0], "absent": ["zarr.json"]}',
        b'{"index": [0, 0], "absent": ["c/0/2"]}', b'{"index": [0, 0], "absent": ["c/0/0/x"]}',
    )  # fmt: skip
    for bad in planted:
        (Path(out.url) / SIDECAR / "saved").mkdir(parents=True, exist_ok=True)
        (Path(out.url) / SIDECAR / "saved/tile-0-0.json").write_bytes(bad)
        with pytest.raises(UnsafeOutputError, match=rf"^C \({out.url}\): the accumulation's "
                           r".*saved/tile-0-0\.json is not a record of ours .* C cannot be "
                           "rolled back safely: restore C from a copy$"):  # fmt: skip
            originals.restore(out)
        assert (Path(out.url) / "c/0/0").exists() and (Path(out.url) / "zarr.json").exists()


def test_a_planted_original_that_is_not_a_chunk_of_c_stops_the_rollback(tmp_path: Path) -> None:
    """Only C's own chunk keys come home: a file planted as original/x.zarr.json is not moved
    over anything of C's."""
    out, _ = make_c(tmp_path)
    (Path(out.url) / SIDECAR / "original/c/9").mkdir(parents=True)
    (Path(out.url) / SIDECAR / "original/c/9/9").write_bytes(b"planted")
    with pytest.raises(UnsafeOutputError, match=rf"^C \({out.url}\): .*original/c/9/9 is not"):
        originals.restore(out)
    assert not (Path(out.url) / "c/9").exists()


def test_clean_removes_the_state_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, c = make_c(tmp_path)
    originals.save_tile(out, (0, 0), originals.object_keys(c, (0, 4), (0, 4)))
    (Path(out.url) / SIDECAR / "state.json").write_text("{}")
    removed: list[str] = []
    real = originals.Files.remove

    def remove(self: originals.Files, name: str) -> None:
        removed.append(name)
        real(self, name)

    monkeypatch.setattr(originals.Files, "remove", remove)
    (Path(out.url) / "c/7").mkdir()  # C's own empty folder: not the accumulation's to remove
    originals.clean(out)
    assert (Path(out.url) / "c/7").is_dir()
    assert removed[-2:] == [f"{SIDECAR}/state.json", f"{SIDECAR}/rolling-back"]
    assert len(removed) == 5
    assert not (Path(out.url) / SIDECAR).exists()
    assert (Path(out.url) / "zarr.json").exists()


# -- the state and what a leftover makes the next run do ------------------------------------


def job_of(tmp_path: Path) -> Any:
    a = write_array(tmp_path / "a.zarr", np.ones((4, 2)), (2, 2))
    b = write_array(tmp_path / "b.zarr", np.ones((2, 4)), (2, 2))
    make_c(tmp_path)
    return prepare(a, b, str(tmp_path / "c.zarr"), accumulate=True)


def begin(tmp_path: Path, *, resume: bool = False, fp: str = "fp") -> tuple[Any, Output, Any]:
    job = job_of(tmp_path) if not (tmp_path / "a.zarr").exists() else job_of_again(tmp_path)
    out = job.output
    state.start(out, job.plan, fp, listings(job.store), job.key_encodings, resume=resume)
    return job, out, state.read_state(out)


def job_of_again(tmp_path: Path) -> Any:
    c = str(tmp_path / "c.zarr")
    return prepare(str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), c, accumulate=True)


def test_start_commits_the_state_last(tmp_path: Path) -> None:
    job, out, st = begin(tmp_path)
    assert st is not None
    assert st["phase"] == "running" and st["fingerprint"] == "fp" and st["complete"] is False
    assert st["tile_shape"] == list(job.plan.tile_shape)
    side = Path(out.url) / SIDECAR
    assert (side / "inputs.json").exists()
    assert (side / "original/zarr.json").read_bytes() == (Path(out.url) / "zarr.json").read_bytes()
    assert state.snapshot(out)["tile_shape"] == list(job.plan.tile_shape)


def test_an_unfinished_accumulation_is_resumed_only_as_started(tmp_path: Path) -> None:
    job, out, _ = begin(tmp_path)
    now = listings(job.store)
    with pytest.raises(UsageError, match="unfinished accumulation .* and --resume"):
        state.start(out, job.plan, "fp", now, job.key_encodings, resume=False)
    with pytest.raises(UsageError, match="started with other inputs, tiling, --alpha or --beta"):
        state.start(out, job.plan, "other", now, job.key_encodings, resume=True)
    assert state.start(out, job.plan, "fp", now, job.key_encodings, resume=True) == set()
    state.finish(out)
    assert not (Path(out.url) / SIDECAR).exists()
    with pytest.raises(UsageError, match="no unfinished accumulation"):
        state.start(out, job.plan, "fp", now, job.key_encodings, resume=True)


@pytest.mark.parametrize(
    "document, phase",
    [
        ({"fingerprint": "f", "complete": True}, "complete"),  # an older version's
        ({"fingerprint": "f", "complete": False}, "running"),
        ({"fingerprint": "f", "phase": "rolling-back"}, "rolling-back"),
        ({"fingerprint": "f", "phase": "sideways"}, "running"),
        ([1, 2], "running"),
    ],
)
def test_read_state_phases(tmp_path: Path, document: Any, phase: str) -> None:
    out, _ = make_c(tmp_path)
    (Path(out.url) / SIDECAR).mkdir()
    (Path(out.url) / SIDECAR / "state.json").write_text(json.dumps(document))
    assert state.read_state(out)["phase"] == phase  # type: ignore[index]
    (Path(out.url) / SIDECAR / "state.json").write_text("{torn")
    assert state.read_state(out) == {"fingerprint": None, "phase": "running", "torn": True}


def test_roll_back_puts_c_back_and_a_killed_one_is_finished(tmp_path: Path) -> None:
    job, out, _ = begin(tmp_path)
    before = {k: v for k, v in files(out).items() if not k.startswith(SIDECAR)}
    c = zarr.open_array(out.url)
    originals.save_tile(out, (0, 0), originals.object_keys(c, (0, 4), (0, 4)))
    c[:] = 9.0
    st = state.read_state(out)
    (Path(out.url) / SIDECAR / "state.json").write_text(json.dumps({**st, "phase": "rolling-back"}))
    assert state.settle(out) is None  # a later run finishes the rollback
    assert {k: v for k, v in files(out).items() if k != "lock.json"} == before
    assert state.roll_back(out) == 0  # nothing to roll back
    begin(tmp_path)
    originals.save_tile(out, (0, 0), originals.object_keys(c, (0, 4), (0, 4)))
    c[:] = 9.0
    assert state.roll_back(out) == 2
    assert {k: v for k, v in files(out).items() if k != "lock.json"} == before


def test_settle_finishes_a_complete_ones_cleanup(tmp_path: Path) -> None:
    job, out, _ = begin(tmp_path)
    st = state.read_state(out)
    (Path(out.url) / SIDECAR / "state.json").write_text(json.dumps({**st, "phase": "complete"}))
    assert state.settle(out) is None
    assert not (Path(out.url) / SIDECAR).exists()
    assert state.snapshot(out)["accumulation"] is None


def test_a_folder_without_a_state(tmp_path: Path) -> None:
    out, _ = make_c(tmp_path)
    side = Path(out.url) / SIDECAR
    (side / "original").mkdir(parents=True)
    (side / "inputs.json").write_text("{}")
    (side / "original/zarr.json").write_text("{}")
    (side / "original/.zarray").write_text("{}")
    assert state.settle(out) is None and not side.exists()  # a start killed before its state
    (side / "journal").mkdir(parents=True)
    assert state.settle(out) is None and not side.exists()  # empty folders only
    (side / "original/c/0").mkdir(parents=True)
    (side / "original/c/0/0").write_text("C's")
    with pytest.raises(UnsafeOutputError, match=r"no state\.json but 1 other file\(s\) \(e\.g\."):
        state.settle(out)
    assert (side / "original/c/0/0").exists()


# -- crash points -------------------------------------------------------------------------------


def test_a_crash_point_fires_on_its_nth_hit_in_any_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append(("group", pid, sig)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("leader", pid, sig)))
    monkeypatch.setattr(crash.time, "sleep", lambda s: None)
    crash.point("move.object")  # off: nothing set
    monkeypatch.setenv(crash.COUNT, str(tmp_path / "hits"))
    monkeypatch.setenv(crash.AT, "move.object:3:KILL")
    for step in ("move.object", "move.marker", "move.object"):
        crash.point(step)
    assert sent == [] and (tmp_path / "hits").stat().st_size == 2
    crash.point("move.object")
    assert sent == [("group", os.getpgid(0), signal.SIGKILL)]
    crash.point("move.object")
    assert len(sent) == 1, "once only"
    monkeypatch.setenv(crash.AT, "clean.state:5:TERM")
    crash.point("clean.state")  # the 5th byte of the same counter
    assert sent[-1] == ("leader", os.getpgid(0), signal.SIGTERM)
    assert set(crash.STEPS) >= {"begin.state", "rollback.object", "clean.state"}


# -- room and flags -----------------------------------------------------------------------------


def test_room_for_c(tmp_path: Path) -> None:
    url = str(tmp_path / "raw.zarr")
    zarr.create_array(url, shape=(10, 10), chunks=(5, 5), dtype="f4", compressors=None)
    room = room_for_c(Output(url, {}))
    assert room is not None and room.needed == 400 and not room.compressed
    packed = str(tmp_path / "zstd.zarr")
    zarr.create_array(packed, data=np.zeros((10, 10), "f4"), chunks=(5, 5))
    room = room_for_c(Output(packed, {}))
    stored_bytes = sum(p.stat().st_size for p in Path(packed).rglob("*") if p.is_file())
    assert room is not None and room.compressed and room.needed == stored_bytes
    assert room_for_c(Output("memory://c.zarr", {})) is None
    check_room_for_c(Room(100, False, 100, "/x"), "/x")  # just fits
    check_room_for_c(Room(100, False, None, "/x"), "/x")  # not known
    check_room_for_c(None, "/x")
    with pytest.raises(UsageError, match=r"needs about 101 B free \(C's whole size.* free 1 B"):
        check_room_for_c(Room(101, False, 100, "/x"), "/x")
    with pytest.raises(UsageError, match="what C's compressed objects take now"):
        check_room_for_c(Room(101, True, 100, "/x"), "/x")
    assert describe_room_for_c(Room(101, False, 100, "/x")).endswith(": does not fit, 1 B short")
    assert "free space not known" in describe_room_for_c(Room(1, True, None, "/x"))


LAYOUT = OutputSpec(None, None, None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": float("nan")}, "--alpha nan is not a finite number"),
        ({"beta": float("inf"), "accumulate": True}, "--beta inf is not a finite number"),
        ({"beta": 2.0}, "--beta scales C's old values: it needs --accumulate"),
        ({"accumulate": True, "overwrite": True}, "pick one"),
        ({"accumulate": True, "layout": OutputSpec("f4", None, None)}, "drop --dtype"),
        ({"accumulate": True, "layout": OutputSpec(None, (2, 2), None)}, "drop --chunks"),
        ({"accumulate": True, "layout": OutputSpec(None, None, (2, 2))}, "drop --shards"),
    ],
)
def test_flags_refused(kwargs: dict[str, Any], match: str) -> None:
    given = {"accumulate": False, "alpha": 1.0, "beta": None, "overwrite": False,
             "verify": False, "layout": LAYOUT, **kwargs}  # fmt: skip
    with pytest.raises(UsageError, match=match):
        check_flags(**given)


def test_flags_beta_defaults() -> None:
    base = {"alpha": 1.0, "overwrite": False, "verify": False, "layout": LAYOUT}
    assert check_flags(accumulate=True, beta=None, **base) == 1.0
    assert check_flags(accumulate=True, beta=-0.5, **base) == -0.5
    assert check_flags(accumulate=False, beta=None, **base) == 0.0


def test_the_state_steps_cross_their_crash_points_and_commit_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped right after each commit point, the state on disk says what was reached."""
    steps: list[str] = []

    def stop_at(wanted: str) -> Any:
        def point(step: str) -> None:
            steps.append(step)
            if step == wanted:
                raise KeyboardInterrupt(step)

        return point

    monkeypatch.setattr(crash, "point", stop_at("begin.state"))
    with pytest.raises(KeyboardInterrupt):
        _, out, _ = begin(tmp_path)
    out = Output(str(tmp_path / "c.zarr"), {})
    assert steps == ["begin.listings", "begin.state"]
    assert state.read_state(out)["phase"] == "running"  # type: ignore[index]
    monkeypatch.setattr(crash, "point", stop_at("finish.complete"))
    with pytest.raises(KeyboardInterrupt):
        state.finish(out)
    assert state.read_state(out)["phase"] == "complete"  # type: ignore[index]
    assert state.read_state(out)["complete"] is True  # type: ignore[index]
    monkeypatch.setattr(crash, "point", stop_at("rollback.state"))
    (Path(out.url) / SIDECAR / "state.json").write_text('{"fingerprint": "f"}')
    with pytest.raises(KeyboardInterrupt):
        state.roll_back(out)
    assert state.read_state(out) == {"fingerprint": "f", "phase": "rolling-back"}
    assert (Path(out.url) / SIDECAR / "rolling-back").read_bytes() == b""
    (Path(out.url) / SIDECAR / "state.json").unlink()  # a cleanup stopped before the flag went
    assert state.read_state(out) == {"phase": "rolling-back"}
    assert state.settle(out) is None and not (Path(out.url) / SIDECAR).exists()


def test_the_state_is_written_synced_through_cs_door(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.store.door import Door

    out, _ = make_c(tmp_path)
    calls: list[tuple[str, str, Any]] = []
    real = Door.write

    def write(self: Door, name: str, data: Any, **kw: Any) -> None:
        calls.append((self.what, name, kw.get("durable")))
        real(self, name, data, **kw)

    monkeypatch.setattr(Door, "write", write)
    state._write_state(out, {"phase": "running"})
    assert calls == [("C", f"{SIDECAR}/state.json", True)]
    state.roll_back(out)
    assert calls[1] == ("C", f"{SIDECAR}/rolling-back", True)
    state._write_state(out, {"phase": "running"})
    monkeypatch.undo()
    (Path(out.url) / SIDECAR / "state.json").unlink()
    (Path(out.url) / SIDECAR / "state.json").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeOutputError, match=r"^C \("):
        state._write_state(out, {"phase": "running"})
    assert not (tmp_path / "elsewhere").exists()


def test_the_state_passes_the_users_storage_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    url = f"memory://state-{uuid.uuid4().hex}/c.zarr"
    zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8")
    options = {"token": "secret"}
    seen = spy_options(monkeypatch, state, ("read_json", "write_bytes", "open_output"))
    out = Output(url, options)
    state._write_state(out, {"fingerprint": "f", "phase": "running"})
    assert state.read_state(out) is not None and state.snapshot(out)["accumulation"]
    assert state.sidecar(out).storage_options is options
    assert len(seen) >= 3 and all(s is options for s in seen)


def test_snapshot_tells_a_changed_c(tmp_path: Path) -> None:
    out, c = make_c(tmp_path)
    first = state.snapshot(out)
    assert first == state.snapshot(out) and first["accumulation"] is None
    assert '"shape": [4, 4]' in first["metadata"]
    c.attrs["note"] = "changed"
    assert state.snapshot(out) != first


def test_the_words_of_the_refusals_and_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job, out, _ = begin(tmp_path)
    now = listings(job.store)
    with pytest.raises(UsageError) as refused:
        state.start(out, job.plan, "fp", now, job.key_encodings, resume=False)
    assert str(refused.value) == (
        f"C ({out.url}) holds an unfinished accumulation (some tiles are updated, others not); "
        "finish it with the same command and --resume (each product is added exactly once); "
        "C reads right only after that"
    )
    st = state.read_state(out)
    (Path(out.url) / SIDECAR / "state.json").write_text(json.dumps({**st, "phase": "complete"}))
    with caplog.at_level("INFO", logger="pipeline"), pytest.raises(UsageError) as nothing:
        state.start(out, job.plan, "fp", now, job.key_encodings, resume=True)
    assert str(nothing.value) == (
        f"--resume: the last accumulation into C ({out.url}) had finished (its folder is now "
        "removed): C holds its new values, nothing is left to resume; adding the product "
        "again is a new --accumulate, without --resume"
    )
    with pytest.raises(UsageError) as nothing:
        state.start(out, job.plan, "fp", now, job.key_encodings, resume=True)
    assert str(nothing.value) == (
        f"--resume: C ({out.url}) has no unfinished accumulation (the last one finished or was "
        "rolled back, or none started); rerun without --resume to add the product"
    )
    said = [r.getMessage() for r in caplog.records]
    assert f"removing the folder of a finished accumulation into C ({out.url})" in said
    begin(tmp_path)
    (Path(out.url) / SIDECAR / "state.json").write_text('{"phase": "rolling-back"}')
    with caplog.at_level("INFO", logger="pipeline"):
        state.settle(out)
    said = [r.getMessage() for r in caplog.records]
    assert f"finishing the rollback of a failed accumulation into C ({out.url})" in said
    (Path(out.url) / SIDECAR / "saved").mkdir(parents=True)
    (Path(out.url) / SIDECAR / "saved/tile-0-0.json").write_text("{}")
    with pytest.raises(UnsafeOutputError, match=rf"\(rm -r {out.url}/{SIDECAR}\); otherwise"):
        state.settle(Output(out.url + "/", {}))


def test_resume_after_a_finished_or_rolled_back_one_says_which(tmp_path: Path) -> None:
    """Never the advice to run it again without --resume when it had finished: that adds the
    product twice."""
    job, out, _ = begin(tmp_path)
    now = listings(job.store)
    st = state.read_state(out)
    (Path(out.url) / SIDECAR / "state.json").write_text(json.dumps({**st, "phase": "complete"}))
    with pytest.raises(UsageError, match="had finished .* nothing is left to resume"):
        state.start(out, job.plan, "fp", now, job.key_encodings, resume=True)
    begin(tmp_path)
    (Path(out.url) / SIDECAR / "rolling-back").write_bytes(b"")
    with pytest.raises(UsageError, match="failed and is now rolled back: C holds its values"):
        state.start(out, job.plan, "fp", now, job.key_encodings, resume=True)


@pytest.mark.parametrize("planted", [b"[1, 2]", b"{not json", None])
def test_a_state_that_is_not_ours_is_refused_with_the_way_out(
    tmp_path: Path, planted: bytes | None
) -> None:
    job, out, _ = begin(tmp_path)
    path = Path(out.url) / SIDECAR / "state.json"
    path.unlink()
    if planted is None:
        path.mkdir()
    else:
        path.write_bytes(planted)
    slashed = Output(out.url + "/", {})
    with pytest.raises(UnsafeOutputError) as refused:
        state.start(slashed, job.plan, "fp", listings(job.store), job.key_encodings, resume=True)
    assert str(refused.value) == (
        f"C ({out.url}/) holds {SIDECAR}/state.json that is not an accumulation's state (not "
        "JSON of ours, a folder, or too large): it cannot be told what C holds; if no "
        f"accumulation into C is running or was stopped, remove the folder (rm -r "
        f"{out.url}/{SIDECAR}) after checking C, or restore C from a copy"
    )


def test_a_malformed_crash_point_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "killpg", lambda *a: pytest.fail("fired"))
    monkeypatch.setenv(crash.COUNT, str(tmp_path / "hits"))
    for wanted in ("move.object", "move.object:x:KILL", "move.object:1:NOPE", "move.object:1"):
        monkeypatch.setenv(crash.AT, wanted)
        crash.point("move.object")


@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_a_whole_factor_past_2_53_is_refused_for_an_integer_c(tmp_path: Path, name: str) -> None:
    a = write_array(tmp_path / "a.zarr", np.ones((4, 2), np.int8), (2, 2))
    b = write_array(tmp_path / "b.zarr", np.ones((2, 4), np.int8), (2, 2))
    zarr.create_array(str(tmp_path / "c.zarr"), data=np.ones((4, 4), "int64"), chunks=(2, 2))
    factors = {"alpha": 1.0, "beta": 1.0, name: float(2**53 + 2)}
    with pytest.raises(UsageError, match=rf"{name}=9007199254740994 is past 2\*\*53, where"):
        prepare(a, b, str(tmp_path / "c.zarr"), accumulate=True, **factors)
    prepare(a, b, str(tmp_path / "c.zarr"), accumulate=True, beta=float(2**53))  # exact


def test_beta_scales_c_old_in_the_products_dtype() -> None:
    beta = 1 + 2**-24  # 1 in float32: 3 stays 3 (3.0000002 in float64)
    got = combine(task("float32", 1.0, beta), np.array([[0.0]], np.float32),
                  np.array([[3.0]], np.float32))  # fmt: skip
    np.testing.assert_array_equal(got, np.array([[3.0]], np.float32), strict=True)


def test_a_stopped_jobs_task_moves_nothing(tmp_path: Path) -> None:
    """A task whose job no longer holds C's lock (its token is not the lock's) is fenced out
    before it moves one object."""
    from pipeline.accumulate.tasks import original
    from pipeline.plan.spec import Tile

    out, _ = make_c(tmp_path)
    spec = tile_task(out)
    spec.lock_token = "a-job-that-stopped"
    with pytest.raises(UnsafeOutputError, match="no longer holds OUT's lock"):
        original(spec, Tile((0, 0), (0, 4), (0, 4)))
    assert (Path(out.url) / "c/0/0").exists() and not (Path(out.url) / SIDECAR).exists()


def test_room_for_c_by_its_codecs_and_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter alone makes C's objects' size unknown beforehand (their stored bytes are the
    estimate, the accumulation's own folder left out); the free space is statvfs' f_bavail."""
    url = str(tmp_path / "delta.zarr")
    zarr.create_array(url, data=np.arange(100.0).reshape(10, 10), chunks=(5, 5),
                      zarr_format=2, filters=[Delta(dtype="f8")], compressors=None)  # fmt: skip
    (Path(url) / SIDECAR).mkdir()
    (Path(url) / SIDECAR / "state.json").write_bytes(b"x" * 10_000)
    monkeypatch.setattr(os, "statvfs", lambda p: FakeStatvfs(12345, 99))
    room = room_for_c(Output(url, {}))
    stored = sum(p.stat().st_size for p in Path(url).rglob("*")
                 if p.is_file() and SIDECAR not in p.parts)  # fmt: skip
    assert room == Room(stored, True, 12345, url)
    monkeypatch.setattr(os, "statvfs", lambda p: (_ for _ in ()).throw(OSError("gone")))
    assert room_for_c(Output(url, {})).free is None  # type: ignore[union-attr]
    raw = Room(1536, False, 2048, "/data")
    assert describe_room_for_c(raw) == (
        "1.5 KiB more while the accumulation runs (C's originals are kept until it ends); "
        "2.0 KiB free at /data"
    )
    assert describe_room_for_c(Room(2048, True, 2048, "/d")).startswith("about 2.0 KiB more")
    assert describe_room_for_c(Room(2048, True, 2048, "/d")).endswith("2.0 KiB free at /d")
    assert describe_room_for_c(Room(3072, False, 2048, "/d")) == (
        "3.0 KiB more while the accumulation runs (C's originals are kept until it ends); "
        "2.0 KiB free at /d: does not fit, 1.0 KiB short"
    )


def specs(m: int = 4, k: int = 2, n: int = 4, dtype: str = "float64") -> tuple[Any, Any]:
    from pipeline.plan.spec import ArraySpec

    return ArraySpec((m, k), (2, 2), dtype), ArraySpec((k, n), (2, 2), dtype)


def test_target_reads_cs_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """C's dtype, chunks, shards and format are OUT's; the snapshot is compared again later;
    the user's storage options reach every open."""
    from pipeline.accumulate import flags

    url = str(tmp_path / "c.zarr")
    zarr.create_array(url, shape=(4, 4), chunks=(1, 2), shards=(2, 4), dtype="f4")
    options: dict[str, Any] = {}
    seen: list[Any] = []
    for module, name in ((flags, "url_to_fs"), (flags.inputs, "open_input")):
        real = getattr(module, name)

        def spy(url: str, opts: Any, *rest: Any, _real: Any = real) -> Any:
            seen.append(opts)
            return _real(url, opts, *rest)

        monkeypatch.setattr(module, name, spy)
    snap, layout = flags.target(Output(url, options), *specs(), 1.0, 1.0)
    assert layout == OutputSpec("float32", (1, 2), (2, 4), 3, accumulate=True)
    assert snap["accumulation"] is None and '"float32"' in snap["metadata"]
    assert seen == [options, options]
    plain = str(tmp_path / "plain.zarr")
    zarr.create_array(plain, shape=(4, 4), chunks=(2, 2), dtype="i8", zarr_format=2)
    _, layout = flags.target(Output(plain, {}), *specs(dtype="int8"), 3.0, 1.0)
    assert layout == OutputSpec("int64", (2, 2), None, 2, accumulate=True)


def test_target_refusals(tmp_path: Path) -> None:
    from pipeline.accumulate import flags
    from pipeline.errors import IntegerOverflowError

    missing = str(tmp_path / "nowhere.zarr")
    with pytest.raises(InputError, match=rf"^--accumulate: C \({missing}\) does not exist; it "
                       r"must be an existing Zarr array \(drop --accumulate to write a new "
                       r"product\)$"):  # fmt: skip
        flags.target(Output(missing, {}), *specs(), 1.0, 1.0)
    url = str(tmp_path / "c.zarr")
    zarr.create_array(url, shape=(4, 5), chunks=(2, 2), dtype="f8")
    with pytest.raises(InputError, match=rf"^--accumulate: C \({url}\) is 4x5, but A @ B is "
                       r"3x6; give a C of the product's shape$"):  # fmt: skip
        flags.target(Output(url, {}), *specs(m=3, n=6), 1.0, 1.0)
    small = str(tmp_path / "small.zarr")
    zarr.create_array(small, shape=(4, 4), chunks=(2, 2), dtype="i1")
    with pytest.raises(IntegerOverflowError, match=r"3·\(int8 @ int8 over K=7\) can reach"):
        flags.target(Output(small, {}), *specs(k=7, dtype="int8"), 3.0, 1.0)
    with pytest.raises(UsageError, match="--beta 0.5 is not a whole number"):
        flags.target(Output(small, {}), *specs(k=1, dtype="int8"), 1.0, 0.5)
    with pytest.raises(UsageError, match=r"C \(i1\) would truncate a float64 @ int8|truncate"):
        flags.target(Output(small, {}), specs()[0], specs(dtype="int8")[1], 1.0, 1.0)


@pytest.mark.parametrize("odd", ["link", "fifo"])
def test_target_refuses_links_and_special_files_in_c(tmp_path: Path, odd: str) -> None:
    from pipeline.accumulate import flags

    url = str(tmp_path / "c.zarr")
    zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8")
    (Path(url) / "c").mkdir()
    for name in ("c/9", "c/8"):  # two of them: the first by name is named, both counted
        if odd == "link":
            (Path(url) / name).symlink_to(tmp_path)
        else:
            os.mkfifo(Path(url) / name)
    what = "a symbolic link" if odd == "link" else "a special file"
    with pytest.raises(UnsafeOutputError, match=rf"^--accumulate: C \({url}\) holds {what} at "
                       r"c/8 \(2 such in all\); C's chunks are rewritten in place, only inside "
                       r"C's own folders: copy C without links \(e\.g\. cp -rL\) and accumulate "
                       "into the copy$"):  # fmt: skip
        flags.target(Output(url, {}), *specs(), 1.0, 1.0)


def test_flags_refusal_words() -> None:
    base = {"alpha": 1.0, "overwrite": False, "verify": False, "layout": LAYOUT}
    with pytest.raises(UsageError) as beta:
        check_flags(accumulate=False, beta=2.0, **base)
    assert str(beta.value) == "--beta scales C's old values: it needs --accumulate"
    with pytest.raises(UsageError) as both:
        check_flags(accumulate=True, beta=None, **{**base, "overwrite": True})
    assert str(both.value) == (
        "--accumulate adds into C's values and --overwrite would replace them; pick one"
    )


def test_the_crash_counter_is_the_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(crash.COUNT, str(tmp_path / "hits"))
    monkeypatch.setenv(crash.AT, "move.object:9:KILL")
    crash.point("move.object")
    assert (tmp_path / "hits").stat().st_mode & 0o777 == 0o600


def test_a_c_that_is_not_2d_cannot_be_rolled_back(tmp_path: Path) -> None:
    url = str(tmp_path / "c1.zarr")
    zarr.create_array(url, shape=(4,), chunks=(2,), dtype="f8")
    with pytest.raises(UnsafeOutputError, match=rf"^C \({url}\) is not a 2-D array: it cannot"):
        originals.restore(Output(url, {}))


def test_target_names_c_in_what_it_cannot_read(tmp_path: Path) -> None:
    from pipeline.accumulate import flags
    from pipeline.errors import PipelineError

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("not an array")
    with pytest.raises(PipelineError, match=rf"^C \({folder}\) holds no Zarr array"):
        flags.target(Output(str(folder), {}), *specs(), 1.0, 1.0)
    packed = str(tmp_path / "packed.zarr")
    zarr.create_array(packed, shape=(4, 4), chunks=(2, 2), dtype="i2",
                      attributes={"scale_factor": 0.1})  # fmt: skip
    with pytest.raises(InputError, match=rf"^C \({packed}\)"):
        flags.target(Output(packed, {}), *specs(dtype="int8"), 1.0, 1.0)


def test_the_words_for_a_factor_past_2_53() -> None:
    from pipeline.accumulate.flags import _check_whole_factors

    _check_whole_factors("float64", 2.0**60, 1.0)  # a float C takes any finite factor
    with pytest.raises(UsageError) as refused:
        _check_whole_factors("uint8", 1.0, -(2.0**54))
    assert str(refused.value) == (
        "--beta -18014398509481984 is past 2**53, where a float no longer holds every whole "
        "number (what was typed may not be what is read); C is uint8: scale in two steps, or "
        "accumulate into a float64 C"
    )


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_c_whose_name_ends_in_a_letter_a_strip_could_take(tmp_path: Path, where: str) -> None:
    """Only slashes are stripped from C's name: MATRIX keeps its X."""
    import uuid

    base = str(tmp_path) if where == "local" else f"memory://x-{uuid.uuid4().hex}"
    url = f"{base}/MATRIX"
    c = zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8")
    c[:] = 1.0
    out = Output(url + "/", {})
    originals.save_tile(out, (0, 0), ["c/0/0"])
    assert originals.is_saved(out, (0, 0))
    assert originals.Files(out).files(f"{SIDECAR}/original") == [f"{SIDECAR}/original/c/0/0"]
    state._write_state(out, {"fingerprint": "f", "phase": "running"})
    assert state.read_state(Output(url, {}))["fingerprint"] == "f"  # type: ignore[index]
    assert state.sidecar(out).url == f"{url}/{SIDECAR}"


def test_an_object_store_rollback_stopped_after_its_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    url = f"memory://flag-{uuid.uuid4().hex}/c.zarr"
    zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8")
    out = Output(url, {})
    state._write_state(out, {"fingerprint": "f", "phase": "running"})

    def stop(step: str) -> None:
        if step == "rollback.state":
            raise KeyboardInterrupt(step)

    monkeypatch.setattr(crash, "point", stop)
    with pytest.raises(KeyboardInterrupt):
        state.roll_back(out)
    assert state.read_state(out) == {"fingerprint": "f", "complete": False, "phase": "rolling-back"}

"""OUT's one owner (pipeline/store/output.py) method by method on local folders, without a
cluster or a job: what it refuses (and the words the user reads), what it creates, what it
writes and removes. Fast enough to mutation-test (benchmarks/mutate.py, target output)."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import dask.config
import fsspec
import numcodecs
import numpy as np
import pytest
import zarr
from fsspec.implementations.memory import MemoryFileSystem
from zarr.codecs import BloscCodec

from pipeline.errors import OutputExistsError, UnsafeOutputError, UsageError
from pipeline.plan.spec import ArraySpec
from pipeline.store import door
from pipeline.store import output as output_module
from pipeline.store.output import ATTRS_KEY, Output, output_compressors
from tests.helpers import write_array

TILED = {"tile_shape": [2, 3]}
"""Our record's tile shape: which journal entries an array of ours may hold."""


def ours(tmp_path: Path, name: str = "out.zarr", **attributes: Any) -> Output:
    """One of our arrays (4x6 float32 in 2x3 chunks) at ``tmp_path/name``."""
    out = Output(str(tmp_path / name))
    out.create((4, 6), (2, 3), "float32", {"fingerprint": "f0", **TILED, **attributes})
    return out


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# --- where OUT may be ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "inputs", "name", "given"),
    [
        ("a.zarr", ["a.zarr", "b.zarr"], "A", "a.zarr"),  # the same path
        ("b.zarr/sub", ["a.zarr", "b.zarr"], "B", "b.zarr"),  # inside an input
        ("data", ["a.zarr", "b.zarr", "data/c.zarr"], "C", "data/c.zarr"),  # containing one
        ("x/../a.zarr", ["a.zarr"], "A", "a.zarr"),  # another spelling of the same path
    ],
)
def test_out_overlapping_an_input_is_refused(
    tmp_path: Path, out: str, inputs: list[str], name: str, given: str
) -> None:
    (tmp_path / "x").mkdir()
    urls = [str(tmp_path / u) for u in inputs]
    target = str(tmp_path / out)
    want = (
        f"OUT ({target}) overlaps input {name} ({tmp_path / given}); inputs are never "
        "written: choose an OUT path outside every input"
    )
    with pytest.raises(UnsafeOutputError, match=f"^{re.escape(want)}$"):
        Output(target).check_path(urls)


def test_out_beside_the_inputs_is_accepted(tmp_path: Path) -> None:
    inputs = [str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), str(tmp_path / "c")]
    Output(str(tmp_path / "a.zarr2")).check_path(inputs)  # a longer name, not inside
    Output(str(tmp_path / "c.zarr")).check_path(inputs)


def test_out_as_an_archive_or_unknown_protocol_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"is an archive, which can't take concurrent writers"):
        Output(str(tmp_path / "out.zip")).check_path([])
    with pytest.raises(UsageError, match=r"^OUT \(nosuch://bucket/out.zarr\) has the unknown"):
        Output("nosuch://bucket/out.zarr").check_path([])


def test_out_beside_two_inputs_is_accepted(tmp_path: Path) -> None:
    """A and B only (no C): the names run out before the inputs do, or the other way."""
    Output(str(tmp_path / "c.zarr")).check_path([str(tmp_path / "a"), str(tmp_path / "b")])
    Output(str(tmp_path / "c.zarr")).check_path([])


# --- what is there -------------------------------------------------------------------------


def test_state_of_nothing_and_of_a_folder_holding_only_a_lock(tmp_path: Path) -> None:
    out = Output(str(tmp_path / "out.zarr"))
    assert out.state() is None
    (tmp_path / "out.zarr").mkdir()
    assert out.state() is None  # empty
    (tmp_path / "out.zarr" / "lock.json").write_text("{}")
    assert out.state() is None  # killed before creating the array (the lock checks its own)
    (tmp_path / "out.zarr" / "inputs.json").write_text("{}")
    with pytest.raises(UnsafeOutputError, match=r"holds inputs.json, lock.json"):
        out.state()  # listings are written after the array: without one, they are not ours


@pytest.mark.parametrize("names", [["lock.jsonX"], ["inputs.json "], ["lock.json", "c"]])
def test_a_folder_holding_more_than_a_lock_is_not_empty(tmp_path: Path, names: list[str]) -> None:
    path = tmp_path / "out.zarr"
    path.mkdir()
    for name in names:
        (path / name).write_text("{}")
    with pytest.raises(UnsafeOutputError, match="is not a Zarr array written by this tool"):
        Output(str(path)).state()


def test_state_of_our_array_is_its_attributes(tmp_path: Path) -> None:
    out = ours(tmp_path, complete=False)
    assert out.state() == {"fingerprint": "f0", "complete": False, **TILED}


@pytest.mark.parametrize("what", ["foreign array", "file", "folder"])
def test_state_refuses_what_is_not_ours(tmp_path: Path, what: str) -> None:
    path = tmp_path / "out.zarr"
    if what == "foreign array":
        write_array(path, np.ones((2, 2)), (2, 2))
    elif what == "file":
        path.write_text("notes")
    else:
        path.mkdir()
        (path / "lock.json").write_text("{}")
        (path / "thesis.tex").write_text("years of work")
    held = {"foreign array": " (it holds c/0/0, zarr.json)", "file": "",
            "folder": " (it holds lock.json, thesis.tex)"}[what]  # fmt: skip
    want = (
        f"OUT ({path}) exists and is not a Zarr array written by this tool{held}; it will not "
        "be replaced: choose another OUT path or remove it yourself"
    )
    with pytest.raises(UnsafeOutputError, match=f"^{re.escape(want)}$"):
        Output(str(path)).state()


def test_state_of_an_array_whose_attribute_is_not_a_dict_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.zarr"
    zarr.create_array(str(path), shape=(2, 2), dtype="f4", attributes={ATTRS_KEY: "x"})
    with pytest.raises(UnsafeOutputError, match="not a Zarr array written by this tool"):
        Output(str(path)).state()


class _Unreachable:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def exists(self, path: str) -> bool:
        raise self.error


def test_state_of_an_unreachable_store(monkeypatch: pytest.MonkeyPatch) -> None:
    down = _Unreachable(ConnectionError("refused"))
    monkeypatch.setattr(output_module, "url_to_fs", lambda url, options: (down, "b/out"))
    out = Output("s3://b/out", {"endpoint_url": "http://127.0.0.1:9"})
    want = (
        "OUT (s3://b/out) cannot be reached: the storage at http://127.0.0.1:9 did not answer "
        "(ConnectionError: refused)"
    )
    with pytest.raises(UsageError, match=f"^{re.escape(want)}"):
        out.state()
    other = _Unreachable(KeyError("bug"))
    monkeypatch.setattr(output_module, "url_to_fs", lambda url, options: (other, "b/out"))
    with pytest.raises(KeyError, match="bug"):
        out.state()


# --- claiming OUT for a job ----------------------------------------------------------------


def test_claim_creates_the_folder_and_removes_it_if_left_empty(tmp_path: Path) -> None:
    out = Output(str(tmp_path / "deep" / "out.zarr"))
    with out.claim(None, overwrite=False, resume=False) as (held, state):
        assert state is None and held is not None
        assert (tmp_path / "deep" / "out.zarr").is_dir()
    assert not (tmp_path / "deep").exists()  # the parent it made for OUT goes too
    (tmp_path / "kept").mkdir()
    with Output(str(tmp_path / "kept" / "out.zarr")).claim(None, overwrite=False, resume=False):
        pass
    assert (tmp_path / "kept").is_dir()  # a parent that was there stays


def test_claim_keeps_a_folder_the_job_wrote_into(tmp_path: Path) -> None:
    out = Output(str(tmp_path / "out.zarr"))
    with out.claim(None, overwrite=False, resume=False):
        out.create((2, 2), (2, 2), "float32", {})
    assert (tmp_path / "out.zarr" / "zarr.json").is_file()


def test_claim_never_removes_a_folder_it_did_not_create(tmp_path: Path) -> None:
    (tmp_path / "out.zarr").mkdir()
    out = Output(str(tmp_path / "out.zarr"))
    with out.claim(None, overwrite=False, resume=False) as (_, state):
        assert state is None
    assert (tmp_path / "out.zarr").is_dir()


def claim_refused(
    out: Output, seen: Any, error: type[Exception], pattern: str, **flags: bool
) -> None:
    """Claiming ``out`` (state ``seen`` at planning) with ``flags`` raises ``error``, its
    message matching ``pattern``."""
    with pytest.raises(error, match=pattern), out.claim(seen, **flags):
        pass


def test_claim_of_an_existing_out_needs_a_flag(tmp_path: Path) -> None:
    out = ours(tmp_path)
    seen = out.state()
    want = (
        f"OUT ({out.url}) already exists; pass --overwrite to replace it or --resume to "
        "finish an interrupted run"
    )
    claim_refused(
        out, seen, OutputExistsError, f"^{re.escape(want)}$", overwrite=False, resume=False
    )
    for flags in ({"overwrite": True, "resume": False}, {"overwrite": False, "resume": True}):
        with out.claim(seen, **flags) as (_, state):
            assert state == seen


def test_check_flags() -> None:
    out = Output("somewhere.zarr")
    with pytest.raises(OutputExistsError, match=r"^OUT \(somewhere.zarr\) already exists; pass"):
        out._check_flags(overwrite=False, resume=False)
    out._check_flags(overwrite=True, resume=False)
    out._check_flags(overwrite=False, resume=True)


@pytest.mark.parametrize(("resume", "flag"), [(True, "--resume"), (False, "--overwrite")])
def test_claim_refuses_foreign_files_in_our_array(tmp_path: Path, resume: bool, flag: str) -> None:
    out = ours(tmp_path)
    seen = out.state()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt"):
        (tmp_path / "out.zarr" / name).write_text("mine")
    want = (
        rf"^OUT \({re.escape(out.url)}\) holds 5 file\(s\) this tool did not write "
        rf"\(([a-e]\.txt, ){{2}}[a-e]\.txt and 2 more\); {flag} writes only into our own "
        "array: move them out or choose another OUT$"
    )  # the first three found, in listing order
    claim_refused(out, seen, UnsafeOutputError, want, overwrite=not resume, resume=resume)


@pytest.mark.parametrize(
    ("count", "shown"),
    [(3, r"([a-c]\.txt, ){2}[a-c]\.txt"), (4, r"([a-d]\.txt, ){2}[a-d]\.txt and 1 more")],
)
def test_foreign_files_are_named_three_at_most(tmp_path: Path, count: int, shown: str) -> None:
    out = ours(tmp_path)
    for name in "abcd"[:count]:
        (tmp_path / "out.zarr" / f"{name}.txt").write_text("mine")
    want = rf"holds {count} file\(s\) this tool did not write \({shown}\); --overwrite"
    with pytest.raises(UnsafeOutputError, match=want):
        out.remove_ours()


@pytest.mark.parametrize("seen", [None, {"fingerprint": "other"}])
def test_claim_refuses_an_out_changed_since_planning(tmp_path: Path, seen: Any) -> None:
    out = ours(tmp_path)
    how = "created" if seen is None else "rewritten"
    want = (
        f"OUT ({out.url}) changed after this job was planned ({how} by another job?); plan "
        "the job again (rerun the command)"
    )
    claim_refused(
        out, seen, UnsafeOutputError, f"^{re.escape(want)}$", overwrite=True, resume=False
    )


def test_claim_for_accumulate_compares_the_current_state(tmp_path: Path) -> None:
    out = ours(tmp_path)
    (tmp_path / "out.zarr" / "notes.txt").write_text("C's other files stay")
    snap = {"c": 1}
    with out.claim(snap, overwrite=False, resume=False, current=lambda: {"c": 1}) as got:
        assert got[1] == snap
    want = f"C ({out.url}) changed after this job was planned; rerun it"
    with (
        pytest.raises(UnsafeOutputError, match=f"^{re.escape(want)}$"),
        out.claim(snap, overwrite=False, resume=False, current=lambda: {"c": 2}),
    ):
        pass


def test_a_folder_that_cannot_be_created(tmp_path: Path) -> None:
    out = Output(str(tmp_path / ("x" * 300)))  # longer than a file name may be
    want = (
        f"OUT ({out.url}) cannot be created (File name too long); choose a location you can "
        "write to"
    )
    with pytest.raises(UsageError, match=f"^{re.escape(want)}$"):
        out._make_folder()
    assert Output("memory://bucket/out.zarr")._make_folder() == []  # no folders there
    made = Output(str(tmp_path / "new"))._make_folder()
    door.release(made)
    assert [m.path for m in made] == [str(tmp_path / "new")]
    assert Output(str(tmp_path / "new"))._make_folder() == []


# --- replacing, creating, reading back -----------------------------------------------------


def test_remove_ours_keeps_the_lock_and_refuses_foreign_files(tmp_path: Path) -> None:
    out = ours(tmp_path)
    zarr.open_array(out.url, mode="r+")[:] = 1
    out.journal_tile((0, 0), {"checksum": 1})
    (tmp_path / "out.zarr" / "lock.json").write_text("{}")
    out.remove_ours()
    assert files(tmp_path / "out.zarr") == ["lock.json"]
    ours(tmp_path)
    (tmp_path / "out.zarr" / "notes").write_text("x")
    with pytest.raises(
        UnsafeOutputError, match=r"holds 1 file\(s\) this tool did not write \(notes\); --overwrite"
    ):
        out.remove_ours()
    assert "zarr.json" in files(tmp_path / "out.zarr")


@pytest.mark.parametrize(
    ("dtype", "fill"), [("float32", "nan"), ("complex64", "nan"), ("int16", 0)]
)
def test_create_fills_so_unwritten_tiles_show(tmp_path: Path, dtype: str, fill: Any) -> None:
    array = Output(str(tmp_path / "c.zarr")).create((3, 5), (2, 0), dtype, {"fingerprint": "x"})
    assert array.chunks == (2, 1)  # a chunk of 0 is stored as 1
    assert array.shape == (3, 5) and array.dtype == np.dtype(dtype)
    values = zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[:]
    assert np.isnan(values).all() if fill == "nan" else (values == 0).all()
    assert dict(array.attrs) == {ATTRS_KEY: '{"fingerprint": "x"}'}  # JSON text: flat


@pytest.mark.parametrize(("dtype", "zarr_format"), [("int16", 3), ("int16", 2), ("float32", 3)])
def test_create_uses_the_output_codec(tmp_path: Path, dtype: str, zarr_format: int) -> None:
    """auto: none for floats (zarr's default would be zstd), Blosc-LZ4 for integers."""
    array = Output(str(tmp_path / "c")).create((4, 4), (2, 2), dtype, {}, zarr_format=zarr_format)
    names = [f"{type(c).__name__}:{getattr(c, 'cname', '')}" for c in array.compressors]
    if dtype == "float32":
        assert names == []
    else:
        assert (
            len(names) == 1 and names[0].startswith(("BloscCodec", "Blosc")) and "lz4" in names[0]
        )


def test_create_never_replaces(tmp_path: Path) -> None:
    ours(tmp_path)
    with pytest.raises(Exception, match="exist"):  # noqa: PT011 - zarr's own error
        ours(tmp_path)


def test_create_names_dimensions_in_either_format(tmp_path: Path) -> None:
    names = ("row", "col")
    three = Output(str(tmp_path / "v3")).create((2, 2), (1, 1), "f4", {}, dimension_names=names)
    assert tuple(three.metadata.dimension_names) == names
    assert "_ARRAY_DIMENSIONS" not in dict(three.attrs)
    two = Output(str(tmp_path / "v2")).create(
        (2, 2), (1, 1), "f4", {}, dimension_names=names, zarr_format=2
    )
    assert two.metadata.zarr_format == 2
    assert dict(two.attrs) == {ATTRS_KEY: "{}", "_ARRAY_DIMENSIONS": ["row", "col"]}
    plain = Output(str(tmp_path / "v2b")).create((2, 2), (1, 1), "f4", {}, zarr_format=2)
    assert dict(plain.attrs) == {ATTRS_KEY: "{}"}
    assert three.metadata.dimension_names in (None, names)


def test_layout_and_format(tmp_path: Path) -> None:
    out = Output(str(tmp_path / "s.zarr"))
    out.create((8, 8), (2, 2), "float64", {}, shards=(4, 8))
    assert out.layout() == {
        "zarr_format": 3, "dtype": "float64", "chunks": (2, 2), "shards": (4, 8),
    }  # fmt: skip
    plain = ours(tmp_path)
    assert plain.layout() == {
        "zarr_format": 3, "dtype": "float32", "chunks": (2, 3), "shards": None,
    }  # fmt: skip
    assert plain.zarr_format() == 3
    zarr.open_group(str(tmp_path / "g2"), mode="w", zarr_format=2)
    inside_v2 = Output(str(tmp_path / "g2" / "c"))
    assert inside_v2.zarr_format() == 2
    inside_v2.create((2, 2), (1, 1), "int32", {}, zarr_format=2)
    assert inside_v2.layout() == {
        "zarr_format": 2, "dtype": "int32", "chunks": (1, 1), "shards": None,
    }  # fmt: skip


def test_refresh_consolidated(tmp_path: Path) -> None:
    group = zarr.open_group(str(tmp_path / "g"), mode="w")
    zarr.consolidate_metadata(group.store)
    out = Output(str(tmp_path / "g" / "c"))
    out.create((2, 2), (1, 1), "f4", {})
    assert out.refresh_consolidated() == [str(tmp_path / "g")]
    assert (
        "c"
        in zarr.open_group(str(tmp_path / "g"), mode="r").metadata.consolidated_metadata.metadata
    )
    assert ours(tmp_path).refresh_consolidated() == []


def test_input_listings(tmp_path: Path) -> None:
    out = ours(tmp_path)
    assert out.input_listings() is None
    out.save_input_listings({"A": {"x": [1, 2]}})  # type: ignore[dict-item]
    assert out.input_listings() == {"A": {"x": [1, 2]}}
    assert json.loads((tmp_path / "out.zarr" / "inputs.json").read_text()) == {"A": {"x": [1, 2]}}
    (tmp_path / "out.zarr" / "inputs.json").write_text("[1, 2]")
    assert out.input_listings() is None  # not a dict
    (tmp_path / "out.zarr" / "inputs.json").write_text('{"A": ')
    assert out.input_listings() is None  # torn


def test_mark_merges_attributes(tmp_path: Path) -> None:
    out = ours(tmp_path, complete=False, alpha=2.0)
    out.mark("f1", complete=True)
    out.mark("f2", verified=True)
    want = {"fingerprint": "f2", "complete": True, "alpha": 2.0, "verified": True, **TILED}
    assert out.state() == want
    bare = Output(str(tmp_path / "bare.zarr"))
    zarr.create_array(bare.url, shape=(1, 1), dtype="f4")
    bare.mark("f3", complete=True)
    assert bare.state() == {"fingerprint": "f3", "complete": True}


def test_journal_entries(tmp_path: Path) -> None:
    out = ours(tmp_path)
    out.journal_tile((1, 2), {"checksum": 7})
    out.journal_band((1, 2), (4, 6), {"checksum": 8})
    root = tmp_path / "out.zarr" / "journal"
    assert sorted(p.name for p in root.iterdir()) == ["band-1-2-4.json", "tile-1-2.json"]
    assert json.loads((root / "tile-1-2.json").read_text()) == {"checksum": 7}
    band = json.loads((root / "band-1-2-4.json").read_text())
    assert band == {"checksum": 8, "index": [1, 2], "rows": [4, 6]}
    out.forget_tiles({(1, 2)})
    assert not (root / "tile-1-2.json").exists()


def test_finished_tiles_refuse_another_fingerprint(tmp_path: Path) -> None:
    out = ours(tmp_path)
    with pytest.raises(UsageError, match=r"--resume: OUT .* was started with other inputs: .*"
                       r"\(fingerprint f0, this run's f9\).* or pass --overwrite"):  # fmt: skip
        out.finished_tiles(small_plan(), "f9", {"fingerprint": "f0"})


def test_writable_handle(tmp_path: Path) -> None:
    out = ours(tmp_path)
    out.writable("job-1")[0:2, 0:3] = 5
    values = zarr.open_array(out.url, mode="r")[:]
    assert (values[:2, :3] == 5).all() and np.isnan(values[2:]).all()


def test_writable_handles_are_per_job(tmp_path: Path) -> None:
    """OUT replaced between two jobs (--overwrite on a long-lived cluster): the second job's
    handle sees the new array, not the first job's cached one."""
    out = ours(tmp_path)
    assert out.writable("job-1").shape == (4, 6)
    out.remove_ours()
    out.create((3, 3), (3, 3), "int32", {})
    again = out.writable("job-2")
    assert (again.shape, again.dtype) == ((3, 3), np.dtype("int32"))


def test_repr_hides_secrets() -> None:
    shown = repr(Output("s3://b/out", {"secret": "hunter2", "key": "id"}))
    assert "hunter2" not in shown and "s3://b/out" in shown


# --- the codec -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "dtype", "zarr_format", "want"),
    [
        ("auto", "float32", 3, None),
        ("auto", "complex128", 3, None),
        ("auto", "int32", 3, "blosc3"),
        ("auto", "uint8", 2, "blosc2"),
        ("auto", "bool", 3, "blosc3"),
        ("none", "int32", 3, None),
        ("lz4", "float32", 3, "blosc3"),
        ("lz4", "float32", 2, "blosc2"),
        ("zstd", "float64", 3, "auto"),
        ("zstd", "int64", 2, "auto"),
    ],
)
def test_output_compressors(setting: str, dtype: str, zarr_format: int, want: Any) -> None:
    with dask.config.set({"tilegemm.output-compressor": setting}):
        got = output_compressors(dtype, zarr_format)
    if want == "blosc3":
        assert got == [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]
    elif want == "blosc2":
        assert got == [numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)]
    else:
        assert got == want


def test_output_compressors_default_is_auto() -> None:
    assert output_compressors("float32") is None
    assert output_compressors("int8") == [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]


def test_an_unknown_codec_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output_module.settings, "get", lambda key: "brotli")
    want = "tilegemm.output-compressor is 'brotli'; use auto, none, lz4 or zstd"
    with pytest.raises(UsageError, match=f"^{re.escape(want)}$"):
        output_compressors("float32")


class TokenFileSystem(MemoryFileSystem):
    """An in-memory object store that refuses to open without its credential: every call
    made without the job's storage options fails."""

    protocol = ("tokenfs",)

    def __init__(self, *args: Any, token: str | None = None, **kwargs: Any) -> None:
        if token != "secret":
            raise PermissionError("tokenfs: no credential")
        super().__init__(*args, **kwargs)


def test_every_operation_passes_the_storage_options(tmp_path: Path) -> None:
    """OUT on an object store that needs its options (a credential): each of Output's
    operations reaches it with them."""
    fsspec.register_implementation("tokenfs", TokenFileSystem, clobber=True)
    root = f"tokenfs://{tmp_path.name}"
    options = {"token": "secret"}
    out = Output(f"{root}/out.zarr", options)
    with pytest.raises(PermissionError):
        Output(f"{root}/out.zarr").state()  # the store as configured here
    try:
        TokenFileSystem(token="secret").pipe(f"{tmp_path.name}/out.zarr/lock.json", b"{}")
        assert out.state() is None  # holding only a lock: listed on a store whose ls gives dicts
        TokenFileSystem(token="secret").rm(f"{tmp_path.name}/out.zarr", recursive=True)
        out.check_path([f"{root}/a.zarr", f"{root}/b.zarr"])
        with out.claim(None, overwrite=False, resume=False) as (_, state):
            assert state is None and out.zarr_format() == 3
            out.create((4, 6), (2, 3), "float32", {"fingerprint": "f0", **TILED})
        assert out.layout()["chunks"] == (2, 3)
        out.mark("f1", complete=True)
        assert out.state() == {"fingerprint": "f1", "complete": True, **TILED}
        out.writable("job-1")[0:2, 0:3] = 1
        out.journal_tile((0, 0), {"checksum": 1})
        out.journal_band((0, 1), (0, 2), {"checksum": 2})
        out.save_input_listings({})
        assert out.input_listings() == {}
        out.forget_tiles({(0, 0)})
        assert out.refresh_consolidated() == []
        out.remove_ours()
        store = TokenFileSystem(token="secret")
        assert store.find(tmp_path.name) == []
        group = zarr.open_group(f"{root}/g", mode="w", zarr_format=2, storage_options=options)
        zarr.consolidate_metadata(group.store)
        in_group = Output(f"{root}/g/c", options)
        assert in_group.zarr_format() == 2  # found the v2 group, with the credential
        in_group.create((4, 6), (2, 3), "float32", {"fingerprint": "f0"}, zarr_format=2)
        assert in_group.refresh_consolidated() == [f"{root}/g"]
        assert in_group.finished_tiles(small_plan(), "f0", {"fingerprint": "f0"}) == set()
    finally:
        with contextlib.suppress(FileNotFoundError):
            TokenFileSystem(token="secret").rm(tmp_path.name, recursive=True)


def small_plan() -> Any:
    """The plan of a 4x6 OUT in 2x3 chunks (as ``ours`` creates)."""
    from pipeline.plan.search import plan_matmul

    a, b = ArraySpec((4, 5), (2, 5), "float32"), ArraySpec((5, 6), (5, 3), "float32")
    return plan_matmul(a, b, workers=1, threads_per_worker=1, memory_limit_bytes=2**31)


def test_finished_tiles_of_a_fresh_out(tmp_path: Path) -> None:
    """A matching fingerprint and no journal: nothing to skip."""
    out = ours(tmp_path)
    assert out.finished_tiles(small_plan(), "f0", {"fingerprint": "f0"}) == set()

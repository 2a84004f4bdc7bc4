"""What ``--accumulate`` guarantees around the protocol's edges: integer sums exact at both ends
of every integer dtype (64-bit ones included, where a float64 check rounds), C's room checked
before the first move (free space as ``df`` counts it), a folder left by an unknown run never
taken over, and verify refusing a C an accumulation has not finished."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client

from pipeline import multiply, verify_product
from pipeline.accumulate.state import SIDECAR
from pipeline.errors import InputError, UnfinishedOutputError, UnsafeOutputError, UsageError
from tests.helpers import run_cli, write_array

INTEGERS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def stored(folder: Path) -> dict[str, bytes]:
    """C's files by name (its lock aside: a refused command takes and frees it)."""
    found = {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}
    return {name: p.read_bytes() for name, p in found.items() if name != "lock.json"}


def ends(dtype: str) -> list[tuple[int, int, int, int, int]]:
    """(α, β, C_old, the sum, C_old one past) with A·B = 2 everywhere: each end of C's range
    reached exactly, and passed by one."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    top = (1, 1, hi - 2, hi, hi - 1)
    if lo < 0:  # -P + C_old down to the bottom
        return [top, (-1, 1, lo + 2, lo, lo + 1)]
    return [top, (1, -1, 2, 0, 3)]  # P - C_old down to 0


def setup_c(tmp_path: Path, dtype: str, old: int, cell_old: int | None = None) -> tuple[str, ...]:
    """A, B of True (A·B = 2 everywhere) and C of ``old``, one cell of ``cell_old``."""
    a_url = write_array(tmp_path / "a.zarr", np.ones((4, 2), bool), (2, 2))
    b_url = write_array(tmp_path / "b.zarr", np.ones((2, 4), bool), (2, 2))
    c = np.full((4, 4), old, dtype)
    if cell_old is not None:
        c[3, 3] = cell_old  # in the last tile
    c_url = str(tmp_path / "c.zarr")
    zarr.create_array(c_url, data=c, chunks=(2, 2))
    return a_url, b_url, c_url


@pytest.mark.parametrize("dtype", INTEGERS)
def test_every_integer_c_is_exact_at_both_ends(tmp_path: Path, client: Client, dtype: str) -> None:
    """Reaching C's largest or smallest value is written exactly; one past it, in one element
    of the last tile, is refused and C is put back bit for bit (2**63 + 1 rounds to 2**63 in
    float64: a float check would pass it and the sum would wrap)."""
    for i, (alpha, beta, old, total, beyond) in enumerate(ends(dtype)):
        urls = setup_c(tmp_path / f"end{i}", dtype, old)
        multiply(*urls, client=client, accumulate=True, alpha=alpha, beta=beta)
        got = zarr.open_array(urls[2])[:]
        np.testing.assert_array_equal(got, np.full((4, 4), total, dtype), strict=True)
        urls = setup_c(tmp_path / f"past{i}", dtype, old, cell_old=beyond)
        before = stored(Path(urls[2]))
        with pytest.raises(InputError, match=rf"reaches .*beyond C's {dtype} range"):
            multiply(*urls, client=client, accumulate=True, alpha=alpha, beta=beta)
        assert stored(Path(urls[2])) == before, f"{dtype} {beyond}: C is not as it was"
        assert not (Path(urls[2]) / SIDECAR).exists()


def test_the_reports_int64_and_uint64_cases(tmp_path: Path, client: Client) -> None:
    """A @ B = 4 (int8, uint8) into an int64 C holding 2**63 - 3, and a uint64 C holding 2**64 - 2:
    refused with the exact sums, not written as -9223372036854775807 and 2."""
    for dtype, old, found in (("int64", 2**63 - 3, 2**63 + 1), ("uint64", 2**64 - 2, 2**64 + 2)):
        kind = "int8" if dtype == "int64" else "uint8"  # a uint64 C takes a product >= 0 only
        a_url = write_array(tmp_path / f"a{kind}.zarr", np.ones((2, 2), kind), (2, 2))
        b_url = write_array(tmp_path / f"b{kind}.zarr", np.full((2, 2), 2, kind), (2, 2))
        c_url = str(tmp_path / f"{dtype}.zarr")
        zarr.create_array(c_url, data=np.full((2, 2), old, dtype), chunks=(2, 2))
        with pytest.raises(InputError, match=f"reaches {found}..{found}, beyond"):
            multiply(a_url, b_url, c_url, client=client, accumulate=True)
        assert (zarr.open_array(c_url)[:] == old).all()


class FakeStatvfs:
    """A file system with ``avail`` blocks free to users and ``reserved`` more for root."""

    def __init__(self, avail: int, reserved: int) -> None:
        self.f_frsize, self.f_blocks = 1, 10**12
        self.f_bavail, self.f_bfree = avail, avail + reserved


def test_room_for_c_is_checked_before_the_first_move(
    tmp_path: Path, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uncompressed 64x64 float64 C (32 KiB) on a file system with 20 KiB free to users
    and 1 MiB reserved for root: refused with both sizes before anything moves (the reserved
    blocks are not free, as df counts them); with room, the accumulation runs."""
    a_url = write_array(tmp_path / "a.zarr", np.ones((64, 8)), (32, 8))
    b_url = write_array(tmp_path / "b.zarr", np.ones((8, 64)), (8, 32))
    c_url = str(tmp_path / "c.zarr")
    zarr.create_array(c_url, data=np.zeros((64, 64)), chunks=(32, 32), compressors=None)
    before = stored(Path(c_url))
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: FakeStatvfs(20 * 1024, 1 << 20))
    with pytest.raises(UsageError, match=r"C \(.*\) needs about 32\.0 KiB free .* has 20\.0 KiB"):
        multiply(a_url, b_url, c_url, client=client, accumulate=True)
    assert stored(Path(c_url)) == before and not (Path(c_url) / SIDECAR).exists()
    monkeypatch.setattr(os, "statvfs", lambda p: FakeStatvfs(40 * 1024, 0))
    multiply(a_url, b_url, c_url, client=client, accumulate=True)
    monkeypatch.setattr(os, "statvfs", real)
    assert (zarr.open_array(c_url)[:] == 8.0).all()
    assert shutil.disk_usage(c_url).free > 0


def test_the_dry_run_names_cs_room(tmp_path: Path) -> None:
    a_url = write_array(tmp_path / "a.zarr", np.ones((64, 8)), (32, 8))
    b_url = write_array(tmp_path / "b.zarr", np.ones((8, 64)), (8, 32))
    c_url = str(tmp_path / "c.zarr")
    zarr.create_array(c_url, data=np.zeros((64, 64)), chunks=(32, 32), compressors=None)
    done = run_cli("multiply", a_url, b_url, c_url, "--accumulate", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "32.0 KiB more while the accumulation runs" in done.stdout


def plant_folder(c_url: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = Path(c_url) / SIDECAR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_a_folder_with_saved_originals_and_no_state_is_never_taken_over(
    tmp_path: Path, client: Client
) -> None:
    """What a run of an older version left when killed while cleaning up (its state gone, a
    tile's marker and originals still there): refused, naming the folder and what to do,
    C's files unchanged (taking it over once made C 0 % right)."""
    urls = setup_c(tmp_path, "float64", 5)
    plant_folder(urls[2], {
        "saved/tile-0-0.json": json.dumps({"index": [0, 0]}).encode(),
        "original/c/0/0": (Path(urls[2]) / "c/0/0").read_bytes(),
        "original/zarr.json": (Path(urls[2]) / "zarr.json").read_bytes(),
    })  # fmt: skip
    before = stored(Path(urls[2]))
    with pytest.raises(UnsafeOutputError, match=r"no state\.json but 2 other file\(s\).*rm -r"):
        multiply(*urls, client=client, accumulate=True)
    assert stored(Path(urls[2])) == before


def test_a_start_killed_before_its_state_is_cleared(tmp_path: Path, client: Client) -> None:
    """Listings and C's metadata but no state: nothing of C was moved; the next run removes
    the folder and adds the product once."""
    urls = setup_c(tmp_path, "float64", 5)
    plant_folder(urls[2], {
        "inputs.json": b"{}",
        "original/zarr.json": (Path(urls[2]) / "zarr.json").read_bytes(),
    })  # fmt: skip
    multiply(*urls, client=client, accumulate=True)
    assert (zarr.open_array(urls[2])[:] == 7.0).all()
    assert not (Path(urls[2]) / SIDECAR).exists()


@pytest.mark.parametrize(
    "phase, words",
    [
        ("running", "finish it with .*resume"),
        ("rolling-back", "again: it first finishes putting C back"),
    ],
)
def test_verify_refuses_an_unfinished_accumulation(
    tmp_path: Path, client: Client, phase: str, words: str
) -> None:
    urls = setup_c(tmp_path, "float64", 5)
    plant_folder(urls[2], {"state.json": json.dumps({"phase": phase}).encode()})
    with pytest.raises(UnfinishedOutputError, match=f"unfinished accumulation .*{words}"):
        verify_product(client, *urls)
    done = run_cli("verify", *urls)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: C (") and "unfinished accumulation" in done.stderr


def test_a_rollback_left_by_a_killed_run_is_finished_first(tmp_path: Path, client: Client) -> None:
    """A state saying rolling-back, one tile's original moved aside and C's object there
    rewritten: the next --accumulate first puts the original home, then adds once."""
    urls = setup_c(tmp_path, "float64", 5)
    c = Path(urls[2])
    plant_folder(urls[2], {
        "state.json": json.dumps({"fingerprint": "x", "phase": "rolling-back"}).encode(),
        "original/c/1/1": (c / "c/1/1").read_bytes(),
    })  # fmt: skip
    zarr.open_array(urls[2])[2:4, 2:4] = 99.0  # what the failed run wrote there
    multiply(*urls, client=client, accumulate=True)
    assert (zarr.open_array(urls[2])[:] == 7.0).all(), "C_old came home before the new sum"


def test_resume_after_a_complete_but_uncleaned_run_is_refused(
    tmp_path: Path, client: Client
) -> None:
    urls = setup_c(tmp_path, "float64", 5)
    plant_folder(urls[2], {"state.json": json.dumps({"phase": "complete"}).encode()})
    with pytest.raises(UsageError, match="had finished .* nothing is left to resume"):
        multiply(*urls, client=client, accumulate=True, resume=True)
    assert not (Path(urls[2]) / SIDECAR).exists(), "the finished run's folder is removed"
    assert (zarr.open_array(urls[2])[:] == 5.0).all()

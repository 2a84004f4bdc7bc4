"""Inputs inside archives read bounded: a zip or tar.gz whose chunk or metadata member inflates
to 256 MiB is refused before it is inflated, naming the member, its declared size and the
limit; a member whose header claims less than it holds is inflated no further than its claim
(zip) or the limit (any archive file system); a FIFO or a device as the archive is refused on
the open descriptor, never waited on; honest zip and tar inputs, v2 and v3, multiply as usual."""

from __future__ import annotations

import io
import os
import re
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from distributed import Client
from fsspec.archive import AbstractArchiveFileSystem
from zarr.core.buffer.core import default_buffer_prototype
from zarr.core.sync import sync

from pipeline import multiply
from pipeline.errors import InputError, StoredObjectError
from pipeline.store.chunks.archive_store import ArchiveStore, archive_store
from pipeline.store.chunks.bounded import open_input_array
from tests.child_env import child_env
from tests.helpers import REPO, assert_product, random_matrix, refused, run_cli
from tests.pipeline.test_bounded_reads import PEAK, read_each

MiB = 2**20
BOMB_BYTES = 256 * MiB
"""What a hostile member inflates to (about 1 MiB deflated)."""
FAST_CLUSTER = ("--workers", "1", "--dashboard-address", "127.0.0.1:0", "--no-progress")


def archived(folder: Path, archive: Path, bomb: str = "") -> Path:
    """Every file under ``folder`` in ``archive`` (zip, deflated; tar; tar.gz: by its name), the
    member ``bomb`` (if any) holding BOMB_BYTES zero bytes instead."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    names = [p.relative_to(folder).as_posix() for p in files]
    assert not bomb or bomb in names, names
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for path, name in zip(files, names, strict=True):
                if name != bomb:
                    zf.write(path, name)
                    continue
                with zf.open(name, "w") as member:
                    for _ in range(BOMB_BYTES // MiB):
                        member.write(bytes(MiB))
        return archive
    mode, level = ("w:gz", {"compresslevel": 1}) if archive.suffix == ".gz" else ("w", {})
    with tarfile.open(archive, mode, copybufsize=MiB, **level) as tf:
        for path, name in zip(files, names, strict=True):
            if name != bomb:
                tf.add(path, name)
                continue
            info = tarfile.TarInfo(name)
            info.size = BOMB_BYTES
            with open("/dev/zero", "rb") as zeros:
                tf.addfile(info, zeros)
    return archive


def declare(archive: Path, member: str, size: int) -> None:
    """Patch the size ``member`` declares in the zip's central directory (which zipfile
    trusts) to ``size``; its data and CRC stay as they are."""
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        at = zf.start_dir
    while data[at : at + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, at + 28)
        if data[at + 46 : at + 46 + name_len].decode() == member:
            struct.pack_into("<I", data, at + 24, size)
            archive.write_bytes(data)
            return
        at += 46 + name_len + extra_len + comment_len
    raise AssertionError(f"{member} is not in {archive}")


def array_in(tmp_path: Path, zarr_format: int, **options: Any) -> Path:
    """A 64x64 float64 array A (one chunk) in a folder of its own, to be archived."""
    folder = tmp_path / f"v{zarr_format}"
    data = np.arange(64 * 64, dtype="float64").reshape(64, 64)
    zarr.create_array(
        str(folder / "A"), data=data, chunks=(64, 64), zarr_format=zarr_format, **options
    )
    return folder


CHUNK = {2: "A/0.0", 3: "A/c/0/0"}
METADATA = {2: "A/.zarray", 3: "A/zarr.json"}

BOMBS = [
    # (archive, zarr format, the member that inflates to BOMB_BYTES)
    ("a.zip", 3, CHUNK[3]),
    ("a.zip", 2, CHUNK[2]),
    ("a.zip", 3, METADATA[3]),
    ("a.zip", 2, METADATA[2]),
    ("a.tar.gz", 3, CHUNK[3]),
    ("a.tar.gz", 2, METADATA[2]),
]


def test_members_inflating_past_their_keys_limit_are_refused_uninflated(tmp_path: Path) -> None:
    urls, members = [], []
    for i, (name, zarr_format, bomb) in enumerate(BOMBS):
        folder = array_in(tmp_path / str(i), zarr_format)
        archive = archived(folder, tmp_path / str(i) / name, bomb)
        protocol = "zip" if name.endswith(".zip") else "tar"
        urls.append(f"{protocol}://A::{archive}")
        members.append(bomb)
    said, peak = read_each(urls)
    assert peak < PEAK, f"{peak / MiB:.0f} MiB"
    for line, url, member in zip(said, urls, members, strict=True):
        key = member.removeprefix("A/")
        assert line.startswith("StoredObjectError"), line
        assert f"A ({url}) cannot be read: its " in line, line
        assert f"/{key} is the archive member {member}, declaring 256.0 MiB" in line, line
        limit = r"16\.0 MiB" if key in ("zarr.json", ".zarray") else r"[\d.]+ KiB"
        assert re.search(f"where at most {limit} \\([\\d,]+ bytes\\) can be needed", line), line


def test_a_member_whose_size_is_understated_is_inflated_no_further(tmp_path: Path) -> None:
    folder = array_in(tmp_path, 3, compressors=None)  # chunks of exactly 32 KiB
    archive = archived(folder, tmp_path / "a.zip", CHUNK[3])
    declare(archive, CHUNK[3], 32 * 1024)  # passes the size check; its CRC is the 256 MiB's
    [line], peak = read_each([f"zip://A::{archive}"])
    assert peak < PEAK, f"{peak / MiB:.0f} MiB"
    assert "is the archive member A/c/0/0, damaged (BadZipFile: Bad CRC-32" in line, line


class _Understating(AbstractArchiveFileSystem):
    """An archive file system whose ``info`` claims 10 bytes of each member."""

    protocol = "understating"
    cachable = False

    def __init__(self, members: dict[str, bytes]) -> None:
        super().__init__()
        self.members = members
        self.dir_cache = {k: {"name": k, "type": "file", "size": 10} for k in members}

    def _get_dirs(self) -> None:
        pass

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> io.BytesIO:
        return io.BytesIO(self.members[path])


@pytest.mark.parametrize(
    ("chunk_bytes", "found"),
    [
        (100, None),  # within the limit: as stored, whatever the claim
        (99, "inflating to more than 99 B (it declares 10 B), where at most 99 B"),
    ],
)
def test_any_archive_member_is_inflated_at_most_to_its_limit(
    chunk_bytes: int, found: str | None
) -> None:
    fs = _Understating({"A/c/0/0": bytes(100)})
    store = ArchiveStore(fs, "A", "understating://A::x", None, chunk_bytes)
    get = store.get("c/0/0", default_buffer_prototype())
    if found is None:
        assert sync(get).to_bytes() == bytes(100)
        return
    with pytest.raises(StoredObjectError, match=re.escape(found)):
        sync(get)


def test_a_chunk_is_not_read_before_the_codecs_say_how_large_one_can_be(tmp_path: Path) -> None:
    archive = archived(array_in(tmp_path, 3), tmp_path / "a.zip")
    first = archive_store(f"zip://A::{archive}", None)  # as the array's metadata is read
    assert first is not None
    assert sync(first.get("zarr.json", default_buffer_prototype())) is not None
    with pytest.raises(StoredObjectError, match=r"A/c/0/0, declaring .* where at most 0 B can"):
        sync(first.get("c/0/0", default_buffer_prototype()))


# Opened as the job's client and its workers open an input (check_protocol's look comes
# first in the CLI; a FIFO swapped in after it must not block these opens either).
OPEN = """
import sys
from pipeline.store.chunks.bounded import open_input_array
from pipeline.store.handles import cached_array
for opening in (open_input_array, cached_array):
    try:
        opening(sys.argv[1], {}, "t") if opening is cached_array else opening(sys.argv[1], None)
        print("opened")
    except Exception as e:
        print(type(e).__name__, e)
"""


@pytest.mark.parametrize(
    ("target", "found"),
    [
        ("fifo.zip", "InputError its archive {} is a FIFO, not a file"),
        ("/dev/zero", "InputError its archive {} is a character device, not a file"),
        ("missing.zip", "InputNotFoundError its archive {} does not exist"),
        ("folder.tar", "InputError its archive {} is a folder, not a file"),
    ],
)
def test_the_archive_is_checked_on_the_descriptor_it_is_read_from(
    tmp_path: Path, target: str, found: str
) -> None:
    path = target if target.startswith("/") else str(tmp_path / target)
    if target == "fifo.zip":
        os.mkfifo(path)  # opened blocking, it would wait for a writer forever
    if target == "folder.tar":
        os.mkdir(path)
    protocol = "tar" if target.endswith(".tar") else "zip"
    done = subprocess.run(
        [sys.executable, "-c", OPEN, f"{protocol}://A::{path}"],
        capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=60, check=True,
    )  # fmt: skip
    said = done.stdout.splitlines()
    assert len(said) == 2, done.stdout + done.stderr
    assert all(line.startswith(found.format(path)) for line in said), said


def test_a_local_archive_behind_another_link_is_refused(tmp_path: Path) -> None:
    archive = archived(array_in(tmp_path, 3), tmp_path / "a.zip")
    with pytest.raises(InputError, match=r"is reached through simplecache, which opens it by name"):
        open_input_array(f"zip://A::simplecache::{archive}", None)


@pytest.mark.parametrize(
    ("member", "words"),
    [
        (METADATA[2], "metadata document zip://A::{}/.zarray is the archive member A/.zarray"),
        (CHUNK[2], "chunk zip://A::{}/0.0 is the archive member A/0.0, declaring 256.0 MiB"),
    ],
)
def test_the_cli_refuses_a_bomb_in_one_line(tmp_path: Path, member: str, words: str) -> None:
    """The chunk is read by the job's worker, the metadata by the command before any."""
    archive = archived(array_in(tmp_path, 2), tmp_path / "a.zip", member)
    out = tmp_path / "c.zarr"
    url = f"zip://A::{archive}"
    line = refused(run_cli("multiply", url, url, str(out), *FAST_CLUSTER, timeout=120))
    assert f"A ({url}) cannot be read" in line and words.format(archive) in line, line


@pytest.mark.parametrize(
    ("a_in", "b_in"),
    [
        # (archive, zarr format, dtype, shards) of A and of B
        (("a.zip", 2, "float32", None), ("b.tar", 3, "float64", (16, 16))),
        (("a.tar.gz", 3, "float32", None), ("b.zip", 3, "float32", (16, 24))),
    ],
)
def test_honest_archives_multiply(
    tmp_path: Path, client: Client, a_in: tuple[Any, ...], b_in: tuple[Any, ...]
) -> None:
    rng = np.random.default_rng(7)
    a = random_matrix(rng, (40, 30), a_in[2])
    b = random_matrix(rng, (30, 48), b_in[2])
    urls = []
    for name, x, (archive, zarr_format, _, shards) in (("A", a, a_in), ("B", b, b_in)):
        folder = tmp_path / name
        options = {"shards": shards} if shards else {}
        zarr.create_array(
            str(folder / name), data=x, chunks=(8, 8), zarr_format=zarr_format, **options
        )
        protocol = "zip" if archive.endswith(".zip") else "tar"
        urls.append(f"{protocol}://{name}::{archived(folder, tmp_path / archive)}")
    out = tmp_path / "c.zarr"
    multiply(urls[0], urls[1], str(out), client=client)
    assert_product(zarr.open_array(str(out))[:], a, b)

"""fsspec plumbing shared by the inputs and the output: URLs, options, small files."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import fsspec

from pipeline.errors import InputError, InputNotFoundError, UnsafeOutputError, UsageError
from pipeline.store import links
from pipeline.store.door import SMALL_READ_BYTES, Door


def url_to_fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """The fsspec file system and path of a URL (or local path)."""
    check_archive(url, "")
    try:
        fs, path = fsspec.core.url_to_fs(
            normalize_url(url), **(fsspec_options(url, storage_options) or {})
        )
    except (ImportError, ValueError) as e:
        raise UsageError(f"cannot open {url}: {e}") from e
    return fs, str(path)


def write_bytes(url: str, relpath: str, data: bytes, storage_options: dict[str, Any]) -> None:
    """Write ``relpath`` inside the store at ``url``, atomically (a crash leaves no torn file):
    a local folder through its door (no link followed), an object store with one put."""
    local = local_path(url)
    if local is not None:
        if not os.path.lexists(local):  # a sidecar's folder, made inside OUT's own door
            Door(os.path.dirname(local)).make_folder(os.path.basename(local))
        Door(local).write(relpath, data)
        return
    fs, path = url_to_fs(url, storage_options)
    fs.pipe_file(f"{path.rstrip('/')}/{relpath}", data)  # an object store's put is atomic


def read_small(url: str, relpath: str, storage_options: dict[str, Any] | None) -> bytes | None:
    """A small file (a sidecar) inside the store at ``url``; None when there is none. Refused
    when it is larger than a sidecar can be, or (local) a link or not a regular file."""
    local = local_path(url)
    if local is not None:
        try:
            return Door(local).read(relpath, SMALL_READ_BYTES)
        except (FileNotFoundError, NotADirectoryError):
            return None
    fs, path = url_to_fs(url, storage_options)
    target = f"{path.rstrip('/')}/{relpath}"
    try:
        size = fs.size(target)
        if size is not None and size > SMALL_READ_BYTES:
            raise UnsafeOutputError(f"{url}/{relpath} holds {size:,} bytes: not a file of ours")
        return bytes(fs.cat_file(target, start=0, end=SMALL_READ_BYTES + 1))[:SMALL_READ_BYTES]
    except FileNotFoundError:
        return None


def read_json(url: str, relpath: str, storage_options: dict[str, Any] | None) -> Any:
    """The JSON file ``relpath`` inside the store at ``url``, parsed; None when there is none
    (a torn file raises ValueError: what it means is the caller's to say)."""
    data = read_small(url, relpath, storage_options)
    try:
        return None if data is None else json.loads(data)
    except RecursionError:  # nested past the parser's limit: no file of ours, nor zarr's
        raise ValueError(f"{relpath} is JSON nested deeper than Python's parser goes") from None


def list_json(url: str, relpath: str, storage_options: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON files of a folder inside the store, parsed, by name; torn ones skipped. One
    that parses as anything but an object was not written by this tool: refused."""
    local = local_path(url)
    if local is not None:
        try:
            found = [e.path for e in Door(local).walk(relpath) if e.kind == "file"]
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = sorted(p for p in found if p.count("/") == relpath.count("/") + 1)
    else:
        fs, path = url_to_fs(url, storage_options)
        root = path.rstrip("/")
        if not fs.exists(f"{root}/{relpath}"):
            return []
        listed = fs.ls(f"{root}/{relpath}", detail=False)
        names = sorted(str(p)[len(root) + 1 :] for p in listed)
    entries = []
    for name in names:
        if not name.endswith(".json"):
            continue  # e.g. a ".partial" file of a job killed mid-write
        try:
            entry = json.loads(read_small(url, name, storage_options) or b"null")
        except ValueError:  # torn by a crash (stores without atomic writes): not an entry
            continue
        if not isinstance(entry, dict):
            raise UsageError(
                f"{url.rstrip('/')}/{name} holds a JSON {type(entry).__name__}, not an entry "
                "this tool wrote; use --overwrite to start over (or remove that file)"
            )
        entries.append(entry)
    return entries


def location(url: str, storage_options: dict[str, Any] | None) -> tuple[str, str]:
    fs, path = url_to_fs(url, storage_options)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        path = os.path.realpath(path)
    return (protocol, path.rstrip("/"))


def inside(child: tuple[str, str], parent: tuple[str, str]) -> bool:
    return child[0] == parent[0] and child[1].startswith(parent[1] + "/")


def check_protocol(url: str, name: str) -> None:
    protocol, _ = fsspec.core.split_protocol(url)
    if protocol is None:
        return
    check_credentials(url, name)
    if name != "OUT":  # an OUT in an archive, found or not, is refused as one (check_writable)
        check_archive(url, name)
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError as e:
        raise UsageError(
            f"{name} ({url}) has the unknown protocol '{protocol}://'; give a local path or an "
            "fsspec URL such as s3://bucket/a.zarr"
        ) from e
    except ImportError as e:
        raise UsageError(f"{name} ({url}) needs a package that is not installed: {e}") from e


ARCHIVES = ("zip", "tar", "libarchive")
"""fsspec's file systems that read one archive file, named at the end of the chain."""


def check_archive(url: str, name: str) -> None:
    """A chained URL's local archive (``zip://A::a.zip``) is a regular file: a missing one is
    said so, and a FIFO or device is never opened (fsspec's open of a FIFO waits forever)."""
    _, chained, target = url.rpartition("::")
    outer = fsspec.core.split_protocol(url.split("::")[0])[0]
    local = local_path(target) if chained and outer in ARCHIVES else None
    if local is None:
        return  # a cache or another chain over a store: not an archive file to open
    who = f"{name} ({url})" if name else url
    try:
        mode = os.stat(local).st_mode
    except FileNotFoundError as e:
        raise InputNotFoundError(
            f"{who}: its archive {local} does not exist; check the path"
        ) from e
    except OSError as e:
        raise InputError(f"{who}: its archive {local} cannot be read ({e.strerror})") from e
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
        raise InputError(
            f"{who}: its archive {local} is {kind}, not a file; name the archive file itself"
        )


OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss")
"""Protocols whose URL names a bucket after ``://``: a ``user:password@`` there is no login."""


def check_credentials(url: str, name: str) -> None:
    """Refuse credentials inside any link of a (chained) URL, before anything opens it."""
    for link in url.split("::"):
        _refuse_credentials(link, name)


def _refuse_credentials(url: str, name: str) -> None:
    """``s3://KEY:SECRET@bucket`` would be read as a bucket named ``KEY:SECRET@bucket`` (and
    quoted in errors): refused with a message that holds neither."""
    protocol, colon, rest = url.partition("://")
    bucket = rest.split("/", 1)[0]
    if not colon or protocol.lower() not in OBJECT_STORES or "@" not in bucket:
        return
    shown = f"{protocol}://***@{rest.split('@', 1)[1]}"
    raise UsageError(
        f"{name} ({shown}) has credentials in its URL, which {protocol}:// does not take; "
        "remove them and pass them as --storage-option key=... --storage-option secret=... "
        "(or in the environment, e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
    )


LOCAL_SCHEMES = ("file://", "local://")
"""fsspec's names for the local file system: such a URL is a path."""
NOT_SHARED = ("memory",)
"""Protocols whose data lives in one process: the workers (other processes) can't see it."""
NOT_WRITABLE = ("zip", "tar", "http", "https")
"""Protocols OUT can't be written to: an archive takes one writer at a time (every tile task
writes its own chunks at once), HTTP is read-only."""


def check_shared(url: str, name: str) -> None:
    """Refuse a store the Dask workers, in other processes, cannot see."""
    protocol, _ = fsspec.core.split_protocol(url)
    if protocol in NOT_SHARED:
        fix = "write OUT to" if name == "OUT" else "write it to"
        raise UsageError(
            f"{name} ({url}) is in {protocol}://, which each process has its own copy of: "
            f"the Dask workers can't see it; {fix} a path or shared storage instead"
        )


def check_writable(url: str) -> None:
    """Refuse an OUT that can't take concurrent writers (an archive) or can't be written."""
    check_shared(url, "OUT")
    protocol, _ = fsspec.core.split_protocol(url)
    archive = protocol in ("zip", "tar") or url.rstrip("/").lower().endswith((".zip", ".tar"))
    if archive:
        raise UsageError(
            f"OUT ({url}) is an archive, which can't take concurrent writers (every tile task "
            "writes its own chunks at once); write OUT to a directory or an object store, "
            "then archive it if you need to (e.g. `cd c.zarr && zip -r0 ../c.zip .`)"
        )
    if "::" in url:
        raise UsageError(
            f"OUT ({url}) is a chained URL; OUT is written directly: give its path or its "
            "store's own URL (e.g. s3://bucket/c.zarr)"
        )
    if protocol in NOT_WRITABLE:
        raise UsageError(
            f"OUT ({url}) is read-only over {protocol}://; write OUT to a path or an object "
            "store such as s3://bucket/c.zarr"
        )


def normalize_url(url: str) -> str:
    """``file://`` and ``local://`` URLs become plain paths: every local path goes through
    the same checks and the same door, and compares the same way everywhere."""
    local = local_path(url)
    return local if local is not None and url.startswith(LOCAL_SCHEMES) else url


def resolve_url(url: str, name: str) -> str:
    """The one location every check and write of ``name`` uses: a local path made absolute
    with its symlinks and ``..`` resolved (``x/../victim`` is ``victim``, whether or not ``x``
    exists), a URL as given (an object store's keys are literal: ``.`` and ``..`` segments are
    refused rather than guessed at)."""
    local = local_path(normalize_url(url))
    if local is not None:
        resolved = links.resolve(local, name)  # no link on the way that another user planted
        _refuse_dangling(local, name)
        return resolved
    if "::" in url:  # a chained URL (zip://PATH::ARCHIVE): read-only inputs, left as given
        return url
    protocol, rest = url.split("://", 1)
    if any(part in (".", "..") for part in rest.split("/")):
        raise UsageError(
            f"{name} ({url}) has a '.' or '..' segment, which {protocol}:// keys take literally; "
            f"spell the location without them"
        )
    return f"{protocol}://{rest.rstrip('/')}"


def refuse_linked(url: str, name: str, flag: str) -> None:
    """``flag`` (--overwrite, --resume, --accumulate) changes what ``name`` already holds:
    refused when ``name`` is itself a link, which anyone who can write its folder could have
    pointed at another array of yours. Name the array by its own path instead."""
    local = local_path(normalize_url(url))
    if local is not None and os.path.islink(local.rstrip("/")):
        raise UnsafeOutputError(
            f"{name} ({url}) is a symbolic link (to {os.readlink(local.rstrip('/'))}); {flag} "
            f"changes what it holds, so give its own path: {os.path.realpath(local)}"
        )


def _refuse_dangling(path: str, name: str) -> None:
    """A link on the way to ``path`` that leads nowhere would have the path resolved to
    wherever it points and created there, outside anything the user named: refused."""
    parts = path.split(os.sep)
    for end in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:end])
        if prefix and os.path.islink(prefix) and not os.path.exists(prefix):
            raise UsageError(
                f"{name} ({path}): {prefix} is a symbolic link that leads nowhere (to "
                f"{os.readlink(prefix)}); give the real location, or remove the link"
            )


def absolute(url: str) -> str:
    """A local path made absolute, nothing else changed (``..`` after a link still follows
    the link, as the file system does), and so is a chained URL's local archive
    (``zip://A::a.zip``); other URLs as given."""
    local = local_path(normalize_url(url))
    if local is not None:
        return os.path.join(os.getcwd(), local)
    head, chained, target = url.rpartition("::")
    if chained and "://" not in target:
        return f"{head}::{os.path.join(os.getcwd(), target)}"
    return url


def local_path(url: str) -> str | None:
    """The file system path of a local path or file:// (or local://) URL; None for other
    URLs."""
    for scheme in LOCAL_SCHEMES:
        if url.startswith(scheme):
            rest = url.removeprefix(scheme)
            # RFC 8089: file://localhost/PATH is /PATH here (fsspec would make it relative)
            host, slash, _ = rest.partition("/")
            return rest[len(host) :] if slash and host.lower() == "localhost" else rest
    return None if "://" in url else url


def fsspec_options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """fsspec options apply only to URLs; zarr refuses them for local paths."""
    if not storage_options or "://" not in url or url.startswith(LOCAL_SCHEMES):
        return None
    return storage_options

"""Room for an accumulation: C's originals stay on disk (moved, not copied) until the last tile
is written, so C's new objects need about C's size again; checked before the first move."""

from __future__ import annotations

import math
import shutil

from pipeline.errors import UsageError
from pipeline.plan.units import format_bytes
from pipeline.store.door import Door
from pipeline.store.fs import local_path
from pipeline.store.handles import open_output
from pipeline.store.output import Output
from pipeline.store.owned import SIDECAR
from pipeline.store.space import Room


def room_for_c(out: Output) -> Room | None:
    """The bytes C's new objects take while its originals are kept (uncompressed C: its whole
    size; compressed: what its objects take now, as the estimate) against the space free on
    C's file system for this user (as ``df`` counts it: reserved blocks are not free). None
    where C is not a local folder."""
    local = local_path(out.url)
    if local is None:
        return None
    array = open_output(out.url, out.storage_options)
    compressed = bool(getattr(array, "compressors", ())) or bool(getattr(array, "filters", ()))
    whole = math.prod(array.shape) * array.dtype.itemsize
    needed = _stored_bytes(local) if compressed else whole
    try:
        free: int | None = shutil.disk_usage(local).free  # statvfs' f_bavail
    except OSError:
        free = None
    return Room(needed, compressed, free, local)


def check_room_for_c(room: Room | None, url: str) -> None:
    """UsageError naming both sizes when C's new objects cannot fit beside its originals."""
    if room is None or room.free is None or room.needed <= room.free:
        return
    what = "what C's compressed objects take now" if room.compressed else "C's whole size"
    raise UsageError(
        f"--accumulate: C ({url}) needs about {format_bytes(room.needed)} free ({what}: its "
        f"original objects are kept until the last tile is written, so it can be put back) "
        f"but its file system has {format_bytes(room.free)} free ({room.where}); free "
        f"{format_bytes(room.needed - room.free)} there, or copy C to a file system with room"
    )


def describe_room_for_c(room: Room) -> str:
    """The dry run's line for C."""
    size = ("about " if room.compressed else "") + format_bytes(room.needed)
    text = f"{size} more while the accumulation runs (C's originals are kept until it ends)"
    if room.free is None:
        return f"{text}; free space not known"
    text += f"; {format_bytes(room.free)} free at {room.where}"
    if room.needed > room.free:
        text += f": does not fit, {format_bytes(room.needed - room.free)} short"
    return text


def _stored_bytes(local: str) -> int:
    """Bytes of C's files (its accumulation folder left out), links not followed."""
    door = Door(local, "C")
    return sum(
        e.size
        for e in door.walk()
        if e.kind == "file" and not (e.path == SIDECAR or e.path.startswith(SIDECAR + "/"))
    )

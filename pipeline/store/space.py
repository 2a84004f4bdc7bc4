"""Room for OUT: the bytes it will take against the free space of the file system it goes
to, told by a dry run and checked before a real run starts anything."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass

from pipeline.errors import UsageError
from pipeline.plan.units import format_bytes
from pipeline.store.fs import local_path


@dataclass(frozen=True)
class Room:
    """OUT's size and the free space where it goes."""

    needed: int
    """OUT's bytes, uncompressed."""
    compressed: bool
    """OUT's chunks are compressed: ``needed`` is the most it takes, not what it takes."""
    free: int | None
    """Bytes this user may still write on OUT's file system (None: not a local path)."""
    where: str
    """The folder whose file system was asked (OUT's nearest existing folder), or OUT's URL."""
    held: int = 0
    """Bytes OUT's folder holds already (--overwrite frees them, --resume keeps them)."""

    @property
    def short(self) -> int:
        """Bytes missing for OUT to fit (0: it fits, or it can't be told)."""
        if self.free is None or self.compressed:
            return 0
        return max(self.needed - self.held - self.free, 0)


def room_for(url: str, needed: int, compressed: bool, existing: bool = False) -> Room:
    """OUT's room at ``url``; ``existing``: OUT's folder is ours to replace or finish, so what
    it holds counts as space it has (statted, never followed through a link; only when the
    free space alone is short: a walk over a big OUT's files takes a while)."""
    path = local_path(url)
    if path is None:
        return Room(needed, compressed, None, url)
    folder = _nearest_folder(os.path.abspath(path))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return Room(needed, compressed, None, folder)
    held = _folder_bytes(path) if existing and needed > free else 0
    return Room(needed, compressed, free, folder, held)


def check_room(room: Room, name: str, url: str, shape: tuple[int, int], dtype: str) -> None:
    """UsageError (naming both sizes) when OUT cannot fit its file system's free space."""
    if room.short:
        held = f", after the {format_bytes(room.held)} it holds now" if room.held else ""
        raise UsageError(
            f"{name} ({url}) needs {format_bytes(room.needed)} ({shape[0]}x{shape[1]} {dtype}, "
            f"uncompressed) but its file system has {format_bytes(room.free or 0)} free "
            f"({room.where}){held}; free {format_bytes(room.short)} there, or write {name} "
            "to a file system with room"
        )


def describe_room(room: Room) -> str:
    """The dry run's line: OUT's size and the free space where it goes."""
    size = f"{'at most ' if room.compressed else ''}{format_bytes(room.needed)}"
    size += " (compressed chunks)" if room.compressed else " (uncompressed)"
    if room.free is None:
        return f"{size}; free space not known at {room.where}"
    text = f"{size}; {format_bytes(room.free)} free at {room.where}"
    if room.held:
        text += f" (OUT holds {format_bytes(room.held)} already)"
    if room.short:
        text += f": does not fit, {format_bytes(room.short)} short (a real run is refused)"
    elif room.compressed and room.needed - room.held > room.free:
        text += ": fits only if its chunks compress"
    return text


def _nearest_folder(path: str) -> str:
    """``path`` or its nearest existing ancestor that is a folder."""
    while True:
        try:
            if stat.S_ISDIR(os.stat(path).st_mode):
                return path
        except OSError:
            pass
        parent = os.path.dirname(path)
        if parent == path:
            return path
        path = parent


def _folder_bytes(path: str) -> int:
    """Bytes on disk of the files under ``path``, links not followed."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total

"""Hostile-tree fuzzing with a second user: root runs jobs in folders another user shares.

``run_case(seed, folder)`` builds a seeded sandbox: ``private/`` (0700, root's: an empty target
folder per step, ``data/`` with a 0600 note, secret arrays whose values are SECRET), ``vault/``
(0711), and ``shared/``, a project folder that is either sticky (1777) or group-writable and
setgid (2775, group PLANTER_GID), holding root's identity B. Each step draws an attack
(KINDS), has the planter (tests/pipeline/planter.py: a child that drops to uid 65534) plant
it, before the job or during it (0-1.5 s after the job starts), runs the job as root and
checks tests/pipeline/planter_checks.py's invariants, with fuzz_tree's (exit 0/1/2, exit 2 is
one ``error:`` line, no traceback, within the time bound and RSS limit).

Attack kinds, SLOT:SHAPE:
- out, gram, report: OUT of multiply, G of gram, ``--report`` FILE is the planter's link to an
  empty root-only folder (link-empty), to root's non-empty folder or file (link-full), to a
  missing name in a root-only folder (dangling), through the planter's second link (chain),
  sits below the planter's link to a root-only folder (parent), or is the planter's own empty
  folder or file (owned);
- c: C of ``--accumulate`` is the planter's link (or chain) to root's private array, sits
  below the planter's link (parent), or is root's array in the shared folder whose chunk
  folder (chunkdir) or first chunk (chunk) the planter swapped for a link;
- read: the planter's input (v2 or v3, compressed or not) whose chunk, chunk folder or
  metadata, or the whole of which, is a link to root's secret array; a hard link of the secret
  chunk (hardlink: only where /proc/sys/fs/protected_hardlinks is 0);
- zip: the input is ``zip://a.zarr::shared/a-N.zip``, whose chunk member is a link to the
  secret (member-link) or inflates to 1 GiB (bomb), or the archive is a FIFO, a link to
  /dev/zero, or a link to root's 0600 zip of the secret;
- during: the planter swaps a link in at OUT, at OUT's parent, at a chunk of its input, at
  C's chunk folder or at the report, or an empty folder of its own at OUT, mid-job;
- moved: root's own link (to its secret array, or to a folder only root may write) or its
  0600 copy of a secret chunk, in ``lab/`` (2775, the planter's group), moved by the planter
  into the shared folder as its input, as OUT, or as a chunk of its input;
- control: nothing planted; the job must succeed (a checker that flags root's own writes, or a
  CLI that fails for some other reason, shows here).

Used by tests/pipeline/test_fuzz_planter.py and benchmarks/fuzz.py (``make fuzz``). Needs root.
"""

from __future__ import annotations

import functools
import io
import os
import random
import shutil
import stat
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from tests.pipeline import planter
from tests.pipeline.fuzz_tree import (
    QUIET,
    CaseResult,
    Command,
    Run,
    Step,
    _check_exit,
    run_measured,
)
from tests.pipeline.planter import PLANTER_GID, Op
from tests.pipeline.planter_checks import (
    MARKER,
    SECRET,
    Tree,
    is_under,
    link_verdicts,
    planter_links_in,
    planter_links_on,
    root_only_changes,
    secret_leaks,
    snapshot,
    unreadable_behind,
    written_into_planters,
)

TIMEOUT_S = 30.0
"""Wall-clock bound of one command (a clean one takes 1-3 s)."""
SHAPE, CHUNKS = (16, 8), (8, 8)
B = "shared/b.zarr"
"""Root's 8x8 identity: A @ B is A, so a leaked chunk reaches OUT verbatim."""
SLOT_SHAPES = ("link-empty", "link-full", "dangling", "chain", "parent", "owned")
KINDS = (
    *(f"{slot}:{shape}" for slot in ("out", "gram", "report") for shape in SLOT_SHAPES),
    *(f"c:{shape}" for shape in ("link", "chain", "parent", "chunkdir", "chunk")),
    *(f"read:{shape}" for shape in ("chunk", "chunkdir", "meta", "whole", "hardlink")),
    *(f"zip:{shape}" for shape in ("member-link", "bomb", "fifo", "dev-zero", "root-zip")),
    *(f"during:{shape}" for shape in ("out-link", "out-folder", "parent", "input-chunk",
                                      "c-chunkdir", "report")),
    *(f"moved:{shape}" for shape in ("input", "out", "chunk")),
    *(f"control:{shape}" for shape in ("multiply", "gram", "report", "accumulate")),
)  # fmt: skip


def hardlinks_protected() -> bool:
    """The kernel refuses a hard link to a file its maker may not read or write."""
    try:
        return Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "0"
    except OSError:
        return True


def plantable_kinds() -> tuple[str, ...]:
    return tuple(k for k in KINDS if not (k == "read:hardlink" and hardlinks_protected()))


@dataclass(frozen=True)
class Layout:
    fmt: int
    compressed: bool
    separator: str
    """Of the chunk keys: "/" for v3, "/" or "." for v2."""

    @property
    def keys(self) -> tuple[str, str]:
        prefix = "c/" if self.fmt == 3 else ""
        return (f"{prefix}0{self.separator}0", f"{prefix}1{self.separator}0")

    @property
    def documents(self) -> tuple[str, ...]:
        return ("zarr.json",) if self.fmt == 3 else (".zarray", ".zattrs")

    def describe(self) -> str:
        codec = "compressed" if self.compressed else "uncompressed"
        return f"v{self.fmt} {codec}, keys like {self.keys[0]}"


@dataclass
class Case:
    root: Path
    rng: random.Random
    data: np.random.Generator
    setup: list[str]

    @property
    def shared(self) -> Path:
        return self.root / "shared"

    def link(self, at: str, to: str) -> str:
        """The relative target of a link at ``shared/at`` to the sandbox's ``to``."""
        return os.path.relpath(self.root / to, (self.shared / at).parent)


@dataclass(frozen=True)
class Attack:
    kind: str
    command: Command
    """fuzz_tree's, its kind the attack's."""
    writes: tuple[str, ...]
    """Every path root was told to write (OUT, G or C, and the report)."""
    before: tuple[Op, ...]
    during: tuple[Op, ...] = ()
    delay_s: float = 0.0


# --- the sandbox -------------------------------------------------------------------------


def build_case(root: Path, seed: int) -> Case:
    root.mkdir(parents=True)
    root.chmod(0o755)
    case = Case(root, random.Random(seed), np.random.default_rng(seed), [])
    _root_folder(root / "private", 0o700)
    _root_folder(root / "private" / "data", 0o700)
    _root_file(root / "private" / "data" / "notes.txt", MARKER + b" notes of root's\n")
    _root_folder(root / "vault", 0o711)
    _root_folder(root / "lab", 0o2775)  # root's links and files, renamed by any member
    os.chown(root / "lab", 0, PLANTER_GID)
    _root_folder(case.shared, 0o1777)
    if case.rng.random() < 0.5:
        os.chown(case.shared, 0, PLANTER_GID)
        case.shared.chmod(0o2775)
        case.setup.append(f"shared/ 2775 root:{PLANTER_GID} (setgid, the planter's group)")
    else:
        case.setup.append("shared/ 1777 (sticky)")
    zarr.create_array(str(root / B), data=np.eye(CHUNKS[1]), chunks=CHUNKS)
    return case


def _root_folder(path: Path, mode: int) -> None:
    path.mkdir()
    path.chmod(mode)


def _root_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.write_bytes(data)
    path.chmod(mode)


def _write_array(path: Path, values: Any, layout: Layout, attributes: dict[str, Any]) -> None:
    v2: dict[str, Any] = {"name": "v2", "separator": layout.separator}
    zarr.create_array(
        str(path),
        data=values,
        chunks=CHUNKS,
        zarr_format=2 if layout.fmt == 2 else 3,
        compressors="auto" if layout.compressed else None,
        attributes=attributes,
        chunk_key_encoding=v2 if layout.fmt == 2 else None,
    )


def _root_array(
    path: Path, values: Any, layout: Layout, modes: tuple[int, int] = (0o700, 0o600), gid: int = 0
) -> None:
    """Root's array at ``path``: folders and files chmod'ed to ``modes``, group ``gid``."""
    secret = {"note": (MARKER + b" attributes").decode()} if np.isin(values, SECRET).any() else {}
    _write_array(path, values, layout, secret)
    for folder, _, files in os.walk(path):
        os.chown(folder, 0, gid)
        os.chmod(folder, modes[0])
        for name in files:
            os.chown(os.path.join(folder, name), 0, gid)
            os.chmod(os.path.join(folder, name), modes[1])


def _files(case: Case, values: Any, layout: Layout) -> dict[str, bytes]:
    """An array's files by relative path, staged outside the sandbox."""
    stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=case.root.parent)) / "a.zarr"
    try:
        _write_array(stage, values, layout, {})
        return {
            os.path.relpath(os.path.join(folder, name), stage): Path(folder, name).read_bytes()
            for folder, _, names in os.walk(stage)
            for name in names
        }
    finally:
        shutil.rmtree(stage.parent)


def _tree_ops(name: str, files: dict[str, bytes], skip: tuple[str, ...] = ()) -> list[Op]:
    """The planter's ops that write ``files`` under ``name``, leaving out those under ``skip``."""
    kept = {p: d for p, d in files.items() if not any(is_under(p, s) for s in skip)}
    folders = {str(Path(p).parent) for p in kept} | {str(Path(s).parent) for s in skip}
    ops: list[Op] = [("mkdir", name, 0o755)]
    for folder in sorted(f for f in folders if f != "."):
        parts = Path(folder).parts
        ops += [("mkdir", f"{name}/{'/'.join(parts[: n + 1])}", 0o755) for n in range(len(parts))]
    ops = list(dict.fromkeys(ops))  # each folder once, parents first
    return ops + [("write", f"{name}/{p}", d, 0o644) for p, d in sorted(kept.items())]


def _zip(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(f"a.zarr/{name}", data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(f"a.zarr/{name}")
            info.create_system, info.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


@functools.cache
def _bomb(metadata: bytes, key: str) -> bytes:
    """~1 MiB of zip whose member ``key`` inflates to 1 GiB of zeros."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("a.zarr/zarr.json", metadata)
        with archive.open(f"a.zarr/{key}", "w", force_zip64=True) as member:
            zeros = bytes(1 << 20)
            for _ in range(1024):
                member.write(zeros)
    return buffer.getvalue()


# --- attacks -----------------------------------------------------------------------------


def _multiply(kind: str, a: str, out: str, *more: str) -> Command:
    return Command(kind, ("multiply", a, B, out, *more, *QUIET), out, (a, B))


def _gram(kind: str, x: str, g: str) -> Command:
    return Command(kind, ("gram", x, g, *QUIET), g, (x,))


def prepare(case: Case, step: int, kind: str) -> Attack:
    """Root's side of ``kind`` (its secret, its targets, its C) made; the planter's listed."""
    rng, family, shape = case.rng, *kind.split(":")
    chunkdir = "chunkdir" in shape
    fmt = 3 if kind == "zip:bomb" else rng.choice([2, 3])
    separator = "/" if fmt == 3 or chunkdir else rng.choice(["/", "."])
    layout = Layout(fmt, rng.random() < 0.5 and kind != "zip:bomb", separator)
    case.setup.append(f"step {step}: {kind}, arrays {layout.describe()}")
    _root_folder(case.root / f"private/target-{step}", 0o700)
    area = "vault" if shape == "hardlink" else "private"
    modes = (0o711, 0o600) if shape == "hardlink" else (0o700, 0o600)
    _root_array(case.root / f"{area}/secret-{step}.zarr", SECRET.reshape(SHAPE), layout, modes)
    mine = case.data.uniform(-1, 1, SHAPE)
    a_files = _files(case, mine, layout)
    build = {"out": _slot, "gram": _slot, "report": _slot, "c": _c, "read": _read,
             "zip": _zip_input, "during": _during, "moved": _moved,
             "control": _control}[family]  # fmt: skip
    return build(case, step, kind, layout, a_files)


def _clean_input(step: int, a_files: dict[str, bytes]) -> tuple[str, list[Op]]:
    return f"shared/a-{step}.zarr", _tree_ops(f"a-{step}.zarr", a_files)


def _slot(case: Case, step: int, kind: str, layout: Layout, a_files: dict[str, bytes]) -> Attack:
    slot, shape = kind.split(":")
    a, ops = _clean_input(step, a_files)
    leaf = {"out": "out.zarr", "gram": "g.zarr", "report": "report.html"}[slot]
    name = f"{leaf.split('.')[0]}-{step}.{leaf.split('.')[1]}"
    file = "/report.html" if slot == "report" else ""
    dest = {
        "link-empty": f"private/target-{step}{file}",
        "link-full": "private/data" + ("/notes.txt" if file else ""),
        "dangling": f"private/new-{step}{file}",
    }.get(shape, f"private/target-{step}{file}")
    if shape == "owned":  # not a link: the planter's own empty folder (or file) at the target
        ops.append(("write", name, b"", 0o644) if file else ("mkdir", name, 0o755))
    elif shape == "parent":
        name = f"proj-{step}/{leaf}"
        ops.append(("symlink", case.link(f"proj-{step}", f"private/target-{step}"), f"proj-{step}"))
    elif shape == "chain":
        ops += [("symlink", case.link(f"hop-{step}", dest), f"hop-{step}"),
                ("symlink", f"hop-{step}", name)]  # fmt: skip
    else:
        ops.append(("symlink", case.link(name, dest), name))
    target = f"shared/{name}"
    if slot == "gram":
        return Attack(kind, _gram(kind, a, target), (target,), tuple(ops))
    if slot == "out":
        return Attack(kind, _multiply(kind, a, target), (target,), tuple(ops))
    out = f"shared/out-{step}.zarr"
    return Attack(kind, _multiply(kind, a, out, "--report", target), (out, target), tuple(ops))


def _root_c(case: Case, path: str, layout: Layout) -> None:
    """Root's C; in the shared folder its folders are the planter's to write in too."""
    values = case.data.uniform(-1, 1, SHAPE)
    if not path.startswith("shared/"):
        _root_array(case.root / path, values, layout)
    elif stat.S_IMODE(case.shared.stat().st_mode) == 0o1777:
        _root_array(case.root / path, values, layout, (0o777, 0o644))
    else:
        _root_array(case.root / path, values, layout, (0o2775, 0o664), PLANTER_GID)


def _c(case: Case, step: int, kind: str, layout: Layout, a_files: dict[str, bytes]) -> Attack:
    shape = kind.split(":")[1]
    a, ops = _clean_input(step, a_files)
    c, name = f"shared/c-{step}.zarr", f"c-{step}.zarr"
    if shape in ("link", "chain"):
        _root_c(case, f"private/cdata-{step}.zarr", layout)
        hop = f"hop-{step}" if shape == "chain" else name
        ops.append(("symlink", case.link(hop, f"private/cdata-{step}.zarr"), hop))
        ops += [("symlink", hop, name)] if shape == "chain" else []
    elif shape == "parent":
        _root_folder(case.root / f"private/cstore-{step}", 0o700)
        _root_c(case, f"private/cstore-{step}/c.zarr", layout)
        c = f"shared/proj-{step}/c.zarr"
        ops.append(("symlink", case.link(f"proj-{step}", f"private/cstore-{step}"), f"proj-{step}"))
    else:
        _root_c(case, c, layout)
        at = str(Path(layout.keys[0]).parent) if shape == "chunkdir" else layout.keys[0]
        to = f"private/target-{step}" if shape == "chunkdir" else f"private/secret-{step}.zarr/{at}"
        ops.append(("swap", case.link(f"{name}/{at}", to), f"{name}/{at}"))
    command = _multiply(kind, a, c, "--accumulate", "--beta", "2")
    return Attack(kind, command, (c,), tuple(ops))


def _read(case: Case, step: int, kind: str, layout: Layout, a_files: dict[str, bytes]) -> Attack:
    shape, name = kind.split(":")[1], f"a-{step}.zarr"
    secret = f"{'vault' if shape == 'hardlink' else 'private'}/secret-{step}.zarr"
    at = {
        "chunk": (case.rng.choice(layout.keys),),
        "hardlink": (layout.keys[0],),
        "chunkdir": (str(Path(layout.keys[0]).parent),),
        "meta": layout.documents,
    }.get(shape, ())
    ops = [] if shape == "whole" else _tree_ops(name, a_files, skip=at)
    for rel in at:
        if shape == "hardlink":  # its source is named from the planter's cwd, not the link's
            ops.append(("hardlink", case.link("here", f"{secret}/{rel}"), f"{name}/{rel}"))
        else:
            ops.append(("symlink", case.link(f"{name}/{rel}", f"{secret}/{rel}"), f"{name}/{rel}"))
    if shape == "whole":
        ops.append(("symlink", case.link(name, secret), name))
    return _read_command(case, step, kind, f"shared/{name}", ops)


def _read_command(case: Case, step: int, kind: str, a: str, ops: list[Op]) -> Attack:
    if case.rng.random() < 0.5:
        return Attack(kind, _gram(kind, a, f"shared/g-{step}.zarr"), (f"shared/g-{step}.zarr",),
                      tuple(ops))  # fmt: skip
    out = f"shared/out-{step}.zarr"
    return Attack(kind, _multiply(kind, a, out), (out,), tuple(ops))


def _zip_input(
    case: Case, step: int, kind: str, layout: Layout, a_files: dict[str, bytes]
) -> Attack:
    shape, name = kind.split(":")[1], f"a-{step}.zip"
    key = layout.keys[0]
    if shape == "member-link":
        secret = str(case.root / f"private/secret-{step}.zarr/{key}")
        data = _zip({p: d for p, d in a_files.items() if p != key}, {key: secret})
        ops: list[Op] = [("write", name, data, 0o644)]
    elif shape == "bomb":
        ops = [("write", name, _bomb(a_files["zarr.json"], key), 0o644)]
    elif shape == "fifo":
        ops = [("fifo", name)]
    elif shape == "dev-zero":
        ops = [("symlink", "/dev/zero", name)]
    else:  # root-zip: root's 0600 zip of its secret array, and the planter's link to it
        own = case.root / f"private/secret-{step}.zarr"
        files = {str(p.relative_to(own)): p.read_bytes() for p in own.rglob("*") if p.is_file()}
        _root_file(case.root / f"private/secret-{step}.zip", _zip(files))
        ops = [("symlink", case.link(name, f"private/secret-{step}.zip"), name)]
    return _read_command(case, step, kind, f"zip://a.zarr::shared/{name}", ops)


def _during(case: Case, step: int, kind: str, layout: Layout, a_files: dict[str, bytes]) -> Attack:
    shape, delay = kind.split(":")[1], round(case.rng.uniform(0.0, 1.5), 2)
    a, ops = _clean_input(step, a_files)
    out, target = f"out-{step}.zarr", f"private/target-{step}"
    if shape in ("out-link", "out-folder"):
        swap: Op = ("swap", case.link(out, target), out) if shape == "out-link" else ("folder", out)
        command = _multiply(kind, a, f"shared/{out}")
    elif shape == "parent":
        ops.append(("mkdir", f"proj-{step}", 0o755))
        swap = ("swap", case.link(f"proj-{step}", target), f"proj-{step}")
        command = _multiply(kind, a, f"shared/proj-{step}/out.zarr")
    elif shape == "input-chunk":
        key = f"a-{step}.zarr/{case.rng.choice(layout.keys)}"
        secret = f"private/secret-{step}.zarr/{key.split('/', 1)[1]}"
        attack = _read_command(case, step, kind, a, ops)
        return Attack(kind, attack.command, attack.writes, attack.before,
                      (("swap", case.link(key, secret), key),), delay)  # fmt: skip
    elif shape == "c-chunkdir":
        _root_c(case, f"shared/c-{step}.zarr", layout)
        at = f"c-{step}.zarr/{Path(layout.keys[0]).parent}"
        swap = ("swap", case.link(at, target), at)
        command = _multiply(kind, a, f"shared/c-{step}.zarr", "--accumulate", "--beta", "2")
    else:  # report
        swap = ("swap", case.link(f"report-{step}.html", "private/data/notes.txt"),
                f"report-{step}.html")  # fmt: skip
        command = _multiply(kind, a, f"shared/{out}", "--report", f"shared/report-{step}.html")
    writes = tuple(w for w in command.argv if w.startswith("shared/") and w not in command.operands)
    return Attack(kind, command, writes, tuple(ops), (swap,), delay)


def _moved(case: Case, step: int, kind: str, layout: Layout, a_files: dict[str, bytes]) -> Attack:
    """Root's own link or file in ``lab/`` (2775, the planter's group) moved by the planter
    into the shared folder: who owns a name says nothing of who put it there."""
    shape, lab = kind.split(":")[1], case.root / "lab"
    if shape == "input":  # root's link to its secret array, now the planter's "input"
        (lab / f"data-{step}").symlink_to(case.root / f"private/secret-{step}.zarr")
        ops: list[Op] = [("move", f"../lab/data-{step}", f"a-{step}.zarr")]
        return _read_command(case, step, kind, f"shared/a-{step}.zarr", ops)
    if shape == "out":  # root's link to a folder only root may write, now at OUT's path
        (lab / f"results-{step}").symlink_to(case.root / f"private/target-{step}")
        a, ops = _clean_input(step, a_files)
        ops.append(("move", f"../lab/results-{step}", f"out-{step}.zarr"))
        out = f"shared/out-{step}.zarr"
        return Attack(kind, _multiply(kind, a, out), (out,), tuple(ops))
    key = case.rng.choice(layout.keys)  # chunk: root's 0600 copy of a secret chunk, moved in
    secret = case.root / f"private/secret-{step}.zarr/{key}"
    _root_file(lab / f"chunk-{step}", secret.read_bytes())
    ops = _tree_ops(f"a-{step}.zarr", a_files, skip=(key,))
    ops.append(("move", f"../lab/chunk-{step}", f"a-{step}.zarr/{key}"))
    return _read_command(case, step, kind, f"shared/a-{step}.zarr", ops)


def _control(case: Case, step: int, kind: str, layout: Layout, a_files: dict[str, bytes]) -> Attack:
    shape = kind.split(":")[1]
    a, ops = _clean_input(step, a_files)
    out, c = f"shared/out-{step}.zarr", f"shared/c-{step}.zarr"
    if shape == "gram":
        return Attack(kind, _gram(kind, a, f"shared/g-{step}.zarr"), (f"shared/g-{step}.zarr",),
                      tuple(ops))  # fmt: skip
    if shape == "accumulate":
        _root_c(case, c, layout)
        command = _multiply(kind, a, c, "--accumulate", "--beta", "2")
        return Attack(kind, command, (c,), tuple(ops))
    more = ("--report", f"shared/report-{step}.html") if shape == "report" else ()
    return Attack(kind, _multiply(kind, a, out, *more), (out, *more[1:]), tuple(ops))


# --- one case ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Watch:
    """What is known before the command runs."""

    tree: Tree
    exempt: tuple[str, ...]
    """Targets with no planter link on their way: root may write there."""
    on_the_way: tuple[tuple[str, str], ...]
    unreadable: tuple[tuple[str, str, str], ...]


def watch(case: Case, attack: Attack) -> Watch:
    root = case.root
    on_the_way = [(t, link) for t in attack.writes for link in planter_links_on(root, t)]
    c = attack.command.target
    if "--accumulate" in attack.command.argv and c and _is_folder(root / c):
        on_the_way += [(c, link) for link in planter_links_in(root, c)]
    unreadable = []
    for operand in attack.command.operands:
        local = operand.rsplit("::", 1)[-1]
        links = planter_links_on(root, local)
        links += planter_links_in(root, local) if _is_folder(root / local) else []
        for link in links:
            if real := unreadable_behind(root, link):
                unreadable.append((operand, link, real))
    exempt = tuple(t for t in attack.writes if not planter_links_on(root, t))
    return Watch(snapshot(root), exempt, tuple(on_the_way), tuple(unreadable))


def _is_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def check_step(case: Case, attack: Attack, seen: Watch, run: Run, stdout: str) -> list[str]:
    """Every invariant the step broke, one line each."""
    after = snapshot(case.root)
    found = _check_exit(attack.command, run)
    found += [f"root-only: {v}" for v in root_only_changes(seen.tree, after, seen.exempt)]
    texts = {"stderr": run.stderr, "stdout": stdout}
    found += [f"leak: {v}" for v in secret_leaks(case.root, seen.tree, after, texts)]
    found += link_verdicts(run, seen.on_the_way, seen.unreadable)
    owned = written_into_planters(case.root, seen.tree, after, attack.writes)
    found += [f"owner: {v}" for v in owned]
    if attack.kind.startswith("control:") and run.rc != 0:
        found.append(f"control: exit {run.rc} on a job with nothing planted")
    return found


def run_step(case: Case, step: int, kind: str, timeout_s: float = TIMEOUT_S) -> Step:
    attack = prepare(case, step, kind)
    done = planter.plant(case.shared, attack.before)
    seen = watch(case, attack)
    out = case.root.parent / f".stdout-{case.root.name}-{step}"
    started = time.monotonic()
    pending = planter.start(case.shared, attack.during, attack.delay_s) if attack.during else None
    run = run_measured(attack.command.argv, case.root, timeout_s, stdout=out)
    during = pending.finish(10.0) if pending else []
    stdout = out.read_text(errors="replace")
    out.unlink()
    planted = [f"[{kind}]"] + [d.describe() for d in done if d.error or _shown(d.what)]
    planted += [
        f"during, at {d.at - started:.2f} s of the job's {run.seconds:.2f} s"
        + (" (after it ended)" if d.at - started > run.seconds else "")
        + f": {d.describe()}"
        for d in during
    ]
    return Step(attack.command, run, planted, check_step(case, attack, seen, run, stdout))


def _shown(what: str) -> bool:
    """Ops worth a line in a report: not the planter's own array files."""
    return not what.endswith((": mkdir", " bytes")) or ".zip" in what


def run_case(
    seed: int,
    folder: Path,
    commands: int = 2,
    timeout_s: float = TIMEOUT_S,
    kinds: tuple[str, ...] | None = None,
) -> CaseResult:
    """Seed's sandbox under ``folder`` and ``commands`` steps on it, each a random attack of
    ``kinds`` (default: every kind this kernel lets the planter plant)."""
    case = build_case(folder / f"planter-{seed}", seed)
    choices = kinds or plantable_kinds()
    steps = [run_step(case, n, case.rng.choice(choices), timeout_s) for n in range(commands)]
    return CaseResult(seed, case.setup, steps)

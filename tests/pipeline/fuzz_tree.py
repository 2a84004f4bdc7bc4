"""Hostile-tree fuzzing of the CLI, the way trusted file tools are tested.

``run_case(seed, folder)`` builds a seeded sandbox (small inputs, sometimes an OUT of an earlier
real run, a C for --accumulate, foreign files and arrays), plants hostile things at random
places (links of every kind, FIFOs, folders where files belong, sparse 3 GiB files, links to
devices, look-alike names, planted sidecars, hard links of foreign files), runs random commands
on it and checks the contract after each:

- nothing outside what the command may write (OUT; for --accumulate C's chunk keys, its lock and
  its ``.tilegemm-accumulate/``; nothing for ``verify``) is created, changed or deleted, by
  digests of the whole tree before and after; foreign things planted inside OUT survive too;
- exit 0, 1 or 2; exit 2 is one ``error:`` line; no traceback, no MemoryError;
- exit 0 means right numbers (float64 numpy on what zarr reads from the inputs beforehand);
- an end within the time bound, and peak RSS within RSS_LIMIT_BYTES.

Used by tests/pipeline/test_fuzz_tree.py (fixed seeds) and benchmarks/fuzz.py (``make fuzz``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from cluster.tuning import worker_config
from tests.child_env import child_env

MiB, GiB = 2**20, 2**30
TIMEOUT_S = 60.0
"""Wall-clock bound of one command; a command still running then is a hang."""
ADDRESS_SPACE_BYTES = 4 * GiB
"""RLIMIT_AS of the child (and its workers): an attempt to hold a 3 GiB file fails, not swaps."""
RSS_LIMIT_BYTES = 1 * GiB
"""Peak RSS of any process of a command above this is a failure (a clean run is ~100 MiB)."""
HASH_LIMIT_BYTES = 64 * MiB
"""Larger files (the sparse ones) are described by type, size, mtime and inode, not read."""
BIG_BYTES = 3 << 30
SHAPES = {"a.zarr": (24, 16), "b.zarr": (16, 12), "c.zarr": (24, 12), "other.zarr": (24, 12)}
HEX = "0123456789abcdef0123456789abcdef"
LOOKALIKES = ("2024.06", "3.14", "c/9/9", ".zattrs", "zarr.json.bak", "KEY.orig",
              "journal/tile-99-0.json", "report.html")  # fmt: skip
"""Names an array of ours never holds (KEY: its first chunk key): foreign wherever planted."""
OWNED = ("lock.json", "inputs.json", "journal", "journal/tile-0-0.json", "META", "c", "c/0",
         ".tilegemm-accumulate", ".tilegemm-accumulate/state.json",
         "KEY", f"KEY.{HEX}.partial")  # fmt: skip
"""Names of ours (META: the metadata document), or sidecars and chunk folders in a C."""
METADATA = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")
"""Every document zarr may read when it opens an array."""
WRITES = ("multiply", "overwrite", "resume", "gram", "random", "random-overwrite")


@dataclass(frozen=True)
class Command:
    kind: str
    """One of WRITES, ``accumulate`` or ``verify``."""
    argv: tuple[str, ...]
    """After ``python -m pipeline``; paths relative to the sandbox (the child's cwd)."""
    target: str | None
    """OUT, G or C as given, relative to the sandbox; None for verify."""
    operands: tuple[str, ...]
    """A and B (X for gram; A, B, C for verify)."""


@dataclass(frozen=True)
class Run:
    rc: int | None
    """None: killed at the time bound."""
    seconds: float
    max_rss_bytes: int
    stderr: str


@dataclass
class Sandbox:
    root: Path
    rng: random.Random
    ours: set[str] = field(default_factory=set)
    """Top-level names the tool wrote (arrays of ours)."""
    planted: list[str] = field(default_factory=list)
    precious: set[str] = field(default_factory=set)
    """Planted paths (relative) no command may change, wherever they are."""


@dataclass(frozen=True)
class Before:
    """What is known before a command runs."""

    tree: dict[str, tuple[Any, ...]]
    """describe_tree of the sandbox."""
    allowed: Any
    """may_change's predicate."""
    want: tuple[Any, str]
    """expected's values and tolerance dtype."""


@dataclass
class Step:
    command: Command
    run: Run
    planted: list[str]
    violations: list[str]

    def report(self) -> str:
        argv = " ".join(self.command.argv)
        head = (
            f"  $ python -m pipeline {argv}\n    rc {self.run.rc}, {self.run.seconds:.1f} s, "
            f"{self.run.max_rss_bytes / MiB:.0f} MiB; planted before it: "
            + ("; ".join(self.planted) or "nothing")
        )
        lines = [head, *(f"    VIOLATION {v}" for v in self.violations)]
        if self.violations and self.run.stderr.strip():
            lines.append("    stderr: " + self.run.stderr.strip()[-600:].replace("\n", "\n      "))
        return "\n".join(lines)


@dataclass
class CaseResult:
    seed: int
    setup: list[str]
    steps: list[Step]
    errors: list[str] = field(default_factory=list)
    """The fuzzer's own failures (a sandbox it could not build)."""

    @property
    def violations(self) -> list[str]:
        return self.errors + [v for step in self.steps for v in step.violations]

    def report(self) -> str:
        head = f"seed {self.seed}: " + "; ".join(self.setup)
        return "\n".join([head, *(step.report() for step in self.steps)])


# --- the sandbox -------------------------------------------------------------------------


def build_sandbox(root: Path, seed: int, timeout_s: float = TIMEOUT_S) -> tuple[Sandbox, list[str]]:
    """Inputs, foreign files, and by chance an OUT of a real run, a C and links to them."""
    root.mkdir(parents=True)
    sandbox = Sandbox(root, random.Random(seed))
    rng, data = sandbox.rng, np.random.default_rng(seed)
    setup = []
    for name in ("a.zarr", "b.zarr"):
        setup.append(_write_array(sandbox, name, data))
    (root / "alink").symlink_to("a.zarr")
    (root / "notes.txt").write_text("years of work\n")
    (root / "docs").mkdir()
    (root / "docs" / "thesis.tex").write_text("\\begin{document}\n")
    setup.append(_write_array(sandbox, "other.zarr", data, fmt=3, dtype="float32"))
    if rng.random() < 0.5:
        done = run_measured(("multiply", "a.zarr", "b.zarr", "out.zarr", *QUIET), root, timeout_s)
        if done.rc != 0:
            raise RuntimeError(f"seed {seed}: the clean multiply failed: {done.stderr[-400:]}")
        sandbox.ours.add("out.zarr")
        setup.append("out.zarr by a real multiply")
    if rng.random() < 0.6:
        setup.append(_write_array(sandbox, "c.zarr", data))
    if rng.random() < 0.4:
        to = rng.choice(
            [n for n in ("out.zarr", "other.zarr", "docs", "c.zarr") if _exists(root, n)]
        )
        (root / "outlink").symlink_to(to)
        setup.append(f"outlink -> {to}")
    for name, make in (("fifo.zarr", "fifo"), ("dangling.zarr", "dangling"), ("loop.zarr", "loop")):
        if rng.random() < 0.1:
            _plant_thing(sandbox, name, make)
            setup.append(f"{name}: {make}")
    return sandbox, setup


QUIET = ("--no-progress", "--dashboard-address", "127.0.0.1:0")


def _write_array(
    sandbox: Sandbox, name: str, data: np.random.Generator, fmt: int = 0, dtype: str = ""
) -> str:
    rng = sandbox.rng
    fmt = fmt or rng.choice([3, 3, 3, 2])
    dtype = dtype or rng.choice(["float32"] * 4 + ["float64"])
    chunks = rng.choice([(8, 8), (8, 8), (8, 4), (12, 8), (5, 7)])
    values = data.uniform(-1, 1, SHAPES[name]).astype(dtype)
    zarr.create_array(str(sandbox.root / name), data=values, chunks=chunks, zarr_format=fmt)  # type: ignore[arg-type]
    return f"{name} {dtype} v{fmt} chunks {chunks[0]}x{chunks[1]}"


def _exists(root: Path, name: str) -> bool:
    return os.path.lexists(root / name)


# --- hostile things ----------------------------------------------------------------------


def plant(sandbox: Sandbox, command: Command, count: int) -> list[str]:
    """``count`` hostile things, most inside the command's target, the rest anywhere."""
    rng, done = sandbox.rng, []
    hosts = [
        h for h in ("a.zarr", "b.zarr", "c.zarr", "out.zarr", "other.zarr") if _is_dir(sandbox, h)
    ]
    target = _resolved(sandbox, command.target or command.operands[-1])
    for _ in range(count):
        host = target if target and _is_dir(sandbox, target) and rng.random() < 0.7 else None
        host = host or rng.choice(hosts)
        site = _site(sandbox, host)
        what = _choose_thing(rng, site)
        if _plant_thing(sandbox, f"{host}/{site}", what):
            done.append(f"{host}/{site}: {what}")
            if _foreign_name(sandbox, host, site):
                sandbox.precious.add(f"{host}/{site}")
    if command.operands and rng.random() < 0.3:  # something an input's reader meets
        host = rng.choice([o for o in command.operands if _resolved(sandbox, o)])
        host = _resolved(sandbox, host) or host
        meta = array_meta(sandbox.root / host)
        if meta:
            site = rng.choice(meta["keys"])
            what = rng.choice(["fifo", "sparse", "link:/dev/zero", "link:/dev/urandom", "folder",
                               "junk", "link:self", "link:b.zarr/KEY", "hardlink"])  # fmt: skip
            if _plant_thing(sandbox, f"{host}/{site}", what):
                done.append(f"{host}/{site}: {what}")
    sandbox.planted.extend(done)
    return done


def _site(sandbox: Sandbox, host: str) -> str:
    meta = array_meta(sandbox.root / host)
    key = sandbox.rng.choice(meta["keys"]) if meta else "c/0/0"
    name = sandbox.rng.choice(OWNED + LOOKALIKES if sandbox.rng.random() < 0.6 else LOOKALIKES)
    return name.replace("META", meta["document"] if meta else "zarr.json").replace("KEY", key)


def _foreign_name(sandbox: Sandbox, host: str, site: str) -> bool:
    meta = array_meta(sandbox.root / host)
    keys = meta["keys"] if meta else ["c/0/0"]
    foreign = {n.replace("KEY", key) for n in LOOKALIKES for key in keys}
    return site in foreign and not (site == ".zattrs" and meta and meta["format"] == 2)


def _choose_thing(rng: random.Random, site: str) -> str:
    things = ["link", "link", "link", "fifo", "folder", "sparse", "junk", "hardlink"]
    if site.endswith(".json"):
        things += ["lockjson", "jsonlist", "jsonlist"] if "lock" in site else ["jsonlist"] * 2
    thing = rng.choice(things)
    if thing == "link":
        return "link:" + rng.choice(
            [
                "a.zarr/META",
                "a.zarr/KEY",
                "a.zarr",
                "out.zarr",
                "c.zarr",
                "notes.txt",
                "docs",
                "nowhere",
                "self",
                "..",
                "/dev/zero",
                "/dev/urandom",
            ]  # fmt: skip
        )
    return thing


def _plant_thing(sandbox: Sandbox, relative: str, what: str) -> bool:
    """Put ``what`` at ``relative`` (replacing what is there); False where a parent is not a
    plain folder (an earlier plant took its place)."""
    path = sandbox.root / relative
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(parent) or not parent.is_dir():
            return False
        if os.path.lexists(path):
            _remove(path)
    except OSError:
        return False
    _make(sandbox, path, what)
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _remove(child)
        path.rmdir()
    else:
        path.unlink()


def _make(sandbox: Sandbox, path: Path, what: str) -> None:
    root = sandbox.root
    if what.startswith("link:"):
        _make_link(root, path, what.removeprefix("link:"))
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "folder":
        path.mkdir()
        (path / "inside").write_text("a folder where a file belongs\n")
    elif what == "sparse":
        with path.open("wb") as f:
            f.truncate(BIG_BYTES)
    elif what == "junk":
        path.write_bytes(sandbox.rng.randbytes(sandbox.rng.choice([0, 1, 7, 300, 5000])))
    elif what == "lockjson":
        record = {"pid": 1, "host": "elsewhere", "started": 0.0, "process_started": 0, "token": "x"}
        path.write_text(json.dumps(record))
    elif what == "jsonlist":
        path.write_text(json.dumps([1, "tile", None]))
    elif what == "hardlink":
        os.link(root / "notes.txt", path)
    elif what in ("dangling", "loop"):
        path.symlink_to("nowhere/deeper" if what == "dangling" else path.name)


def _make_link(root: Path, path: Path, to: str) -> None:
    if to == "self":
        path.symlink_to(path.name)
    elif to == "..":
        path.symlink_to("..")
    elif to.startswith("/dev/"):
        path.symlink_to(to)
    else:  # META and KEY: the metadata document and first chunk key of the array named
        meta = array_meta(root / to.split("/")[0])
        to = to.replace("META", meta["document"] if meta else "zarr.json")
        to = to.replace("KEY", meta["keys"][0] if meta else "c/0/0")
        path.symlink_to(os.path.relpath(root / to, path.parent))


# --- commands ----------------------------------------------------------------------------


PLACES = ("out.zarr", "other.zarr", "docs", "notes.txt", "outlink", "c.zarr", "fifo.zarr",
          "dangling.zarr", "loop.zarr", "new.zarr")  # fmt: skip
"""Where a command's OUT (or C) may point: ours, foreign, hostile, new."""
FAVOURITE = {"overwrite": "out.zarr", "resume": "out.zarr", "random-overwrite": "out.zarr",
             "accumulate": "c.zarr", "verify": "out.zarr"}  # fmt: skip
"""Half the time a command gets the target it can work on (else: new.zarr), so that hostile
things meet running jobs, not only refusals."""


def choose_command(sandbox: Sandbox) -> Command:
    rng, root = sandbox.rng, sandbox.root
    kind = rng.choice([*WRITES, "overwrite", "resume", "accumulate", "accumulate", "verify"])
    places = [n for n in PLACES if _exists(root, n) or n == "new.zarr"]
    favourite = FAVOURITE.get(kind, "new.zarr")
    target = favourite if _exists(root, favourite) and rng.random() < 0.5 else rng.choice(places)
    a = rng.choice(["a.zarr", "a.zarr", "alink"])
    if kind == "verify":
        return Command(
            kind, ("verify", a, "b.zarr", target, "--no-progress"), None, (a, "b.zarr", target)
        )
    if kind == "accumulate":
        argv = ("multiply", a, "b.zarr", target, "--accumulate", "--beta", "2", *QUIET)
        return Command(kind, argv, target, (a, "b.zarr"))
    if kind.startswith("random"):
        seed = str(rng.randrange(100))
        more = ("--overwrite",) if kind == "random-overwrite" else ()
        shape = ("--shape", "24x12", "--chunks", "8x5", "--seed", seed)
        return Command(kind, ("random", target, *shape, *more), target, ())
    flag = {"overwrite": ("--overwrite",), "resume": ("--resume",)}.get(kind, ())
    if kind == "gram":  # sometimes X is G itself, or reaches it through a link
        x = rng.choice(["a.zarr", "a.zarr", "alink", target])
        return Command(
            kind, ("gram", x, target, *rng.choice([(), ("--overwrite",)]), *QUIET), target, (x,)
        )
    return Command(kind, ("multiply", a, "b.zarr", target, *flag, *QUIET), target, (a, "b.zarr"))


LAUNCHER = """
import os, resource, sys
limit, report, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
pid = os.fork()
if pid == 0:
    os.execv(argv[0], argv)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss * 1024}")
"""
"""Runs the command as a child of a small process: the child's ru_maxrss then starts from this
launcher's few MiB, not from the fuzzer's (a process's high-water mark survives fork and exec)."""


def run_measured(
    argv: tuple[str, ...], cwd: Path, timeout_s: float = TIMEOUT_S, stdout: Path | None = None
) -> Run:
    """``python -m pipeline argv`` in ``cwd`` under RLIMIT_AS, in its own session: its exit
    code, seconds, peak RSS of any of its processes (wait4's and /proc's VmHWM), stderr.
    ``stdout``: a file to keep the command's stdout in (default: discarded)."""
    env = child_env({"DASK_TILEGEMM__HOST_PROBE": "False"})
    for key, value in worker_config().items():
        env["DASK_" + key.upper().replace(".", "__").replace("-", "_")] = str(value)
    scratch = cwd.parent / f".run-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    with scratch.with_suffix(".err").open("w+") as stderr, open(stdout or os.devnull, "w") as out:
        launcher = [sys.executable, "-S", "-c", LAUNCHER, str(ADDRESS_SPACE_BYTES), str(scratch)]
        proc = subprocess.Popen(
            [*launcher, sys.executable, "-m", "pipeline", *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=stderr,
            start_new_session=True,
        )
        peak = _wait(proc, start + timeout_s)
        seconds = time.monotonic() - start
        stderr.seek(0)
        text = stderr.read()[-20000:]
    scratch.with_suffix(".err").unlink()
    rc = None
    if scratch.exists():
        code, rss = scratch.read_text().split()
        rc, peak = int(code), max(peak, int(rss))
        scratch.unlink()
    return Run(rc, seconds, peak, text)


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> int:
    """Wait for the launcher (killing its session at ``deadline``); the largest VmHWM seen."""
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _session_hwm(proc.pid))
        if time.monotonic() > deadline:
            _kill_session(proc.pid)
            proc.wait()
        time.sleep(0.02)
    _kill_session(proc.pid)  # workers left behind, if any
    return peak


def _kill_session(sid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)


def _session_hwm(sid: int) -> int:
    """The largest VmHWM among live processes of session ``sid``, in bytes."""
    peak = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:  # state ppid pgrp session
                continue
            with open(f"/proc/{entry.name}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except (OSError, IndexError, ValueError):
            continue
    return peak


# --- the invariants ----------------------------------------------------------------------


def describe_tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every path under ``root`` (links not followed): a file's sha256 (type, size, mtime and
    inode where it is not a regular file of at most HASH_LIMIT_BYTES), a link's target."""
    entries: dict[str, tuple[Any, ...]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            entries[os.path.relpath(path, root)] = _describe(path)
    return entries


def _describe(path: str) -> tuple[Any, ...]:
    try:
        st = os.lstat(path)
    except OSError as e:
        return ("unreadable", e.errno)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir",)
    if not stat.S_ISREG(st.st_mode) or st.st_size > HASH_LIMIT_BYTES:
        return (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        return ("file", hashlib.sha256(f.read()).hexdigest()[:16])


def array_meta(path: Path) -> dict[str, Any] | None:
    """An array's metadata document, format, shape and chunk keys, read only where each is a
    regular file (links followed) of at most 1 MiB; None where it is not an array."""
    for document, fmt in (("zarr.json", 3), (".zarray", 2)):
        raw = _small_file(path / document, MiB)
        if raw is None:
            continue
        try:
            meta = json.loads(raw)
            if fmt == 3:
                chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
                encoding = meta.get("chunk_key_encoding", {})
                sep = encoding.get("configuration", {}).get("separator", "/")
                prefix = "c" + sep if encoding.get("name", "default") == "default" else ""
            else:
                chunks, sep, prefix = meta["chunks"], meta.get("dimension_separator") or ".", ""
            shape = [int(n) for n in meta["shape"]]
            grid = [-(-n // int(c)) for n, c in zip(shape, chunks, strict=True)]
        except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
            return None
        if len(grid) != 2 or grid[0] * grid[1] > 10_000:
            return None
        keys = [f"{prefix}{i}{sep}{j}" for i in range(grid[0]) for j in range(grid[1])]
        return {"document": document, "format": fmt, "shape": shape, "keys": keys or ["c/0/0"]}
    return None


def _readable(path: Path) -> bool:
    """Safe to leave to zarr: no FIFO, device or file over HASH_LIMIT_BYTES behind ``path``.
    zarr reads a missing chunk, a dangling link, a folder and a path through a file as the
    fill value, and fails on a link loop: the oracle takes what zarr does."""
    try:
        st = os.stat(path)
    except OSError:
        return True
    return stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_size <= HASH_LIMIT_BYTES)


def _small_file(path: Path, limit: int) -> bytes | None:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            return f.read(limit + 1)
    except OSError:
        return None


def read_array(path: Path) -> np.ndarray[Any, Any] | None:
    """What zarr reads at ``path`` (links followed), or None where that would touch anything
    but small regular files (a FIFO, a device, a sparse file, a loop) or zarr fails."""
    meta = array_meta(path)
    if meta is None or not all(_readable(path / key) for key in [*meta["keys"], *METADATA]):
        return None
    try:
        array = zarr.open_array(str(path), mode="r", zarr_format=meta["format"])
        return np.asarray(array[...])
    except Exception:  # noqa: BLE001 - any failure of zarr's means "not a readable array"
        return None


def _resolved(sandbox: Sandbox, name: str | None) -> str | None:
    """``name`` with links resolved, relative to the sandbox; None where it leaves it."""
    if name is None:
        return None
    real = os.path.realpath(sandbox.root / name)
    rel = os.path.relpath(real, os.path.realpath(sandbox.root))
    return None if rel.startswith("..") else rel


def _is_dir(sandbox: Sandbox, name: str) -> bool:
    return (sandbox.root / name).is_dir() and not (sandbox.root / name).is_symlink()


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base + "/")


def may_change(sandbox: Sandbox, command: Command) -> Any:
    """A predicate on relative paths: may ``command`` create, change or delete this one?"""
    if command.target is None:
        return lambda path: False
    resolved = _resolved(sandbox, command.target)
    names = {command.target} | ({resolved} if resolved not in (None, ".") else set())
    if command.kind == "accumulate":
        rules = [_c_rule(sandbox, name) for name in names]
        return lambda path: path not in sandbox.precious and any(rule(path) for rule in rules)
    existed = _exists(sandbox.root, command.target)
    # a foreign OUT (anything there the tool did not write) is refused, never replaced
    mine = {n for n in names if not existed or n.split("/")[0] in sandbox.ours}
    if existed and command.target not in sandbox.ours and not mine:
        return lambda path: False
    if existed and os.path.islink(sandbox.root / command.target):
        mine.add(command.target)  # the link itself may be replaced by OUT
    return lambda path: path not in sandbox.precious and any(_under(path, n) for n in mine)


def _c_rule(sandbox: Sandbox, name: str) -> Any:
    meta = array_meta(sandbox.root / name)
    if meta is None:
        return lambda path: False
    writable = {f"{name}/{key}" for key in meta["keys"]}
    partial = re.compile(r"(?P<key>.+)\.[0-9a-f]{32}\.partial")  # zarr's and ours: garbage
    folders = {str(Path(key).parent) for key in writable} - {name}
    return lambda path: (
        path in writable or path in folders or path == f"{name}/lock.json"
        or ((m := partial.fullmatch(path)) is not None and m["key"] in writable)
        or _under(path, f"{name}/.tilegemm-accumulate")
    )  # fmt: skip


def expected(sandbox: Sandbox, command: Command) -> tuple[Any, str]:
    """(the values exit 0 must leave in the target, or None where an operand is unreadable
    or hostile; the tolerance's dtype)."""
    root, argv = sandbox.root, command.argv
    if command.kind.startswith("random"):
        seed = int(argv[argv.index("--seed") + 1])
        return _random_values(seed, (24, 12), (8, 5)), "float32"
    read = [read_array(root / name) for name in command.operands]
    arrays = [a for a in read if a is not None]
    if len(arrays) < len(read):
        return None, ""
    if command.kind == "gram":
        (x,) = arrays
        return x.T.astype(np.float64) @ x.astype(np.float64), x.dtype.name
    a, b = arrays[:2]
    if a.shape[1] != b.shape[0]:
        return None, ""
    product = a.astype(np.float64) @ b.astype(np.float64)
    narrow = "float32" if "float32" in (a.dtype.name, b.dtype.name) else "float64"
    if command.kind != "accumulate":
        return product, narrow
    c = read_array(root / command.target) if command.target else None
    if c is None or c.shape != product.shape:
        return None, ""
    return 2.0 * c.astype(np.float64) + product, "float32" if c.dtype == np.float32 else narrow


def _random_values(seed: int, shape: tuple[int, int], chunks: tuple[int, int]) -> Any:
    """pipeline.generate's values, written out again (each chunk seeded by its grid index)."""
    out = np.empty(shape, np.float32)
    for i in range(0, shape[0], chunks[0]):
        for j in range(0, shape[1], chunks[1]):
            rows, cols = min(chunks[0], shape[0] - i), min(chunks[1], shape[1] - j)
            rng = np.random.default_rng([seed, i // chunks[0], j // chunks[1]])
            out[i : i + rows, j : j + cols] = rng.uniform(-1.0, 1.0, size=(rows, cols))
    return out.astype(np.float64)


def close(got: Any, want: Any, dtype: str, scale: Any) -> str | None:
    """None where ``got`` equals ``want`` within float32's (1e-4) or float64's (1e-10) relative
    tolerance of ``scale`` (|A|·|B|-like); else what is wrong."""
    if got is None:
        return "it cannot be read back as an array (a missing, hostile or broken chunk)"
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    rtol = 1e-4 if dtype == "float32" else 1e-10
    error = np.abs(got.astype(np.float64) - want)
    bound = rtol * (scale + 1e-30)
    if not (error <= bound).all():  # NaN fails too
        worst = np.unravel_index(np.nanargmax(np.where(error <= bound, 0, 1 + error)), error.shape)
        return f"value {got[worst]} at {worst}, expected {want[worst]:.6g}"
    return None


def check_step(sandbox: Sandbox, command: Command, run: Run, before: Before) -> list[str]:
    """Every invariant ``command`` broke, one line each."""
    found = _check_exit(command, run)
    after = describe_tree(sandbox.root)
    tree = before.tree
    changed = sorted(p for p in tree.keys() | after.keys() if tree.get(p) != after.get(p))
    for path in [p for p in changed if not before.allowed(p)][:6]:
        found.append(f"changed {path}: {tree.get(path, 'absent')} -> {after.get(path, 'absent')}")
    if run.rc == 0 and command.kind != "verify":
        found += _check_values(sandbox, command, before.want)
    if run.rc in (0, 1) and command.kind == "verify":
        found += _check_verdict(sandbox, command, run.rc)
    return found


def _check_exit(command: Command, run: Run) -> list[str]:
    found = []
    if run.rc is None:
        found.append(f"hang: still running after {run.seconds:.0f} s (killed)")
    elif run.rc not in (0, 1, 2):
        found.append(f"exit code {run.rc}")
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if "Traceback" in run.stderr:
        found.append("a traceback on stderr without --debug")
    if "MemoryError" in run.stderr:
        found.append(
            f"MemoryError (the child's address space is capped at {ADDRESS_SPACE_BYTES // GiB} GiB)"
        )
    if run.rc == 2 and (not lines or not lines[-1].startswith("error:")):
        found.append(f"exit 2 whose last stderr line is not 'error: ...': {lines[-1:]}")
    if run.rc == 2 and sum(line.startswith("error:") for line in lines) != 1:
        found.append("exit 2 with more than one 'error:' line")
    if run.max_rss_bytes > RSS_LIMIT_BYTES:
        found.append(f"peak RSS {run.max_rss_bytes / MiB:.0f} MiB > {RSS_LIMIT_BYTES // MiB} MiB")
    return found


def _check_values(sandbox: Sandbox, command: Command, want: tuple[Any, str]) -> list[str]:
    values, dtype = want
    assert command.target is not None
    if values is None:
        return [f"exit 0 though an operand was unreadable or hostile: {command.operands}"]
    got = read_array(sandbox.root / command.target)
    scale = _scale(sandbox, command, values)
    wrong = close(got, values, dtype, scale)
    return [f"exit 0 but {command.target} is wrong: {wrong}"] if wrong else []


def _scale(sandbox: Sandbox, command: Command, values: Any) -> Any:
    """|A|·|B| (plus |2·C_old|, or |values| for random): what the rounding is relative to."""
    read = [read_array(sandbox.root / n) for n in command.operands]
    arrays = [a for a in read if a is not None]
    if command.kind.startswith("random") or len(arrays) < len(read):
        return np.abs(values) + 1.0
    if command.kind == "gram":
        x = np.abs(arrays[0].astype(np.float64))
        return x.T @ x
    a, b = (np.abs(x.astype(np.float64)) for x in arrays[:2])
    return a @ b + np.abs(values)


def _check_verdict(sandbox: Sandbox, command: Command, rc: int) -> list[str]:
    a, b, c = (read_array(sandbox.root / n) for n in command.operands)
    if a is None or b is None:
        return [] if rc == 1 else ["verify exit 0 though A or B was unreadable or hostile"]
    if c is None:
        return [] if rc == 1 else ["verify exit 0 though C was unreadable or hostile"]
    if c.shape != (a.shape[0], b.shape[1]):
        return [] if rc == 1 else [f"verify exit 0 on C of shape {c.shape}"]
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1e-30
    relative = float(np.max(np.abs(c.astype(np.float64) - a.astype(np.float64) @ b) / scale))
    if rc == 0 and not relative < 1e-2:
        return [f"verify exit 0 on a wrong C (relative error {relative:.3g})"]
    if rc == 1 and relative < 1e-6:
        return [f"verify exit 1 on a right C (relative error {relative:.3g})"]
    return []


# --- one case ----------------------------------------------------------------------------


def run_case(
    seed: int, folder: Path, commands: int = 2, timeout_s: float = TIMEOUT_S
) -> CaseResult:
    """Build seed's sandbox under ``folder`` and run ``commands`` random commands on it, each
    after 1-3 more hostile things are planted, checking the invariants after each."""
    sandbox, setup = build_sandbox(folder / f"sandbox-{seed}", seed, timeout_s)
    steps = []
    for _ in range(commands):
        command = choose_command(sandbox)
        planted = plant(sandbox, command, sandbox.rng.randint(1, 3))
        before = Before(
            describe_tree(sandbox.root), may_change(sandbox, command), expected(sandbox, command)
        )
        run = run_measured(command.argv, sandbox.root, timeout_s)
        steps.append(Step(command, run, planted, check_step(sandbox, command, run, before)))
        if run.rc == 0 and command.kind in WRITES and command.target:
            sandbox.ours.add(command.target.split("/")[0])
    return CaseResult(seed, setup, steps)


def clean_run(folder: Path, timeout_s: float = TIMEOUT_S) -> Run:
    """A multiply on a sandbox with nothing planted: the baseline for seconds and RSS."""
    sandbox, _ = build_sandbox(folder, 0, timeout_s)
    return run_measured(
        ("multiply", "a.zarr", "b.zarr", "new.zarr", *QUIET), sandbox.root, timeout_s
    )

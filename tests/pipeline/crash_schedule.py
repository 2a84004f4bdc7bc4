"""The crash schedule of ``--accumulate``: stop the job at a named step boundary of its
protocol (pipeline/accumulate/crash.py) with SIGKILL to its whole process group, or SIGINT or
SIGTERM to the command, then run what a user runs next and check that C was only ever the
old C, the new C, or resumable to the new C; exit 0 always means the new C.

After each stop:

- no accumulation folder: C reads exactly as the old C or as the new one (for a refused
  accumulation: the old one, bit for bit); one marked complete: C reads as the new one;
- an unfinished one: ``verify`` and a new ``--accumulate`` are refused (exit 2 in the CLI)
  without changing a byte of C; ``--resume`` then ends with the new C (a refused one: with
  the old C, put back);
- otherwise the next ``--accumulate`` adds the product once more to whatever C held.

Used by tests/pipeline/test_crash_schedule.py (a fixed schedule) and benchmarks/fuzz_crash.py
(a seeded random one, ``make fuzz-crash``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pipeline import multiply
from pipeline.accumulate.state import COMPLETE, ROLLING_BACK, SIDECAR, read_state
from pipeline.errors import InputError, UnfinishedOutputError, UsageError
from pipeline.store.output import Output

REPO = Path(__file__).resolve().parents[2]
SHAPE, K, CHUNK = 768, 64, 128
"""C is 768² in 128² chunks: 9 tiles of 256² (4 objects each) under MEMORY."""
MEMORY = "262MiB"
"""The stopped job's limit (the commands after it plan as they would: --resume keeps the
tiling the accumulation started with)."""
ALPHA, BETA = 2.0, -0.5
CLI_TIMEOUT_S = 180

STEPS: dict[str, dict[str, int]] = {
    # scenario -> crash point -> the hits every run makes of it (0: some runs make none;
    # the random schedule also draws one past the last: the run ends before it)
    "add": {
        "begin.listings": 1, "begin.state": 1, "move.object": 36, "move.marker": 9,
        "write.band": 9, "write.tile": 9, "finish.complete": 1, "clean.file": 56,
        "clean.state": 2,
    },
    "refused": {
        "move.object": 36, "move.marker": 2, "write.tile": 0, "rollback.state": 1,
        "rollback.tile": 2, "rollback.object": 36, "clean.file": 6, "clean.state": 2,
    },
}  # fmt: skip
"""Scenarios: ``add`` (float64 C, α·A·B + β·C: 9 tiles) and ``refused`` (an int16 C whose last
element overflows at run time: the job fails and C is put back; 2 tiles)."""
SIGNALS = ("KILL", "INT", "TERM")


@dataclass(frozen=True)
class Case:
    scenario: str
    step: str
    nth: int
    signal: str
    workers: int = 1
    """1: one worker in the command's process; 2: two worker processes (of one thread)."""
    layout: str = "v3"
    """C's: ``v3`` (chunks), ``v2`` (``.`` keys in one folder) or ``sharded`` (2x2 chunks)."""

    def __str__(self) -> str:
        tail = "" if (self.workers, self.layout) == (1, "v3") else f":{self.workers}"
        tail += "" if self.layout == "v3" else f":{self.layout}"
        return f"{self.scenario}:{self.step}:{self.nth}:{self.signal}{tail}"


LAYOUTS: dict[str, dict[str, Any]] = {
    "v3": {"chunks": (CHUNK, CHUNK)},
    "v2": {"chunks": (CHUNK, CHUNK), "zarr_format": 2,
           "chunk_key_encoding": {"name": "v2", "separator": "."}},
    "sharded": {"chunks": (CHUNK // 2, CHUNK // 2), "shards": (CHUNK, CHUNK)},
}  # fmt: skip


@dataclass
class Outcome:
    case: Case
    exit_code: int
    state: str
    """What the stop left: none, running, complete or rolling-back."""
    violations: list[str]
    reached: bool = True
    """The crash point was hit N times (else the run ended before it)."""


def fixed_schedule() -> list[Case]:
    """Every crash point of both scenarios once with SIGKILL (a middle hit), and SIGINT and
    SIGTERM where a task and the command's own steps run."""
    cases = [
        Case(scenario, step, max(1, most // 2), "KILL")
        for scenario, steps in STEPS.items()
        for step, most in steps.items()
        if most
    ]
    cases += [
        Case("add", "move.marker", 3, "INT"),
        Case("add", "write.tile", 5, "TERM"),
        Case("add", "clean.file", 7, "INT"),
        Case("refused", "rollback.object", 20, "TERM"),
        Case("add", "move.object", 11, "KILL", workers=2),  # the group takes the workers
        Case("add", "write.band", 4, "TERM", workers=2),  # the command only: workers orphaned
        Case("add", "move.object", 7, "KILL", layout="v2"),
        Case("refused", "rollback.object", 5, "KILL", layout="v2"),
        Case("add", "write.tile", 3, "KILL", layout="sharded"),
        Case("refused", "rollback.tile", 1, "KILL", layout="sharded"),
    ]
    return cases


def random_case(rng: random.Random) -> Case:
    scenario = rng.choice(sorted(STEPS))
    step = rng.choice(sorted(STEPS[scenario]))
    nth = rng.randint(1, max(STEPS[scenario][step], 1) + 1)  # one past: the run ends first
    layout = rng.choice(("v3", "v3", "v2", "sharded"))
    return Case(scenario, step, nth, rng.choice(SIGNALS), rng.choice((1, 1, 2)), layout)


def make_data(folder: Path, scenario: str, layout: str = "v3") -> tuple[str, str, str]:
    """A, B and someone's C (fresh for each case)."""
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True)
    urls = tuple(str(folder / name) for name in ("a.zarr", "b.zarr", "c.zarr"))
    if scenario == "add":
        a, b = rng.standard_normal((SHAPE, K)), rng.standard_normal((K, SHAPE))
        c = rng.standard_normal((SHAPE, SHAPE))
    else:
        # uint8 @ bool over K = 64 fits int16 whatever the values (no refusal before the
        # run); C's last element at its top makes the last tile overflow at run time
        a = rng.integers(0, 4, (SHAPE, K), dtype=np.uint8)
        b = rng.integers(0, 2, (K, SHAPE)).astype(bool)
        c = rng.integers(-1000, 1000, (SHAPE, SHAPE)).astype(np.int16)
        a[-1, :], b[:, -1], c[-1, -1] = 3, True, 32767
    zarr.create_array(urls[0], data=a, chunks=(CHUNK, K))
    zarr.create_array(urls[1], data=b, chunks=(K, CHUNK))
    zarr.create_array(urls[2], data=c, attributes={"owner": "someone"}, **LAYOUTS[layout])
    return urls  # type: ignore[return-value]


def factors(scenario: str) -> tuple[float, float]:
    return (ALPHA, BETA) if scenario == "add" else (1.0, 1.0)


def cli_argv(urls: tuple[str, str, str], case: Case, *extra: str) -> list[str]:
    alpha, beta = factors(case.scenario)
    threads = str(2 // case.workers)
    return [
        *(sys.executable, "-m", "pipeline", "multiply", *urls, "--accumulate"),
        *("--alpha", f"{alpha:g}", "--beta", f"{beta:g}", "--no-progress"),
        *("--workers", str(case.workers), "--threads-per-worker", threads),
        *("--memory-limit", MEMORY),
        *("--dashboard-address", "127.0.0.1:0", *extra),
    ]


def crashed_run(case: Case, urls: tuple[str, str, str], folder: Path) -> int:
    """The job, stopped at the case's crash point; whatever is left of it is killed after."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TILEGEMM_CRASH_AT"] = f"{case.step}:{case.nth}:{case.signal}"
    env["TILEGEMM_CRASH_COUNT"] = str(folder / "hits")
    with (folder / "run.err").open("wb") as err:
        proc = subprocess.Popen(cli_argv(urls, case), stdout=subprocess.DEVNULL,
                                stderr=err, env=env, start_new_session=True)  # fmt: skip
    try:
        return proc.wait(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -999
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a worker orphaned by SIGTERM too
        proc.wait(timeout=30)


def read_c(url: str) -> np.ndarray:
    return np.asarray(zarr.open_array(url, mode="r")[:])


def c_files(url: str) -> dict[str, bytes]:
    """C's files by name, its lock aside (a refused command takes and frees it)."""
    root = Path(url)
    found = {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}
    return {name: p.read_bytes() for name, p in found.items() if name != "lock.json"}


def run_case(case: Case, folder: Path, client: Any) -> Outcome:
    urls = make_data(folder, case.scenario, case.layout)
    a, b, old = (read_c(u) for u in urls)
    alpha, beta = factors(case.scenario)
    product = a.astype(np.float64) @ b.astype(np.float64)
    new = alpha * product + beta * old.astype(np.float64)
    refused = case.scenario == "refused"
    problems: list[str] = []
    code = crashed_run(case, urls, folder)
    state = read_state(Output(urls[2], {}))
    phase = "none" if state is None else str(state["phase"])
    err = (folder / "run.err").read_text(errors="replace")[-2000:]

    def check(cond: bool, what: str) -> None:
        if not cond:
            problems.append(f"{what} (exit {code}, left {phase}); stderr: {err}")

    def same(got: np.ndarray, want: np.ndarray) -> bool:
        if want.dtype.kind == "f" and got.dtype.kind == "f":
            return bool(np.allclose(got, want, rtol=1e-12, atol=1e-12))
        return bool(np.array_equal(got, want))

    def accumulate(**kw: Any) -> None:
        multiply(*urls, client=client, accumulate=True, alpha=alpha, beta=beta, **kw)

    check(code != -999, "the stopped job hung")
    if code == 0:
        check(not refused, "a refused accumulation exited 0")
        check(state is None and same(read_c(urls[2]), new), "exit 0 but C is not the new C")
    before: np.ndarray | None = None  # C as the next plain --accumulate finds it
    if state is None:
        now = read_c(urls[2])
        if refused:
            check(same(now, old), "no accumulation left, but C is not the old C")
        else:
            check(same(now, old) or same(now, new), "C is neither the old C nor the new C")
        before = now
    elif phase == COMPLETE:
        check(not refused, "a refused accumulation was marked complete")
        check(same(read_c(urls[2]), new), "marked complete but C is not the new C")
        before = new
    elif phase == ROLLING_BACK:
        before = old
    else:  # running: refused by verify and a new --accumulate, byte for byte unchanged
        files = c_files(urls[2])
        _expect(UnfinishedOutputError, lambda: _verify(client, urls), check, "verify")
        _expect(UsageError, accumulate, check, "a new --accumulate")
        check(c_files(urls[2]) == files, "a refused command changed C's files")
        if refused:
            _expect(InputError, lambda: accumulate(resume=True), check, "--resume (refused)")
            check(same(read_c(urls[2]), old), "the resumed refusal did not put C back")
        else:
            _run(lambda: accumulate(resume=True), check, "--resume")
            check(same(read_c(urls[2]), new), "--resume did not end with the new C")
    if before is not None:  # the next --accumulate adds the product to what C holds
        if refused:
            _expect(InputError, accumulate, check, "the next --accumulate (refused)")
            check(same(read_c(urls[2]), old), "the next refused --accumulate changed C")
        else:
            _run(accumulate, check, "the next --accumulate")
            again = alpha * product + beta * before.astype(np.float64)
            check(same(read_c(urls[2]), again), "the next --accumulate did not add once")
    check(not (Path(urls[2]) / SIDECAR).exists(), "the accumulation's folder was left")
    hits = folder / "hits"
    reached = hits.exists() and hits.stat().st_size >= case.nth
    return Outcome(case, code, phase, problems, reached)


def _verify(client: Any, urls: tuple[str, str, str]) -> None:
    from pipeline import verify_product

    verify_product(client, *urls)


def _expect(error: type, call: Callable[[], Any], check: Callable[[bool, str], None],
            what: str) -> None:  # fmt: skip
    try:
        call()
    except error:
        return
    except Exception as e:  # noqa: BLE001 - reported as the violation it is
        check(False, f"{what} raised {type(e).__name__}: {e}, not {error.__name__}")
        return
    check(False, f"{what} was not refused")


def _run(call: Callable[[], Any], check: Callable[[bool, str], None], what: str) -> None:
    try:
        call()
    except Exception as e:  # noqa: BLE001 - reported as the violation it is
        check(False, f"{what} failed: {type(e).__name__}: {e}")

"""benchmarks.gpu_session's engine: steps run as subprocesses under timeouts, one after the other
whatever each one's fate, and the table of what they did (summary.md)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 5.0
"""Seconds a timed-out step has between SIGTERM and SIGKILL."""
SUMMARY = "summary.md"


def _no_figures(text: str) -> str:
    return ""


@dataclass(frozen=True)
class Step:
    """One row of the table: its commands run in turn, under one timeout."""

    name: str
    commands: tuple[tuple[str, ...], ...]
    timeout_s: float
    """Wall-clock limit of all its commands together, in seconds."""
    log: str
    """Its log's file name in DIR (steps may share one)."""
    figures: Callable[[str], str] = _no_figures
    """The key figures read from its output."""
    env: tuple[tuple[str, str], ...] = ()
    needs: str | None = None
    """The step that must have passed before this one runs (the CLI runs' inputs)."""
    skip: str | None = None
    """Why it does not run here, known before the session starts."""


@dataclass(frozen=True)
class Outcome:
    """What one step did."""

    step: Step
    status: str
    """passed, failed rc N, timed out after N s, or skipped: why."""
    seconds: float | None = None
    figures: str = ""

    @property
    def bad(self) -> bool:
        return self.status.startswith(("failed", "timed out"))


# --- running ------------------------------------------------------------------------------------


def run_command(
    command: Sequence[str], env: Mapping[str, str], log: IO[str], limit_s: float
) -> int | None:
    """Its exit status, or None when it ran past ``limit_s``; whatever it started (its process
    group) is ended with it."""
    if limit_s <= 0:
        return None
    try:
        child = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, ended with it
        )
    except OSError as e:
        log.write(f"cannot start: {e}\n")
        return 127
    try:
        return child.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        _signal_group(child.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=GRACE_S)
        return None
    finally:
        _signal_group(child.pid, signal.SIGKILL)  # what it left behind (workers of a cluster)
        child.wait()


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def run_step(step: Step, log_path: Path, env: Mapping[str, str], limit_s: float) -> Outcome:
    """Its commands in turn, until one fails, within ``limit_s`` in all; output to the log."""
    env = {**env, **dict(step.env)}
    started = time.perf_counter()
    begin = log_path.stat().st_size if log_path.exists() else 0
    rc: int | None = 0
    with log_path.open("a", encoding="utf-8") as log:
        for command in step.commands:
            log.write(f"$ {shlex.join(command)}\n")
            log.flush()
            rc = run_command(command, env, log, limit_s - (time.perf_counter() - started))
            if rc != 0:
                break
        seconds = time.perf_counter() - started
        status = {0: "passed", None: f"timed out after {limit_s:.3g} s"}.get(rc, f"failed rc {rc}")
        log.write(f"[{step.name}: {status}, {seconds:.1f} s]\n\n")
    with log_path.open("rb") as log:
        log.seek(begin)
        text = log.read().decode("utf-8", errors="replace")
    try:
        figures = step.figures(text)
    except Exception as e:  # noqa: BLE001 - a parser's slip must not cost the table
        figures = f"(not read: {type(e).__name__})"
    return Outcome(step, status, seconds, figures)


def run_session(
    steps: Sequence[Step],
    out: Path,
    header: Mapping[str, str],
    env: Mapping[str, str],
    budget_s: float,
) -> int:
    """Every step (summary.md rewritten after each); 1 when one failed or timed out, else 0."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    opened: set[str] = set()
    for step in steps:
        left = budget_s - (time.perf_counter() - started)
        reason = step.skip or _unmet(step, outcomes)
        if reason is None and left <= 0:
            reason = f"the session's {budget_s:.3g} s were spent"
        if reason is not None:
            outcomes.append(Outcome(step, f"skipped: {reason}"))
        else:
            if step.log not in opened:  # a log of this session only
                (out / step.log).write_text("", encoding="utf-8")
                opened.add(step.log)
            outcomes.append(run_step(step, out / step.log, env, min(step.timeout_s, left)))
        print(f"{step.name}: {outcomes[-1].status}", flush=True)
        took = (time.perf_counter() - started, budget_s)
        (out / SUMMARY).write_text(format_summary(header, outcomes, steps, took), encoding="utf-8")
    return 1 if any(o.bad for o in outcomes) else 0


def _unmet(step: Step, outcomes: Sequence[Outcome]) -> str | None:
    before = {o.step.name: o.status for o in outcomes}
    if step.needs is None or before.get(step.needs) == "passed":
        return None
    return f"needs {step.needs} ({before.get(step.needs, 'not run')})"


# --- the table ----------------------------------------------------------------------------------


def format_summary(
    header: Mapping[str, str],
    outcomes: Sequence[Outcome],
    steps: Sequence[Step],
    took: tuple[float, float],
) -> str:
    """summary.md: the machine, a row per step (those not run yet too), the commands;
    ``took``: (seconds so far, the budget)."""
    bad = [f"{o.step.name} ({o.status})" for o in outcomes if o.bad]
    done = len(outcomes) == len(steps)
    result = "FAILED: " + ", ".join(bad) if bad else "all passed or skipped" if done else "running"
    lines = [
        f"# GPU session, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"**Result: {result}** ({took[0]:.0f} s of the {took[1]:.0f} s budget)",
        "",
        "| | |",
        "| --- | --- |",
    ]
    lines += [f"| {key} | {_cell(value)} |" for key, value in header.items()]
    lines += ["", "| step | status | seconds | figures | log |", "| --- | --- | ---: | --- | --- |"]
    for o in outcomes:
        seconds, log = ("-", "-") if o.seconds is None else (f"{o.seconds:.1f}", o.step.log)
        lines.append(
            f"| {o.step.name} | {_cell(o.status)} | {seconds} | {_cell(o.figures)} | {log} |"
        )
    lines += [f"| {s.name} | not run yet | - | | - |" for s in steps[len(outcomes) :]]
    lines += ["", "Commands (from the repository root; timeouts in seconds):", ""]
    for s in steps:
        shown = " && ".join(shlex.join([Path(c[0]).name, *c[1:]]) for c in s.commands)
        lines.append(f"- {s.name} ({s.timeout_s:g} s): `{shown}`")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")

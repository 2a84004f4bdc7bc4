"""The key figures of each benchmarks.gpu_session step, read from its output (pure text in, a
short line out; "" when the output holds none)."""

from __future__ import annotations

import re


def doctor_figures(text: str) -> str:
    """Its verdict line, the failed checks named: "doctor: ... 1 failed: kernels"."""
    verdict = [line.rstrip(".") for line in text.splitlines() if line.startswith("doctor:")]
    failed = re.findall(r"^\[fail\]\s+(\S+)", text, re.M)
    return verdict[-1] + (": " + ", ".join(failed) if failed else "") if verdict else ""


def pytest_figures(text: str) -> str:
    found = re.findall(r"^=+ (.*\bin [\d.]+s\b.*?) =+$", text, re.M)
    return found[-1] if found else ""


def inspect_figures(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("variant ")), len(lines))
    rows = [line for line in lines[start + 1 :] if line.strip()]
    rows = rows[: next((i for i, r in enumerate(rows) if r.startswith("fma:")), len(rows))]
    missed = [row.split()[0] for row in rows if not row.rstrip().endswith("  met")]
    return f"{len(rows)} variants, targets missed by: {', '.join(missed) or 'none'}" if rows else ""


def kernels_figures(text: str) -> str:
    """TFLOP/s per size and kernel, each kernel's ratio to cuBLAS in brackets."""
    sizes: dict[str, list[str]] = {}
    row = re.compile(r"^\| (\d+) \| \w+ \| (\w+)(\*?) \| [\d.]+ \| ([\d.]+) \| ([\w.]+) \|", re.M)
    for n, name, star, tflops, ratio in row.findall(text):
        versus = "" if name == "cublas" else f" ({ratio})"
        sizes.setdefault(n, []).append(f"{name}{star} {tflops}{versus}")
    return "; ".join(f"{n}: {', '.join(rows)}" for n, rows in sizes.items()) + (
        " TFLOP/s (x cuBLAS)" if sizes else ""
    )


def cli_figures(text: str) -> str:
    done = re.findall(
        r"^done: .* in ([\d.]+) s \(([\d.]+) GFLOP/s, .*; verify (\w+)\s*$", text, re.M
    )
    return f"{done[-1][0]} s, {done[-1][1]} GFLOP/s, verify {done[-1][2]}" if done else ""


def feed_figures(text: str) -> str:
    busy = re.findall(r"busy ([\d.]+) of the execution window ([\d.]+) s", text)
    rate = re.findall(r"^measured\s+[\d.]+\s+([\d.]+)", text, re.M)
    if not busy:
        return ""
    return f"busy {busy[-1][0]} of a {busy[-1][1]} s window" + (
        f", {rate[-1]} TFLOP/s" if rate else ""
    )

"""The command line's happy paths, as a user runs them (subprocesses)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr

from tests.child_env import child_env
from tests.helpers import assert_product, random_matrix, write_array

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = child_env(env)
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=environ,
    )


def make_inputs(tmp_path: Path, dtype: str = "float32") -> tuple[str, str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    a, b = random_matrix(rng, (37, 29), dtype), random_matrix(rng, (29, 41), dtype)
    return (
        write_array(tmp_path / "a.zarr", a, (10, 7)),
        write_array(tmp_path / "b.zarr", b, (9, 20)),
        a,
        b,
    )


def test_cuda_backend_in_the_simulator_with_two_threads(tmp_path: Path) -> None:
    # Two Dask threads launch simulated kernels at once: the host side must serialize them.
    a_url, b_url, a, b = make_inputs(tmp_path)
    out = tmp_path / "c.zarr"
    done = cli(
        "multiply",
        a_url,
        b_url,
        str(out),
        "--backend",
        "cuda",
        "--threads-per-worker",
        "2",
        "--dashboard-address",
        "127.0.0.1:0",
        env={"NUMBA_ENABLE_CUDASIM": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "backend cuda" in done.stdout
    assert_product(zarr.open_array(str(out))[:], a, b)


def test_report_and_summary(tmp_path: Path) -> None:
    a_url, b_url, a, b = make_inputs(tmp_path, "float64")
    out, report = tmp_path / "c.zarr", tmp_path / "report.html"
    done = cli(
        "multiply",
        a_url,
        b_url,
        str(out),
        "--report",
        str(report),
        "--verify",
        "--dashboard-address",
        "127.0.0.1:0",
    )
    assert done.returncode == 0, done.stderr
    assert "dashboard: http://127.0.0.1:" in done.stderr
    assert "verify passed" in done.stdout and "tiles computed" in done.stdout
    assert report.stat().st_size > 10_000 and "<html" in report.read_text()[:1000].lower()
    assert_product(zarr.open_array(str(out))[:], a, b)


def test_dry_run_prints_the_plan(tmp_path: Path) -> None:
    a_url, b_url, _, _ = make_inputs(tmp_path)
    done = cli(
        "multiply", a_url, b_url, str(tmp_path / "c.zarr"), "--dry-run", "--memory-limit", "2GiB"
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^product +37x29 @ 29x41 -> 37x41 float32", out, re.M), out
    assert re.search(rf"^flops +{re.escape(f'{2 * 37 * 41 * 29:.3e}')}$", out, re.M), out
    # The tile grid covers C exactly once; the K panels cover K.
    tiles, rows, cols, tm, tn = _numbers(out, r"tiles +(\d+) \((\d+)x(\d+)\) of (\d+)x(\d+)")
    assert tiles == rows * cols and (rows, cols) == (-(-37 // tm), -(-41 // tn)), out
    panels, narrow, wide = _numbers(out, r"K panels +(\d+) per tile, width (\d+)-(\d+)")
    assert panels * narrow <= 29 <= panels * wide, out
    # Reads: every input element at least once (float32), the lower bound no less than that.
    reads, bound, compulsory = _numbers(
        out, r"planned reads +([\d.]+) KiB = .* bound ([\d.]+) KiB \(compulsory ([\d.]+) KiB"
    )
    assert compulsory == round((37 * 29 + 29 * 41) * 4 / 1024, 1), out
    assert reads >= compulsory and bound >= compulsory, out
    assert not (tmp_path / "c.zarr").exists()


def _numbers(text: str, pattern: str) -> list[float]:
    found = re.search(pattern, text, re.M)
    assert found, (pattern, text)
    return [float(x) for x in found.groups()]


def test_random_is_reproducible(tmp_path: Path) -> None:
    for name in ("x", "y"):
        done = cli(
            "random",
            str(tmp_path / f"{name}.zarr"),
            "--shape",
            "50x30",
            "--chunks",
            "16x16",
            "--dtype",
            "float64",
            "--seed",
            "7",
        )
        assert done.returncode == 0, done.stderr
    x, y = (zarr.open_array(str(tmp_path / f"{n}.zarr"))[:] for n in ("x", "y"))
    assert x.dtype == np.float64 and x.shape == (50, 30)
    np.testing.assert_array_equal(x, y)
    assert np.abs(x).max() <= 1 and x.std() > 0.3


def test_storage_options_are_parsed() -> None:
    from pipeline.cli.main import parse_storage_options

    got = parse_storage_options(
        ["anon=true", "endpoint_url=http://127.0.0.1:9000", "region=x", "max_concurrency=4"]
    )
    assert got == {
        "anon": True,
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "x"},
        "max_concurrency": 4,
    }

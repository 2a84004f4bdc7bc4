"""The ``tilegemm`` console command: pyproject.toml's script runs what ``python -m pipeline``
runs, and usage lines name the command the user typed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.child_env import child_env
from tests.helpers import REPO, run_cli

SCRIPT = Path(sys.executable).parent / "tilegemm"
"""Where ``pip install -e .`` puts the command in this environment."""
ENTRY = """
import sys
sys.argv = {argv!r}
from pipeline.__main__ import run
run()
"""


def call_entry(*argv: str) -> subprocess.CompletedProcess[str]:
    """The script's function as pip's wrapper calls it, with ``sys.argv`` set to ``argv``."""
    return subprocess.run(
        [sys.executable, "-c", ENTRY.format(argv=list(argv))],
        capture_output=True, text=True, env=child_env(), timeout=120,
    )  # fmt: skip


def test_the_script_points_at_the_entry_function() -> None:
    from pipeline.__main__ import run

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["tilegemm"].partition(":")
    assert (module, name) == (run.__module__, run.__name__)


@pytest.mark.parametrize(
    ("argv0", "prog"),
    [
        ("/usr/local/bin/tilegemm", "tilegemm"),  # the installed script
        ("-c", "python -m pipeline"),  # anything else
    ],
)
def test_the_entry_function_names_how_it_was_started(argv0: str, prog: str) -> None:
    done = call_entry(argv0, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {prog} "), done.stdout
    refused = call_entry(argv0, "multiply")
    assert refused.returncode == 2
    assert refused.stderr.rstrip().endswith(f"(see `{prog} multiply --help`)"), refused.stderr


def test_the_entry_function_exits_2_on_a_missing_input(tmp_path: Path) -> None:
    done = call_entry("tilegemm", "multiply", str(tmp_path / "a.zarr"), "b.zarr", "c.zarr")
    assert done.returncode == 2
    assert done.stderr.startswith("error: A (") and "does not exist" in done.stderr


def test_python_m_pipeline_keeps_its_name() -> None:
    done = run_cli("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m pipeline ")


needs_script = pytest.mark.skipif(
    not SCRIPT.exists(), reason=f"{SCRIPT} not installed: run pip install -e . once"
)


@needs_script
def test_the_installed_command(tmp_path: Path) -> None:
    def tilegemm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args], capture_output=True, text=True, env=child_env(), timeout=120
        )

    done = tilegemm("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: tilegemm "), done.stdout
    missing = tilegemm("multiply", str(tmp_path / "a.zarr"), "b.zarr", str(tmp_path / "c.zarr"))
    assert missing.returncode == 2
    (line,) = missing.stderr.splitlines()
    assert line.startswith("error: A (") and "does not exist" in line

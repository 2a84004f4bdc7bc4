"""Children of the suite find this checkout and keep the dependencies that came on PYTHONPATH
(how an offline GPU node runs the suite: ../shared/gpu/README.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import REPO, child_env


def test_the_repo_goes_first_and_the_rest_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/deps")
    assert child_env()["PYTHONPATH"] == os.pathsep.join((str(REPO), "/opt/deps"))
    assert child_env({"X": "1"})["X"] == "1"
    monkeypatch.delenv("PYTHONPATH")
    assert child_env()["PYTHONPATH"] == str(REPO)


def test_a_child_imports_both_the_repo_and_a_dependency_from_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "offline_only_dependency.py").write_text("VALUE = 7\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    code = "import offline_only_dependency as d, kernels.constants as c; print(d.VALUE, c.MAX_DIM)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["7", str(2**31 - 1)]


def test_no_test_replaces_pythonpath_with_the_repo_alone() -> None:
    replaced = re.compile(r"""["']PYTHONPATH["']\s*(\]\s*=|:)\s*str\(""")
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if replaced.search(line)
    ]
    assert offenders == [], f"use tests.child_env.child_env (prepends): {offenders}"

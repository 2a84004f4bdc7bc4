"""The docs can't drift from the code: docs/cli.md is what the parser renders now, README's
options table names exactly multiply's options, and the docs' relative links resolve."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GENERATOR = ROOT / "docs" / "make_cli_reference.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_cli_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}


def readme_options_table() -> list[str]:
    """First cells of the table under "`multiply` options:" in README.md."""
    lines = README.read_text().splitlines()
    start = lines.index("`multiply` options:")
    rows: list[str] = []
    for line in lines[start + 1 :]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append(line[2:].split(" | ", 1)[0])
    return rows[1:]  # without the header


def test_cli_reference_is_current() -> None:
    current = (ROOT / "docs" / "cli.md").read_text()
    assert current == load_generator().render(), "stale: run python docs/make_cli_reference.py"


def test_readme_options_table_matches_the_parser() -> None:
    from pipeline.cli.main import build_parser

    parser = build_parser()
    subcommands = {name: sub for name, sub, _ in load_generator()._subcommands(parser)}
    multiply = option_strings(subcommands["multiply"])
    cells = readme_options_table()
    named = {o for cell in cells for o in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", cell)}
    assert named - multiply - option_strings(parser) == set(), "README names unknown options"
    assert multiply - named == set(), "multiply options missing from README's table"
    backend = next(c for c in cells if c.startswith("`--backend "))
    choices = next(a.choices for a in subcommands["multiply"]._actions if a.dest == "backend")
    assert backend.strip("`").split(" ", 1)[1].split("\\|") == list(choices or ())


def install_commands() -> list[str]:
    """The command lines of the code block(s) in README's "## Installing" section."""
    section = README.read_text().split("\n## Installing\n", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def installed_targets(command: str) -> list[str]:
    """What a ``pip install`` line installs: its arguments that are no option or option value."""
    words = shlex.split(command.split("#", 1)[0])[2:]
    takes_value = {"-c", "--constraint", "-r", "--requirement"}
    return [
        w for i, w in enumerate(words)
        if not w.startswith("-") and (i == 0 or words[i - 1] not in takes_value)
    ]  # fmt: skip


def test_readme_installs_from_a_checkout_first() -> None:
    """zarr-tilegemm is not on the package index: README's install lines come from a checkout
    (a path: ".", ".[cuda]"), first of all the first one, and any line naming the package on
    the index says on that line that it is not there yet."""
    commands = install_commands()
    assert commands and installed_targets(commands[0]) == ["."], commands[0]
    section = README.read_text().split("\n## Installing\n", 1)[1].split("\n## ", 1)[0]
    assert "not on the package index" in " ".join(section.split()[:40])  # said first
    for command in commands:
        if not command.startswith("pip install"):
            continue
        targets = installed_targets(command)
        from_index = [t for t in targets if not t.startswith((".", "/"))]
        assert targets and (not from_index or "not on the package index" in command), command


@pytest.mark.parametrize("page", ["README.md", "DESIGN.md", "docs/cli.md", "docs/cluster.md"])
def test_relative_links_resolve(page: str) -> None:
    path = ROOT / page
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text())
    missing = [link for link in links if not (path.parent / link).exists()]
    assert missing == [], f"{page} links to missing files: {missing}"

"""DESIGN.md's module map can't drift: it is what docs/make_module_map.py renders from the
modules' docstrings now."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "docs" / "make_module_map.py"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_module_map", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_module_map_is_current() -> None:
    generator = load_generator()
    design = (ROOT / "DESIGN.md").read_text(encoding="utf-8")
    assert design == generator.spliced(design, generator.render()), (
        "DESIGN.md's module map is stale: run python docs/make_module_map.py"
    )


@pytest.mark.parametrize(
    ("docstring", "expected"),
    [
        # one line, one sentence
        ("Sizes: ints of bytes.", "Sizes: ints of bytes."),
        # a sentence wrapped over lines is joined
        ("The plan's\nfrozen form. More.", "The plan's frozen form."),
        # only the first paragraph counts, all of it when no sentence ends
        ("A title without a stop\n\nThe body.", "A title without a stop"),
        # abbreviations and dotted names do not end a sentence
        ("Reads, e.g. kernels.cpu, fast. Then.", "Reads, e.g. kernels.cpu, fast."),
        # no docstring
        (None, ""),
    ],
)
def test_first_sentence(docstring: str | None, expected: str) -> None:
    assert load_generator().first_sentence(docstring) == expected


def make_tree(root: Path) -> None:
    """pkg/ with a lower room and a module the layers contract does not name."""
    (root / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_packages = ["pkg"]\n'
        '[[tool.importlinter.contracts]]\ntype = "layers"\n'
        'layers = ["pkg.top | pkg.face", "pkg.low"]\n'
    )
    files = {
        "pkg/__init__.py": '"""The package."""\n',
        "pkg/top.py": '"""Top module."""\n',
        "pkg/face.py": '"""Face module."""\n',
        "pkg/extra.py": "x = 1\n",
        "pkg/low/__init__.py": '"""The low room.\n\nMore about it."""\n',
        "pkg/low/part.py": '"""A part."""\n',
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_rooms_and_modules_follow_the_layers_then_names(tmp_path: Path) -> None:
    make_tree(tmp_path)
    text = load_generator().render(tmp_path)
    lines = [line for line in text.splitlines() if line.startswith(("**", "- "))]
    assert lines == [
        "**`pkg/`** — The package.",
        "- `face.py` — Face module.",  # same layer as top: by name
        "- `top.py` — Top module.",
        "- `extra.py` — (no docstring)",  # in no layer: after those that are
        "**`pkg/low/`** — The low room.",
        "- `part.py` — A part.",
    ]


def test_check_fails_on_a_stale_map_until_it_is_written(tmp_path: Path) -> None:
    generator = load_generator()
    make_tree(tmp_path)
    design = tmp_path / "DESIGN.md"
    design.write_text(f"# Design\n\n{generator.BEGIN}\nold map\n{generator.END}\n")
    assert generator.main(["--check"], design, tmp_path) == 1
    assert generator.main([], design, tmp_path) == 0
    assert generator.main(["--check"], design, tmp_path) == 0
    assert design.read_text().startswith(f"# Design\n\n{generator.BEGIN}\nEvery module of")


def test_a_design_without_the_markers_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path)
    design = tmp_path / "DESIGN.md"
    design.write_text("# Design\n")
    assert load_generator().main([], design, tmp_path) == 1
    assert design.read_text() == "# Design\n"

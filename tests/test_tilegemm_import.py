"""``import tilegemm`` is ``import pipeline``'s API under the distribution's name: the same
names, the same objects, as lazy (a fresh interpreter per case: this session loaded dask)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("dask", "distributed", "zarr", "numba", "fsspec")


def run(code: str, cwd: Path) -> str:
    """``code`` in a fresh interpreter in ``cwd``, outside the checkout: the package comes from
    the install (an editable one here), not from the working folder."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_same_api_without_loading_dask(tmp_path: Path) -> None:
    code = (
        "import sys, tilegemm, pipeline; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules)); "
        "assert tilegemm.__all__ == pipeline.__all__, tilegemm.__all__; "
        "public = [n for n in dir(tilegemm) if not n.startswith('_')]; "
        "assert public == pipeline.__all__, public; "
        "assert tilegemm.multiply is pipeline.multiply and tilegemm.gram is pipeline.gram; "
        "assert tilegemm.MultiplyResult is pipeline.MultiplyResult"
    )
    assert run(code, tmp_path) == ""  # nothing heavy loaded by the import alone
    assert run("import tilegemm; print(callable(tilegemm.prepare_gram))", tmp_path) == "True"


def test_other_names_are_refused(tmp_path: Path) -> None:
    code = "import tilegemm\ntry:\n    tilegemm.plan\nexcept AttributeError as e:\n    print(e)\n"
    assert run(code, tmp_path) == "module 'tilegemm' has no attribute 'plan'"


def test_help_documents_each_function(tmp_path: Path) -> None:
    names = ("multiply", "gram", "prepare", "prepare_gram")
    code = "import tilegemm, pydoc; " + "; ".join(
        f"print(pydoc.render_doc(tilegemm.{name}).count('storage_options'))" for name in names
    )
    assert all(int(count) > 0 for count in run(code, tmp_path).split()), names

"""The layers import alone: the pure ones load none of the heavy libraries (a fresh
interpreter per case, since this test session has imported them all)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO

HEAVY = ("dask", "distributed", "zarr", "numba", "fsspec", "cupy")


@pytest.mark.parametrize(
    "modules",
    [
        "pipeline.plan.search, pipeline.plan.matmul",  # the planner and its plan
        "pipeline.plan.memory",  # the memory model
        "pipeline.plan.units, pipeline.errors",  # sizes and errors
        "kernels.cuda.launch, kernels.panels",  # launch math, panel checks
        "kernels.device.interface, kernels.device.engine",  # the device interface and engine
        "kernels.inspect.sass",  # machine-code reading
        "kernels.backends",  # the registry: names, dtypes, rules
        "cluster.spec",  # cluster options, pure
        "pipeline",  # the package's face is lazy
    ],
)
def test_pure_modules_load_no_heavy_library(modules: str) -> None:
    code = (
        f"import sys; import {modules}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "", f"import {modules} loaded {out.stdout.strip()}"


def test_lazy_faces_still_give_their_names() -> None:
    code = (
        "import pipeline, inspect; "
        "assert callable(pipeline.multiply) and callable(pipeline.prepare); "
        "assert callable(pipeline.gram) and callable(pipeline.verify_product); "
        # Loading every module must not shadow a face with a submodule of the same name.
        "import pipeline.cli.main, pipeline.gramian, pipeline.verify.check; "
        "faces = [n for n in pipeline.__all__ if inspect.ismodule(getattr(pipeline, n))]; "
        "assert not faces, faces"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)

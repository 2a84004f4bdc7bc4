"""Test helpers: write inputs, make matrices, compare a product with float64 numpy."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import zarr

REPO = Path(__file__).resolve().parents[1]

UNIT_ROUNDOFF = {
    "fp16": 2.0**-11,
    "bf16": 2.0**-8,
    "tf32": 2.0**-11,  # fp32's exponent, 10 stored mantissa bits (tensor cores round to it)
    # big + small keeps 22 bits of each operand and drops small.small: up to 7 u32 for one
    # product (tests/kernels/test_tf32_emulation.py), so 4 u32, not fp32's own u
    "3xtf32": 2.0**-22,
    "fp32": 2.0**-24,
    "fp64": 2.0**-53,
}
"""u of each precision a product may be computed in (half a unit in the last place)."""
BOUND_FACTOR = 3.0
"""c in c·√K·u·|A|·|B|. Worst seen over random signs, positive data, complex, BLAS and
one-by-one sums: 1.75 (complex, K = 1); c = 3 keeps the worst case rigorous up to K = 9."""


def run_cli(
    *args: str,
    module: str = "pipeline",
    env: dict[str, str | None] | None = None,
    timeout: float = 120,
    prefix: tuple[str, ...] = (),
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from this checkout (in folder ``cwd``), after the command
    ``prefix`` (e.g. ``file_modes_bind()``); ``env`` changes the environment (None unsets a
    variable)."""
    environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    return subprocess.run(
        [*prefix, sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


ROOT_WITHOUT_DAC = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search")
"""Root's processes keep every capability but the two that bypass file modes."""


@functools.cache
def file_modes_bind() -> tuple[str, ...] | None:
    """A command prefix under which a file's permission bits bind the child: none for a user
    other than root; for root, ROOT_WITHOUT_DAC (dropped from the bounding set, so the child's
    workers lack them too); None where that does not work here (no setpriv, no CAP_SETPCAP)."""
    if os.geteuid() != 0:
        return ()
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "unreadable"
        probe.write_text("x")
        probe.chmod(0)
        try:
            done = subprocess.run([*ROOT_WITHOUT_DAC, "cat", str(probe)], capture_output=True)
        except OSError:
            return None
    return ROOT_WITHOUT_DAC if done.returncode != 0 and b"denied" in done.stderr else None


def write_array(
    path: Path, data: np.ndarray[Any, Any], chunks: tuple[int, int], zarr_format: int = 3
) -> str:
    zarr.create_array(str(path), data=data, chunks=chunks, zarr_format=zarr_format)  # type: ignore[arg-type]
    return str(path)


def random_matrix(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> Any:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dt)
    if dt.kind == "c":
        return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dt)
    return rng.integers(-5, 5, shape).astype(dt)


def default_precision(out_dtype: Any) -> str:
    """The precision a product into ``out_dtype`` is computed in when nothing else is claimed:
    its accumulator's (float16 sums in float32, as pipeline.plan.dtypes does)."""
    dt = np.dtype(out_dtype)
    return "fp64" if dt in (np.float64, np.complex128) else "fp32"


def product_error_bound(
    a: Any, b: Any, out_dtype: Any, precision: str | None = None
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Elementwise bound on |C - A @ B| for C computed in ``precision`` (default: the
    accumulator's) and stored as ``out_dtype``:

        c·√K·(u + u64)·|A|·|B|  +  u_out·(|A @ B| + that)  +  K·tiny

    The first term is the probabilistic bound of a K-long dot product (Higham and Mary 2019),
    with u64 for the float64 reference's own error; the second is the rounding into OUT; the
    last keeps underflow from failing tiny products."""
    wide = "complex128" if np.iscomplexobj(a) or np.iscomplexobj(b) else "float64"
    k = max(a.shape[1], 1)
    u = UNIT_ROUNDOFF[precision or default_precision(out_dtype)]
    out = np.dtype(out_dtype)
    u_out = float(np.finfo(out).eps) / 2
    scale = np.abs(a.astype(wide)) @ np.abs(b.astype(wide))  # abs(int16 -32768) wraps
    accumulated = BOUND_FACTOR * np.sqrt(k) * (u + UNIT_ROUNDOFF["fp64"]) * scale
    want = np.abs(a.astype(wide) @ b.astype(wide))
    return accumulated + u_out * (want + accumulated) + k * float(np.finfo(out).tiny)


def assert_product(
    out: Any, a: Any, b: Any, dtype: str | None = None, precision: str | None = None
) -> None:
    """out == a @ b against float64 (or complex128) numpy within ``product_error_bound``;
    out's dtype is ``dtype`` when given, else numpy.result_type(a, b). ``precision`` names what
    the product claims to be computed in (a key of UNIT_ROUNDOFF), e.g. "tf32"."""
    got = np.asarray(out)
    wide = "complex128" if np.iscomplexobj(a) or np.iscomplexobj(b) else "float64"
    want = a.astype(wide) @ b.astype(wide)
    assert got.shape == want.shape
    assert got.dtype == np.dtype(dtype or np.result_type(a.dtype, b.dtype))
    assert not np.isnan(got).any(), "unwritten (NaN) elements in the output"
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        return
    error = np.abs(got.astype(wide) - want)
    bound = product_error_bound(a, b, got.dtype, precision)
    worst = np.unravel_index(np.argmax(error - bound), error.shape) if error.size else ()
    assert (error <= bound).all(), (
        f"error {error[worst]:.3g} > bound {bound[worst]:.3g} at {worst} "
        f"(K = {a.shape[1]}, {precision or default_precision(got.dtype)})"
    )


def cpu_tile_task(
    a_url: str, b_url: str, out: Path, threads: int = 1, **plan_options: Any
) -> tuple[Any, Any]:
    """(plan, TaskSpec) to run tile tasks directly, OUT created: the CPU backend on one worker
    with ``threads`` threads and 2 GiB, as ``multiply`` would plan and specify it."""
    from pipeline.job import fingerprint
    from pipeline.plan.search import plan_matmul
    from pipeline.plan.spec import StoreSpec
    from pipeline.run.spec import TaskSpec
    from pipeline.store.inputs import array_spec, open_input
    from pipeline.store.output import Output

    a, b = array_spec(open_input(a_url), "A"), array_spec(open_input(b_url), "B")
    plan = plan_matmul(
        a, b, workers=1, threads_per_worker=threads, memory_limit_bytes=2**31, **plan_options
    )
    Output(str(out)).create(plan.out.shape, plan.out.chunks, plan.out.dtype, {})
    spec = TaskSpec(
        StoreSpec(a_url, b_url, str(out)),
        "cpu",
        plan.compute_dtype,
        plan.out.dtype,
        fingerprint(plan),
        block_shape=plan.block_shape,
    )
    return plan, spec


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one `error:` line of a refusal (exit 2, no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def run_main(argv: list[str], capsys: Any) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline argv`` in this process (pytest's ``capsys`` takes its output)."""
    from pipeline.cli.main import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)

"""The Python API as a notebook meets it: errors in keywords (the command line keeps its flags),
``dir()`` and ``help()`` of the package, one-line reprs, no dashboard-port warning, and gram's
refusals saying what to do instead."""

from __future__ import annotations

import dataclasses
import errno
import pickle
import pydoc
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

import pipeline
from cluster.spec import ClusterSpec
from pipeline.errors import ChunkSizeError, OutputExistsError, UsageError
from pipeline.gramian import INSTEAD, NOT_FOR_GRAM, prepare_gram
from pipeline.options.product import DECLARED, for_python
from pipeline.options.spelling import cli_spelling, python_spelling
from tests.helpers import REPO, run_cli, write_array

FAST = ("--workers", "1", "--threads-per-worker", "1", "--dashboard-address", "127.0.0.1:0")


@pytest.fixture
def ab(tmp_path: Path) -> tuple[str, str, str]:
    rng = np.random.default_rng(0)
    a = write_array(tmp_path / "a.zarr", rng.standard_normal((20, 12), "float32"), (8, 8))
    b = write_array(tmp_path / "b.zarr", rng.standard_normal((12, 10), "float32"), (8, 8))
    return a, b, str(tmp_path / "c.zarr")


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("message", "python"),
    [
        # a flag alone; a path that holds the same letters stays
        ("OUT (/d/x--resume.zarr) exists; pass --overwrite or --resume",
         "OUT (/d/x--resume.zarr) exists; pass overwrite=True or resume=True"),
        # inside a path or URL, or glued to a file name: not a flag
        ("s3://b/--resume, /d/--overwrite/c.zarr, ./--resume.zarr and a--verify",
         "s3://b/--resume, /d/--overwrite/c.zarr, ./--resume.zarr and a--verify"),
        # a valued flag with its value, quoted as Python takes it
        ("pass --dtype int32 or --dtype 'int9'", "pass dtype='int32' or dtype='int9'"),
        # pairs become tuples, numbers stay numbers, a bare valued flag is its keyword's name
        ("--shards 10x5 needs --chunks 5x5; drop --chunks",
         "shards=(10, 5) needs chunks=(5, 5); drop chunks"),
        ("--alpha 0.5 is not whole; --beta scales C", "alpha=0.5 is not whole; beta scales C"),
        # a choice, then prose after a valued flag is not its value
        ("--backend auto chose cpu; raise --memory-limit so that",
         "backend='auto' chose cpu; raise memory_limit so that"),
        # the end of a sentence is not part of the value
        ("rerun with --resume. Or pass --dtype float64.",
         "rerun with resume=True. Or pass dtype='float64'."),
        # a possessive
        ("--report's folder is missing", "report's folder is missing"),
        # storage options: one dict for flags side by side
        ("pass --storage-option key=... --storage-option secret=..., or --storage-option anon=true",
         "pass storage_options={'key': ..., 'secret': ...}, or storage_options={'anon': True}"),
        # the cluster's flags are ClusterSpec fields
        ("give --scheduler ADDRESS or --workers 2 --threads-per-worker 1",
         "give cluster=ClusterSpec(scheduler=ADDRESS) or "
         "cluster=ClusterSpec(workers=2, threads_per_worker=1)"),
        # the command line's own flags
        ("see --dry-run, --help, --no-progress",
         "see pipeline.prepare(...), help(pipeline.multiply), progress=False"),
        # a command line of ours quoted: a call
        ("run `multiply X X G --workers 2 --storage-option anon=true --transpose-a --alpha 2` "
         "or `gram X G [--rows]`",
         "run `pipeline.multiply(X, X, G, transpose_a=True, alpha=2, "
         "cluster=ClusterSpec(workers=2), storage_options={'anon': True})` or "
         "`pipeline.gram(X, G[, rows=True])`"),
        ("finish with `python -m pipeline multiply /d/a.zarr /d/b.zarr /d/c.zarr --resume`",
         "finish with `pipeline.multiply('/d/a.zarr', '/d/b.zarr', '/d/c.zarr', resume=True)`"),
        # another tool's command and flags stay
        ("start `dask scheduler --scheduler-file s.json`; docker run --gpus all",
         "start `dask scheduler --scheduler-file s.json`; docker run --gpus all"),
    ],
)  # fmt: skip
def test_flags_in_python_words(message: str, python: str) -> None:
    assert python_spelling(message, DECLARED) == python
    assert python_spelling(python, DECLARED) == python  # nothing left to respell


def test_python_callers_read_keywords_the_command_line_flags(
    ab: tuple[str, str, str], client: Client
) -> None:
    a, b, out = ab
    pipeline.multiply(a, b, out, client=client)
    with pytest.raises(
        OutputExistsError, match=r"pass overwrite=True to replace it or resume=True"
    ):
        pipeline.multiply(a, b, out, client=client)
    with pytest.raises(UsageError, match="^overwrite=True and resume=True exclude each other"):
        pipeline.prepare(a, b, out, overwrite=True, resume=True)
    with (
        cli_spelling(),
        pytest.raises(OutputExistsError, match=r"pass --overwrite to replace it or --resume"),
    ):
        pipeline.multiply(a, b, out, client=client)
    # The command line, as a user runs it.
    done = run_cli("multiply", a, b, out, *FAST)
    assert done.returncode == 2
    assert "pass --overwrite to replace it or --resume" in one_error(done)


def test_a_job_and_verify_are_doors_too(ab: tuple[str, str, str], client: Client) -> None:
    a, b, out = ab
    pipeline.multiply(a, b, out, client=client)
    job = pipeline.prepare(a, b, out)  # planned; OUT is claimed when it runs
    with pytest.raises(OutputExistsError, match="pass overwrite=True"):
        job.execute(client)
    with pytest.raises(UsageError, match=r"drop the transpose_a=/transpose_b= flags"):
        pipeline.verify_product(client, a, b, out, transpose_a=True)


def _chunk_error() -> None:
    try:
        raise OSError("underneath")
    except OSError as e:
        raise ChunkSizeError("refused; rerun with --resume", 5, 8) from e


def test_the_same_exception_comes_out() -> None:
    """Class, extra attributes, cause and pickling (worker to client) are the error's own."""
    with pytest.raises(ChunkSizeError) as raised:
        for_python(_chunk_error)()
    error = raised.value
    assert str(error) == "refused; rerun with resume=True"
    assert (error.declared, error.expected) == (5, 8)
    assert isinstance(error.__cause__, OSError) and str(error.__cause__) == "underneath"
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.declared) == (ChunkSizeError, str(error), 5)


def test_gram_refuses_in_keywords_through_both_its_doors() -> None:
    with pytest.raises(UsageError, match=r"^gram takes no alpha: .*rows=True"):
        pipeline.gram("x.zarr", "g.zarr", alpha=2.0)


def test_dir_and_help_show_the_api() -> None:
    assert {"multiply", "gram", "prepare", "prepare_gram", "verify_product"} <= set(dir(pipeline))
    assert {"MatmulJob", "MultiplyResult", "PipelineError", "VerifyResult"} <= set(dir(pipeline))
    shown = pydoc.render_doc(pipeline, renderer=pydoc.plaintext)
    assert 'pipeline.multiply("a.zarr", "b.zarr", "c.zarr")' in shown  # the usage example
    for function in ("multiply(a: ", "gram(x: ", "prepare(a: ", "verify_product(client: "):
        assert f"\n    {function}" in shown  # listed under FUNCTIONS, with its signature


def test_dir_loads_nothing_heavy() -> None:
    code = (
        "import sys, pipeline; names = dir(pipeline); import pipeline.plan; "
        "assert 'multiply' in names, names; "
        "print(','.join(m for m in ('dask', 'distributed', 'zarr') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stderr


def test_short_reprs(ab: tuple[str, str, str], client: Client) -> None:
    a, b, out = ab
    job = pipeline.prepare(a, b, out)
    shown = repr(job)
    assert shown.startswith("<MatmulJob ") and "\n" not in shown and len(shown) < 400
    assert "20x10 float32" in shown and "writes a new OUT" in shown and "print(job)" in shown
    assert str(job).startswith("product ") and "\ntiles " in str(job)  # print(job): the plan
    gram = repr(pipeline.prepare_gram(a, str(Path(out).with_name("g.zarr"))))
    assert gram.startswith("<MatmulJob gram ") and "a.zarrᵀ @ " in gram and "a new G" in gram
    secret = dataclasses.replace(
        job, store=dataclasses.replace(job.store, out_url="s3://me:hunter2@b/c.zarr")
    )
    assert "hunter2" not in repr(secret) and "s3://me:***@b/c.zarr" in repr(secret)
    result = job.execute(client)
    shown = repr(result)
    assert shown.startswith("<MultiplyResult 20x10 float32: ") and "\n" not in shown
    assert f"{result.tiles_computed} tile" in shown and "backend cpu" in shown
    assert "verified" not in shown and len(shown) < 200
    failed = dataclasses.replace(result, verified=False)
    assert repr(failed).endswith("verification FAILED>")


@pytest.fixture
def dashboard_port_taken() -> Iterator[None]:
    """8787, the default dashboard port, held (by us, or by whoever holds it already)."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))
        holder.listen()
    except OSError as e:
        assert e.errno == errno.EADDRINUSE
    try:
        yield
    finally:
        holder.close()


@pytest.mark.usefixtures("dashboard_port_taken")
def test_no_port_warning_when_the_api_starts_a_cluster(ab: tuple[str, str, str]) -> None:
    a, b, out = ab
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pipeline.multiply(a, b, out, cluster=ClusterSpec(workers=1, threads_per_worker=1))
        after = list(warnings.filters)
    about_port = [str(w.message) for w in seen if "already in use" in str(w.message)]
    assert about_port == []
    assert after[0][0] == "always"  # the caller's filters are as they were


def test_every_option_gram_refuses_says_what_to_do_instead() -> None:
    assert set(INSTEAD) == set(NOT_FOR_GRAM)
    with pytest.raises(
        UsageError, match=r"`pipeline.multiply\(X, X, G, transpose_b=True, alpha=2\)`"
    ):
        prepare_gram("x.zarr", "g.zarr", rows=True, alpha=2.0)


@pytest.mark.parametrize(
    ("flags", "refused", "instead"),
    [
        (["--alpha", "2"], "--alpha", "`multiply X X G --transpose-a --alpha 2`"),
        (["--rows", "--beta", "0.5"], "--beta",
         "`multiply X X C --transpose-b --accumulate --beta 0.5`"),
        (["--transpose-a"], "--transpose-a", "`multiply A B OUT --transpose-a`"),
        (["--ignore-coordinates"], "--ignore-coordinates", "drop --ignore-coordinates"),
    ],
)  # fmt: skip
def test_gram_on_the_command_line_says_what_to_do_instead(
    tmp_path: Path, flags: list[str], refused: str, instead: str
) -> None:
    x = write_array(tmp_path / "x.zarr", np.ones((8, 4), "float32"), (4, 4))
    done = run_cli("gram", x, str(tmp_path / "g.zarr"), *flags, *FAST)
    line = one_error(done)
    assert done.returncode == 2 and "did you mean" not in line
    assert line.startswith(f"error: gram takes no {refused}: ") and instead in line

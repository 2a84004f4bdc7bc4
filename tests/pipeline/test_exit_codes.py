"""Exit codes that mean what the README says: bad usage or bad input is one `error:` line and
exit 2 (in Python a ValueError or TypeError), refused before OUT is created; exit 1 is kept for
a job or a verification that failed; a reader of stdout that stops early ends nothing badly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client

import pipeline
from pipeline.errors import PipelineError
from pipeline.store import fs
from pipeline.store.lock import LOCK_NAME
from pipeline.store.output import FENCE_WAITS_S, Output
from tests.child_env import child_env
from tests.cluster.processes import QUIET_HTTP, read_address, spawn, stop
from tests.helpers import random_matrix, refused, run_cli, write_array

FAST_CLUSTER = ("--workers", "1", "--dashboard-address", "127.0.0.1:0", "--no-progress")


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str]:
    rng = np.random.default_rng(1)
    a = write_array(tmp_path / "a.zarr", random_matrix(rng, (6, 4), "float32"), (3, 2))
    b = write_array(tmp_path / "b.zarr", random_matrix(rng, (4, 5), "float32"), (2, 5))
    return a, b


def nested_json(path: Path) -> None:
    """Metadata nested past Python's parser (a RecursionError, not a JSONDecodeError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)


# -- inputs ----------------------------------------------------------------------------------


def test_a_missing_zip_archive_is_bad_input(tmp_path: Path, inputs: tuple[str, str]) -> None:
    out = tmp_path / "c.zarr"
    archive = tmp_path / "nonexistent.zip"
    done = run_cli("multiply", f"zip://a::{archive}", inputs[1], str(out), *FAST_CLUSTER)
    line = refused(done)
    assert f"A (zip://a::{archive}): its archive {archive} does not exist" in line
    assert not out.exists()


def test_a_fifo_as_zip_archive_is_refused_unopened(tmp_path: Path, inputs: tuple[str, str]) -> None:
    out, fifo = tmp_path / "c.zarr", tmp_path / "a.zip"
    os.mkfifo(fifo)  # opened blocking, it would wait for a writer forever
    done = run_cli("multiply", inputs[0], f"zip://b::{fifo}", str(out), *FAST_CLUSTER, timeout=60)
    assert "is a FIFO, device or socket, not a file" in refused(done)
    assert not out.exists()


@pytest.mark.parametrize("where", ["a", "out"])
def test_metadata_nested_too_deep_is_bad_input(
    tmp_path: Path, inputs: tuple[str, str], where: str
) -> None:
    a, b = inputs
    out = tmp_path / "c.zarr"
    deep = tmp_path / "deep.zarr"
    nested_json(deep / "zarr.json")
    args = (str(deep), b, str(out)) if where == "a" else (a, b, str(deep), "--overwrite")
    line = refused(run_cli("multiply", *args, *FAST_CLUSTER))
    assert str(deep) in line and "RecursionError" not in line
    assert not out.exists()


def test_credentials_in_an_s3_url_are_refused_unshown(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    url = "s3://AKIAEXAMPLEKEY:wJalrSECRETKEY@bucket/a.zarr"
    done = run_cli("multiply", url, url.replace("a.zarr", "b.zarr"), str(tmp_path / "c.zarr"))
    line = refused(done)
    assert "A (s3://***@bucket/a.zarr) has credentials in its URL" in line
    assert "--storage-option key=" in line
    assert "AKIAEXAMPLEKEY" not in done.stderr and "SECRETKEY" not in done.stderr


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("multiply", "{a}", "{a}", "{out}", "--report", "{url}"), "--report"),
        (("verify", "{a}", "{a}", "{url}"), "C"),
        (("gram", "zip://X::{url}", "{out}"), "A"),
    ],
)
def test_credentials_are_refused_unshown_wherever_a_url_goes(
    tmp_path: Path, inputs: tuple[str, str], args: tuple[str, ...], name: str
) -> None:
    pytest.importorskip("s3fs")
    url = "s3://AKIAEXAMPLEKEY:wJalrSECRETKEY@bucket/r.html"
    filled = [a.format(a=inputs[0], out=tmp_path / "o.zarr", url=url) for a in args]
    done = run_cli(*filled, *FAST_CLUSTER)
    line = refused(done)
    assert f"{name} (s3://***@bucket/r.html) has credentials in its URL" in line
    assert "AKIAEXAMPLEKEY" not in done.stderr and "SECRETKEY" not in done.stderr


def test_a_tls_file_that_is_a_fifo_is_refused_unopened(
    tmp_path: Path, inputs: tuple[str, str]
) -> None:
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    tls = {
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(fifo),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(fifo),
    }
    out = tmp_path / "c.zarr"
    cli = ("multiply", *inputs, str(out), "--scheduler", "tls://127.0.0.1:1", "--no-progress")
    line = refused(run_cli(*cli, env=tls, timeout=60))
    assert f"distributed.comm.tls.ca-file is {fifo}, which is a FIFO" in line
    assert not out.exists()


# -- --report ---------------------------------------------------------------------------------


def test_a_report_onto_stdout_is_refused_before_the_product(
    tmp_path: Path, inputs: tuple[str, str]
) -> None:
    out = tmp_path / "c.zarr"
    done = run_cli("multiply", *inputs, str(out), "--report", "/dev/stdout", *FAST_CLUSTER)
    assert "is in /proc, where the kernel keeps its own files" in refused(done)
    assert "started" not in done.stderr, "a cluster was started before the refusal"
    assert not out.exists(), "the product ran before --report was refused"


def test_a_report_that_is_not_a_path_is_a_type_error(
    tmp_path: Path, inputs: tuple[str, str]
) -> None:
    with pytest.raises(TypeError, match=r"report is int 123, not a path") as caught:
        pipeline.prepare(*inputs, str(tmp_path / "c.zarr"), report=123)  # type: ignore[arg-type]
    assert isinstance(caught.value, PipelineError) and caught.value.exit_code == 2


# -- the API refuses what the command line refuses ------------------------------------------


def test_the_api_refuses_a_chunk_grid_too_large(tmp_path: Path) -> None:
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(10**6, 1), chunks=(10**6, 1), dtype="f4")
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=(1, 10**6), chunks=(1, 10**6), dtype="f4")
    out = tmp_path / "c.zarr"
    with pytest.raises(ValueError, match=r"chunks=\(1, 1\) makes 1,000,000,000,000 chunks"):
        pipeline.prepare(a, b, str(out), chunks=(1, 1))
    assert not out.exists()


# -- stdout --------------------------------------------------------------------------------------


def test_a_reader_that_stops_early_ends_nothing_badly(
    tmp_path: Path, inputs: tuple[str, str]
) -> None:
    """`multiply ... --dry-run | head -1`: here the reader is gone before the first line."""
    argv = [sys.executable, "-m", "pipeline", "multiply", *inputs, str(tmp_path / "c.zarr")]
    child = subprocess.Popen(
        [*argv, "--dry-run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env()
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # no reader: every write to stdout is a broken pipe
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=60) == 0, stderr
    assert "BrokenPipe" not in stderr and "error:" not in stderr and "Exception" not in stderr


# -- workers --------------------------------------------------------------------------------------


@pytest.fixture
def cluster_elsewhere(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A scheduler, and a worker that sees an empty folder where `elsewhere` is here (a
    mount namespace of its own): the folder this machine writes OUT into, unseen by it."""
    if not (sys.platform == "linux" and os.geteuid() == 0 and shutil.which("unshare")):
        pytest.skip("needs root and unshare(1) to give a worker other files")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scheduler_file = tmp_path / "scheduler.json"
    scheduler = spawn(
        "distributed.cli.dask_scheduler",
        *("--host", "127.0.0.1", "--port", "0", *QUIET_HTTP),
        *("--scheduler-file", str(scheduler_file)),
        log=tmp_path / "scheduler.log",
    )
    worker = None
    try:
        address = read_address(scheduler_file, scheduler)
        worker_cli = [sys.executable, "-m", "distributed.cli.dask_worker", address]
        worker_cli += ["--nthreads", "1", "--host", "127.0.0.1", *QUIET_HTTP]
        shell = f'mount -t tmpfs none "{elsewhere}" && exec "$@"'
        with (tmp_path / "worker.log").open("wb") as log:
            worker = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", shell, "sh"] + worker_cli,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
            )
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
        yield address, elsewhere
    finally:
        for process in (worker, scheduler):
            if process is not None:
                stop(process)


def test_an_out_the_workers_cannot_see_is_bad_usage(
    inputs: tuple[str, str], cluster_elsewhere: tuple[str, Path]
) -> None:
    address, elsewhere = cluster_elsewhere
    out = elsewhere / "c.zarr"
    line = refused(run_cli("multiply", *inputs, str(out), "--scheduler", address, "--no-progress"))
    assert f"cannot see OUT ({out}), which this machine created" in line
    assert "shared file system" in line and "rerun with --resume" in line


# -- the fence -----------------------------------------------------------------------------------


def test_a_transient_storage_error_at_the_fence_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what s3fs passes on when the endpoint does not answer: botocore's, not an OSError
    botocore = pytest.importorskip("botocore.exceptions")
    down = botocore.EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    out = tmp_path / "c.zarr"
    out.mkdir()
    (out / LOCK_NAME).write_text('{"pid": 1, "token": "t"}')
    read_small, failures = fs.read_small, [down] * 2

    def flaky(*args: object) -> bytes | None:
        if failures:
            raise failures.pop()
        return read_small(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fs, "read_small", flaky)
    monkeypatch.setattr("time.sleep", lambda s: None)
    Output(str(out), {}).check_fence("t")  # two failed reads, then the lock: the band goes on
    failures[:] = [down] * (len(FENCE_WAITS_S) + 1)
    with pytest.raises(type(down)):  # a storage that stays down fails the band
        Output(str(out), {}).check_fence("t")
    assert not failures

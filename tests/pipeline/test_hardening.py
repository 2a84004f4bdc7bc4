"""Hardening: secrets inside URLs are never shown, `random` refuses a negative seed and an
absurd chunk count before OUT exists, and dask's scratch directory is refused inside an array."""

from __future__ import annotations

import functools
import http.server
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import dask
import numpy as np
import pytest

from cluster.scratch_dirs import check_scratch_dirs
from cluster.spec import ClusterSpec
from pipeline.api import prepare
from pipeline.errors import UsageError
from pipeline.generate import MAX_CHUNKS, write_random
from pipeline.plan.spec import StoreSpec
from pipeline.sensitive.text import redact_url, url_secrets
from pipeline.sensitive.values import ScrubLogs, secret_values
from tests.helpers import run_cli, write_array

SECRET = "SECRET-6d1c"
"""What no output may show."""


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("s3://user:SECRET-6d1c@bucket/a.zarr", "s3://user:***@bucket/a.zarr"),  # password
        ("s3://user:p@SECRET-6d1c@bucket/a", "s3://user:***@bucket/a"),  # one holding an @
        ("https://h/a.zarr?X-Amz-Signature=SECRET-6d1c&X-Amz-Date=1",
         "https://h/a.zarr?X-Amz-Signature=***&X-Amz-Date=1"),  # presigned S3: the signature
        ("https://h/a?X-Amz-Credential=AKIA%2F1&X-Amz-Security-Token=t0k&x=1",
         "https://h/a?X-Amz-Credential=***&X-Amz-Security-Token=***&x=1"),
        ("https://h/a?AWSAccessKeyId=AK&Signature=s&Expires=9",
         "https://h/a?AWSAccessKeyId=***&Signature=***&Expires=9"),  # S3 signature v2
        ("https://acct.blob/c/a?sv=2022&sig=SECRET-6d1c", "https://acct.blob/c/a?sv=2022&sig=***"),
        ("https://f/api?code=c0de&key=k&api_key=a&apikey=b",
         "https://f/api?code=***&key=***&api_key=***&apikey=***"),
        ("https://h/a?token=t&access_token=u&password=p#frag",
         "https://h/a?token=***&access_token=***&password=***#frag"),
        ("B (https://h/a?sig=SECRET-6d1c) can't", "B (https://h/a?sig=***) can't"),  # in text
        ("https://h/a.zarr?version=3&x=y", "https://h/a.zarr?version=3&x=y"),  # nothing secret
        ("/data/a.zarr", "/data/a.zarr"),  # a path
        ("tcp://127.0.0.1:8786 and me@example.org", "tcp://127.0.0.1:8786 and me@example.org"),
    ],
)  # fmt: skip
def test_redact_url(given: str, shown: str) -> None:
    assert redact_url(given) == shown
    assert redact_url(shown) == shown  # idempotent


def test_url_secrets_are_what_free_text_must_not_show() -> None:
    url = "s3://me:pa%40ss-word@b/x?sig=SECRET-6d1c&tok=no&code=ab"
    assert url_secrets(url) == {"pa%40ss-word", "pa@ss-word", SECRET}  # "ab": too short
    assert secret_values({"endpoint_url": "https://h:9?token=SECRET-6d1c"}) == {SECRET}


def test_reprs_hide_url_secrets() -> None:
    spec = StoreSpec(f"s3://u:{SECRET}@b/a", f"https://h/b?sig={SECRET}", "/tmp/c")
    assert SECRET not in repr(spec)
    assert "s3://u:***@b/a" in repr(spec) and "sig=***" in repr(spec)


def test_our_log_lines_hide_url_secrets(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pipeline"):
        logging.getLogger("pipeline").info("reading %s", f"https://h/a?X-Amz-Signature={SECRET}")
    assert SECRET not in caplog.text and "X-Amz-Signature=***" in caplog.text


def test_the_log_filter_hides_url_secrets_in_any_record() -> None:
    try:
        raise OSError(f"cannot open s3://u:{SECRET}@b/a")
    except OSError:
        record = logging.LogRecord(
            "distributed", logging.ERROR, __file__, 1, "failed %s", (f"x?token={SECRET}",), None
        )
        record.exc_info = sys.exc_info()
    assert ScrubLogs(()).filter(record)
    assert record.getMessage() == "failed x?token=***"
    assert SECRET not in logging.Formatter().format(record)


@pytest.fixture
def http_inputs(tmp_path: Path) -> Iterator[str]:
    """A folder of arrays served over HTTP on loopback (any user:password is let in)."""
    write_array(tmp_path / "a.zarr", np.ones((6, 4), "float32"), (3, 2))
    write_array(tmp_path / "b.zarr", np.ones((4, 5), "float32"), (2, 5))
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_dry_run_never_shows_a_url_password(http_inputs: str, tmp_path: Path) -> None:
    url = http_inputs.replace("http://", f"http://reader:{SECRET}@")
    out = str(tmp_path / "c.zarr")
    done = run_cli("--debug", "multiply", f"{url}/a.zarr", f"{url}/b.zarr", out, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "product" in done.stdout  # the plan's table
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "url",
    [
        # a presigned URL that can't be reached: the message quotes the URL
        f"http://127.0.0.1:1/b.zarr?X-Amz-Signature={SECRET}&X-Amz-Credential=AKIA%2F{SECRET}",
        # a password botocore quotes outside the URL ("Invalid bucket name "user:...@bucket"")
        f"s3://user:{SECRET}@bucket/b.zarr",
        f"http://127.0.0.1:1/b.zarr?sig={SECRET}",
    ],
)
@pytest.mark.parametrize("debug", [(), ("--debug",)], ids=["plain", "debug"])
def test_a_refusal_never_shows_a_url_secret(
    tmp_path: Path, url: str, debug: tuple[str, ...]
) -> None:
    a = write_array(tmp_path / "a.zarr", np.ones((6, 4), "float32"), (3, 2))
    done = run_cli(*debug, "multiply", a, url, str(tmp_path / "c.zarr"), "--dry-run")
    assert done.returncode in (1, 2), done.stderr
    assert "error: " in done.stderr  # (botocore's message takes several lines)
    assert SECRET not in done.stdout + done.stderr
    assert "***" in done.stderr


def test_a_url_secret_in_a_misplaced_argument_is_hidden(tmp_path: Path) -> None:
    url = f"s3://u:{SECRET}@b/y"  # an extra argument: argparse quotes it
    done = run_cli("random", str(tmp_path / "x.zarr"), url, "--shape", "2x2", "--chunks", "1x1")
    assert done.returncode == 2
    assert SECRET not in done.stderr and "s3://u:***@b/y" in done.stderr


# --- random: bad seeds and absurd chunk counts, refused before OUT exists ---


@pytest.mark.parametrize("seed", ["-1", "-99", "1.5", "x"])
def test_random_refuses_a_bad_seed(tmp_path: Path, seed: str) -> None:
    out = tmp_path / "x.zarr"
    done = run_cli("random", str(out), "--shape", "4x4", "--chunks", "2x2", "--seed", seed)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line
    assert "seeds are integers >= 0" in line and repr(seed) in line
    assert not out.exists()


def test_verify_refuses_a_negative_seed(tmp_path: Path) -> None:
    paths = [str(tmp_path / n) for n in ("a", "b", "c")]
    done = run_cli("verify", *paths, "--seed", "-1")
    assert done.returncode == 2 and "seeds are integers >= 0" in done.stderr


@pytest.mark.parametrize("seed", [-1, 1.0, True])
def test_write_random_refuses_a_bad_seed(tmp_path: Path, seed: object) -> None:
    out = tmp_path / "x.zarr"
    with pytest.raises(UsageError, match=r"seeds are integers >= 0"):
        write_random(str(out), (4, 4), (2, 2), "float32", seed)  # type: ignore[arg-type]
    assert not out.exists()


def test_random_refuses_an_absurd_chunk_count(tmp_path: Path) -> None:
    out = tmp_path / "big.zarr"
    shape = "1000000000000x1000000000000"
    done = run_cli("random", str(out), "--shape", shape, "--chunks", "1x1", timeout=60)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line
    assert "1,000,000,000,000,000,000,000,000 chunks" in line
    assert f"limit of {MAX_CHUNKS:,}" in line and "bigger --chunks" in line
    assert not out.exists()


def test_random_at_the_chunk_limit_is_planned_not_refused(tmp_path: Path) -> None:
    # MAX_CHUNKS chunks pass the check (the write itself is not run here: 10^7 files)
    from pipeline.generate import check_chunk_count

    check_chunk_count((MAX_CHUNKS, 1), (1, 1))
    with pytest.raises(UsageError, match=r"10,000,001 chunks \(10,000,001x1\)"):
        check_chunk_count((MAX_CHUNKS + 1, 1), (1, 1))


def test_random_writes_every_chunk_past_one_batch(tmp_path: Path) -> None:
    import zarr

    from pipeline.generate import BATCH

    rows = BATCH + 3  # more chunks than one batch of the writer threads
    array = write_random(str(tmp_path / "x.zarr"), (rows, 2), (1, 1), "float32", 7)
    values = zarr.open_array(str(tmp_path / "x.zarr"))[:]
    assert array.shape == (rows, 2) and np.all(values != 0) and np.all(np.abs(values) <= 1)


# --- dask's scratch directory inside an array ---


@pytest.fixture
def arrays(tmp_path: Path) -> tuple[str, str, str]:
    a = write_array(tmp_path / "a.zarr", np.ones((6, 4), "float32"), (3, 2))
    b = write_array(tmp_path / "b.zarr", np.ones((4, 5), "float32"), (2, 5))
    return a, b, str(tmp_path / "c.zarr")


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ("a.zarr", "A"),  # the array itself
        ("a.zarr/scratch", "A"),  # inside an input
        ("b.zarr/0", "B"),
        ("c.zarr/tmp", "OUT"),  # inside OUT, which need not exist yet
        ("link/scratch", "B"),  # through a link to B
    ],
)
def test_a_scratch_directory_inside_an_array_is_refused(
    arrays: tuple[str, str, str], tmp_path: Path, where: str, named: str
) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "b.zarr")
    scratch = tmp_path / where
    with dask.config.set({"temporary-directory": str(scratch)}), pytest.raises(UsageError) as e:
        prepare(*arrays)
    message = str(e.value)
    assert f"{named} (" in message and "DASK_TEMPORARY_DIRECTORY" in message
    assert str(scratch.resolve()) in message


@pytest.mark.parametrize(
    ("scratch", "spec"),
    [
        ("elsewhere", ClusterSpec()),  # beside the arrays, not inside
        ("a.zarr", ClusterSpec(scheduler="tcp://127.0.0.1:8786")),  # a cluster we only join
    ],
)
def test_a_scratch_directory_elsewhere_is_fine(
    arrays: tuple[str, str, str], tmp_path: Path, scratch: str, spec: ClusterSpec
) -> None:
    with dask.config.set({"temporary-directory": str(tmp_path / scratch)}):
        check_scratch_dirs(arrays, spec)
        check_scratch_dirs(("s3://b/a", "s3://b/b", "s3://b/c"), ClusterSpec())


def test_gram_names_its_arrays(tmp_path: Path) -> None:
    from pipeline.gramian import prepare_gram

    x = write_array(tmp_path / "x.zarr", np.ones((6, 4), "float32"), (3, 2))
    refused = pytest.raises(UsageError, match=r"is G \(.*outside X, G")
    with dask.config.set({"temporary-directory": str(tmp_path / "g.zarr")}), refused:
        prepare_gram(x, str(tmp_path / "g.zarr"))


@pytest.mark.parametrize("variable", ["DASK_TEMPORARY_DIRECTORY", "TMPDIR"])
def test_the_cli_refuses_a_scratch_directory_inside_an_input(
    arrays: tuple[str, str, str], variable: str
) -> None:
    scratch = Path(arrays[0]) / "tmp"
    scratch.mkdir()  # $TMPDIR is used only when it exists
    env: dict[str, str | None] = {"DASK_TEMPORARY_DIRECTORY": None, "TMPDIR": None}
    env[variable] = str(scratch)
    done = run_cli("multiply", *arrays, "--dry-run", env=env)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith("error: dask's temporary directory") and "\n" not in line
    assert f"inside A ({arrays[0]})" in line and "set DASK_TEMPORARY_DIRECTORY" in line
    assert not Path(arrays[2]).exists()


def test_verify_refuses_a_scratch_directory_inside_c(tmp_path: Path) -> None:
    a = write_array(tmp_path / "a.zarr", np.ones((6, 4), "float32"), (3, 2))
    b = write_array(tmp_path / "b.zarr", np.ones((4, 5), "float32"), (2, 5))
    c = write_array(tmp_path / "c.zarr", np.full((6, 5), 4, "float32"), (3, 5))
    env: dict[str, str | None] = {"DASK_TEMPORARY_DIRECTORY": f"{c}/scratch"}
    done = run_cli("verify", a, b, c, env=env)
    assert done.returncode == 2, done.stderr
    assert f"inside C ({c})" in done.stderr
    assert not Path(c, "scratch").exists()

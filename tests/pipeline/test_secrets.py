"""Secrets stay secret: sensitive storage options are hidden in reprs, messages, logs and
tracebacks, can be given from a file or the environment, and going to a scheduler over plain
TCP warns."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from distributed import Client
from fsspec.implementations.memory import MemoryFileSystem

from pipeline.api import prepare
from pipeline.cli.main import main
from pipeline.cli.parser import build_parser, parse_args, parse_storage_options, storage_options
from pipeline.errors import UsageError
from pipeline.sensitive.values import ScrubLogs, exposure_warning, redact, secret_values
from pipeline.store.locate import merge_options
from pipeline.store.options_file import ENV
from tests.helpers import write_array

FAKE = "FAKE-SECRET-8e1f"
"""A secret nothing else prints; its absence is what the tests check."""
FAKE_TOKEN = "FAKE-TOKEN-77aa"
OPTIONS = {"key": "AKIA-FAKE-1", "secret": FAKE, "client_kwargs": {"aws_session_token": FAKE_TOKEN}}


def assert_hidden(*texts: str) -> None:
    for text in texts:
        for secret in (FAKE, FAKE_TOKEN, "AKIA-FAKE-1"):
            assert secret not in text, text


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ({"secret": "s3cr"}, {"secret": "***"}),  # the name itself
        ({"aws_secret_access_key": "x"}, {"aws_secret_access_key": "***"}),  # inside a name
        ({"Password": "x", "api_token": 1}, {"Password": "***", "api_token": "***"}),  # any case
        ({"client_kwargs": {"region_name": "eu", "aws_session_token": "t"}},
         {"client_kwargs": {"region_name": "eu", "aws_session_token": "***"}}),  # nested
        ({"headers": {"Authorization": "Bearer x"}}, {"headers": {"Authorization": "***"}}),
        ({"endpoint_url": "http://me:pw@host:9000"}, {"endpoint_url": "http://me:***@host:9000"}),
        ({"anon": True, "endpoint_url": "http://h:9"}, {"anon": True, "endpoint_url": "http://h:9"}),
        ({"token": None}, {"token": None}),  # nothing to hide
    ],
)  # fmt: skip
def test_redact(given: dict[str, Any], shown: dict[str, Any]) -> None:
    assert redact(given) == shown


def test_secret_values_are_what_free_text_must_not_show() -> None:
    assert secret_values(OPTIONS) == {"AKIA-FAKE-1", FAKE, FAKE_TOKEN}
    assert secret_values({"endpoint_url": "http://me:longpass@h"}) == {"longpass"}


def test_a_numeric_secret_stays_a_string() -> None:
    got = parse_storage_options(["secret=0123", "key=12", "max_concurrency=4", "anon=true"])
    assert got == {"secret": "0123", "key": "12", "max_concurrency": 4, "anon": True}


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str, str]:
    a = write_array(tmp_path / "a.zarr", np.ones((6, 4), "float32"), (3, 2))
    b = write_array(tmp_path / "b.zarr", np.ones((4, 5), "float32"), (2, 5))
    return a, b, str(tmp_path / "c.zarr")


def test_a_job_never_shows_its_secrets(inputs: tuple[str, str, str]) -> None:
    job = prepare(*inputs, storage_options=OPTIONS)
    assert job.store.storage_options == OPTIONS  # the workers still get them
    assert_hidden(repr(job), str(job), repr(job.store), repr(job.options), job.describe())
    assert_hidden(repr(job.output))
    assert "'secret': '***'" in repr(job.store) and "'secret': '***'" in repr(job.options)


def test_a_conflict_does_not_show_the_values() -> None:
    with pytest.raises(UsageError, match="'secret' .two values, hidden") as refused:
        merge_options([("storage_options=", {"secret": FAKE}), ("A", {"secret": "other-one"})])
    other = {**OPTIONS, "client_kwargs": {"aws_session_token": "other-token"}}
    with pytest.raises(UsageError, match="'client_kwargs'") as nested:
        merge_options([("A", OPTIONS), ("B", other)])
    assert_hidden(str(refused.value), str(nested.value))
    assert "other-one" not in str(refused.value) and "other-token" not in str(nested.value)


def _routes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str) -> list[str]:
    """The CLI arguments giving OPTIONS one way; the file is private (no warning)."""
    if route == "option":
        return [f"--storage-option={k}={v}" for k, v in OPTIONS.items() if k != "client_kwargs"]
    if route == "env":
        monkeypatch.setenv(ENV, json.dumps(OPTIONS))
        return []
    path = tmp_path / "so.json"
    path.write_text(json.dumps(OPTIONS))
    path.chmod(0o600)
    return ["--storage-options-file", str(path)]


@pytest.mark.parametrize("route", ["option", "file", "env"])
def test_dry_run_output_hides_secrets(
    inputs: tuple[str, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    route: str,
) -> None:
    assert main(["multiply", *inputs, "--dry-run", *_routes(tmp_path, monkeypatch, route)]) == 0
    out, err = capsys.readouterr()
    assert "tiles" in out
    assert_hidden(out, err)


class LeakyFileSystem(MemoryFileSystem):
    """A file system that, like some libraries, puts its options in its error and log text."""

    protocol = "leaky"

    def __init__(self, **options: Any) -> None:
        logging.getLogger("pipeline").warning("leaky: connecting with %s", options)
        raise ValueError(f"cannot authenticate with {options}")


@pytest.fixture
def leaky() -> None:
    fsspec.register_implementation("leaky", LeakyFileSystem, clobber=True)


@pytest.mark.parametrize("route", ["option", "file", "env"])
@pytest.mark.parametrize("debug", [[], ["--debug"]])
@pytest.mark.usefixtures("leaky")
def test_a_failure_hides_secrets_in_its_line_log_and_traceback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    route: str,
    debug: list[str],
) -> None:
    args = ["multiply", "leaky://a.zarr", "leaky://b.zarr", str(tmp_path / "c.zarr"), *debug]
    assert main([*args, *_routes(tmp_path, monkeypatch, route)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines()[-1].startswith("error: cannot open leaky://a.zarr: ")
    assert "***" in err and ("Traceback" in err) == bool(debug)
    assert "leaky: connecting with" in caplog.text
    assert_hidden(out, err, caplog.text)


def test_an_options_file_others_can_read_warns(
    tmp_path: Path, inputs: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "so.json"
    path.write_text(json.dumps({"secret": FAKE}))
    path.chmod(0o644)
    assert main(["multiply", *inputs, "--dry-run", "--storage-options-file", str(path)]) == 0
    assert f"chmod 600 {path}" in caplog.text and "0o644" in caplog.text
    assert_hidden(caplog.text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[1, 2]", ["JSON list, not an object"]),
        ('{"secret": "FAKE-SECRET-8e1f"', ["not valid JSON", "line 1"]),  # no text echoed
    ],
)
def test_a_bad_options_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: list[str]
) -> None:
    path = tmp_path / "so.json"
    path.write_text(text)
    argv = ["random", str(tmp_path / "x.zarr"), "--shape", "2x2", "--chunks", "1x1"]
    assert main([*argv, "--storage-options-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert_hidden(err)


def test_options_merge_env_then_file_then_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, json.dumps({"anon": True, "client_kwargs": {"region_name": "a"}}))
    path = tmp_path / "so.json"
    path.write_text(json.dumps({"anon": False, "client_kwargs": {"verify": False}}))
    parsed = parse_args(
        build_parser(),
        ["random", "x", "--shape", "2x2", "--chunks", "1x1", "--storage-options-file",
         str(path), "--storage-option", "region=b"],
    )  # fmt: skip
    assert storage_options(parsed) == {
        "anon": False,
        "client_kwargs": {"region_name": "b", "verify": False},
    }


@pytest.mark.parametrize(
    ("address", "options", "warns"),
    [
        ("tcp://10.0.0.1:8786", OPTIONS, True),  # secrets in the clear
        ("ws://10.0.0.1:8786", OPTIONS, True),
        ("10.0.0.1:8786", OPTIONS, True),  # distributed's default scheme is tcp
        ("tls://10.0.0.1:8786", OPTIONS, False),  # encrypted
        ("inproc://10.0.0.1/1/1", OPTIONS, False),  # never leaves the process
        ("tcp://10.0.0.1:8786", {"anon": True}, False),  # nothing secret
    ],
)
def test_exposure_warning(address: str, options: dict[str, Any], warns: bool) -> None:
    warning = exposure_warning(address, options)
    assert (warning is not None) == warns
    if warning:
        assert address in warning and "tls://" in warning and "key, secret" in warning
        assert_hidden(warning)


def test_a_job_on_a_plain_tcp_scheduler_warns(
    client: Client, inputs: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    assert client.scheduler is not None and client.scheduler.address.startswith("tcp://")
    job = prepare(*inputs, storage_options={"secret": FAKE})  # local paths: options unused
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        job.execute(client)
    warned = [r.getMessage() for r in caplog.records if "unencrypted" in r.getMessage()]
    assert len(warned) == 1 and client.scheduler.address in warned[0], caplog.text
    assert_hidden(caplog.text)
    assert os.path.exists(inputs[2])


def test_verify_on_a_plain_tcp_scheduler_warns(
    client: Client,
    inputs: tuple[str, str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b, _ = inputs
    c = write_array(tmp_path / "c.zarr", np.full((6, 5), 4, "float32"), (3, 5))
    address = client.scheduler.address if client.scheduler else ""
    argv = ["verify", a, b, c, "--scheduler", address, "--storage-option", f"secret={FAKE}"]
    assert main([*argv, "--no-progress"]) == 0
    assert "verify ok" in capsys.readouterr().out
    assert f"scheduler at {address} unencrypted" in caplog.text
    assert_hidden(caplog.text)


def test_logged_tracebacks_are_scrubbed() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ScrubLogs({FAKE}))
    logger = logging.getLogger("tests.scrub")
    logger.addHandler(handler)
    try:
        raise ValueError(f"denied for {FAKE}")
    except ValueError:
        logger.error("failed with %s", FAKE, exc_info=True)
    finally:
        logger.removeHandler(handler)
    assert (
        "failed with ***" in stream.getvalue() and "ValueError: denied for ***" in stream.getvalue()
    )
    assert_hidden(stream.getvalue())

"""Errors before work: every ``tilegemm.*`` setting is checked by ``prepare`` (one line naming
the key, the value and the values it takes), the documented values work from the
environment, ``--debug`` adds a traceback without changing the exit code, and ``verify``
refuses an unfinished OUT, pointing to ``--resume``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import zarr

from pipeline import settings
from pipeline.api import prepare
from pipeline.cli.main import main
from pipeline.errors import UnfinishedOutputError, UsageError
from pipeline.verify.check import check_shapes
from tests.helpers import run_cli, write_array


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[str, str, str]:
    a = write_array(tmp_path / "a.zarr", np.ones((6, 4), "int8"), (3, 2))
    b = write_array(tmp_path / "b.zarr", np.ones((4, 5), "int8"), (2, 5))
    return a, b, str(tmp_path / "c.zarr")


BAD = [
    ("output-compressor", "brotli", "auto, none, lz4 or zstd"),  # not a codec we offer
    ("cache-fraction", 1.5, "from 0 to 1"),  # more than all the spare memory
    ("cache-fraction", "half", "from 0 to 1"),  # not a number
    ("read-concurrency", -1, "integer >= 0"),  # negative
    ("read-concurrency", 2.5, "integer >= 0"),  # not whole
    ("max-tasks", 0, "integer >= 1"),  # nothing could run
    ("max-tasks", "many", "integer >= 1"),  # not a number
    ("gpu-overlap", "maybe", "true or false"),  # not a flag
    ("host-probe", "sometimes", "true or false"),  # not a flag
    ("device-class", "h200x", "h100-pcie, h200, a100-80gb, a100-40gb, l40s or l4"),  # no such
    ("emulated.tflops", 0, "> 0"),  # a device that never finishes
    ("emulated.tflops", True, "> 0"),  # a flag is not a rate
    ("emulated.h2d-gbps", -5, "> 0"),  # negative rate
    ("emulated.decode-gbps", "fast", "> 0"),  # not a number
    ("emulated.memory", "lots", "a size > 0"),  # not a size
]


@pytest.mark.parametrize(("key", "value", "allowed"), BAD)
def test_prepare_refuses_a_bad_setting(
    inputs: tuple[str, str, str], key: str, value: Any, allowed: str
) -> None:
    with dask.config.set({f"tilegemm.{key}": value}), pytest.raises(UsageError) as refused:
        prepare(*inputs)
    message = str(refused.value)
    assert message.startswith(f"tilegemm.{key} is "), message
    assert allowed in message and settings.SETTINGS[key].env in message, message
    assert "\n" not in message


def test_every_setting_has_a_bad_case() -> None:
    assert {key for key, _, _ in BAD} == set(settings.SETTINGS)


def test_an_unknown_setting_is_refused_with_a_suggestion(inputs: tuple[str, str, str]) -> None:
    with (
        dask.config.set({"tilegemm.output-compresor": "lz4"}),
        pytest.raises(UsageError, match=r"did you mean tilegemm\.output-compressor\?"),
    ):
        prepare(*inputs)


@pytest.mark.parametrize(
    ("key", "given", "read"),
    [
        ("output-compressor", None, "none"),  # DASK_..=none arrives as None
        ("output-compressor", "LZ4", "lz4"),  # any case
        ("gpu-overlap", False, False),  # DASK_..=false
        ("gpu-overlap", "off", False),  # a word from a YAML string
        ("gpu-overlap", 1, True),  # DASK_..=1
        ("read-concurrency", "auto", "auto"),
        ("read-concurrency", 0, 0),  # zarr's default
        ("read-concurrency", "3", 3),  # a quoted YAML number
        ("cache-fraction", 0, 0.0),  # no cache
        ("emulated.memory", "1GiB", 2**30),
        ("emulated.memory", 4096, 4096),  # bytes
    ],
)
def test_values_are_normalised(key: str, given: Any, read: Any) -> None:
    with dask.config.set({f"tilegemm.{key}": given}):
        assert settings.get(key) == read


def test_the_defaults_are_valid() -> None:
    settings.check_all()
    # tests/conftest.py turns the host probe off for the whole suite; here it is the default's
    with dask.config.set({"tilegemm.host-probe": settings.SETTINGS["host-probe"].default}):
        got = {k: settings.get(k) for k in settings.SETTINGS}
    assert got == {k: s.parse(s.default) for k, s in settings.SETTINGS.items()}
    assert got["host-probe"] is True


def test_none_from_the_environment_stores_out_uncompressed(inputs: tuple[str, str, str]) -> None:
    a, b, out = inputs  # int8 x int8 into int64: auto would pick Blosc-LZ4
    done = run_cli(
        "multiply", a, b, out, "--dtype", "int64", "--no-progress",
        env={"DASK_TILEGEMM__OUTPUT_COMPRESSOR": "none"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = zarr.open_array(out, mode="r")
    assert result.compressors == ()
    np.testing.assert_array_equal(result[:], np.full((6, 5), 4))


def test_a_bad_environment_value_is_one_line_naming_the_variable(
    inputs: tuple[str, str, str],
) -> None:
    done = run_cli("multiply", *inputs, "--dry-run", env={"DASK_TILEGEMM__READ_CONCURRENCY": "-1"})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: tilegemm.read-concurrency is -1 (from DASK_TILEGEMM__READ_CONCURRENCY=-1); use "
        "auto or an integer >= 0, e.g. DASK_TILEGEMM__READ_CONCURRENCY=2, or unset it"
    ]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_adds_a_traceback_and_keeps_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    args = ["multiply", str(tmp_path / "none.zarr"), str(tmp_path / "b"), str(tmp_path / "c")]
    argv = ["--debug", *args] if where == "before" else [*args, "--debug"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "InputNotFoundError" in err
    assert err.splitlines()[-1].startswith("error: A (")


def test_debug_keeps_exit_code_2_for_a_bad_setting(
    inputs: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with dask.config.set({"tilegemm.cache-fraction": 7}):
        assert main(["multiply", *inputs, "--dry-run", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("error: tilegemm.cache-fraction")


def _unfinished(path: Path, complete: bool | None) -> str:
    attrs = {} if complete is None else {"tilegemm": {"complete": complete, "fingerprint": "x"}}
    zarr.create_array(str(path), shape=(6, 5), chunks=(3, 5), dtype="int64", attributes=attrs)
    return str(path)


def test_verify_refuses_an_unfinished_out(
    inputs: tuple[str, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, _ = inputs
    c = _unfinished(tmp_path / "c.zarr", complete=False)
    assert main(["verify", a, b, c, "--no-progress"]) == 2  # refused before a cluster starts
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: C ({c}) is a product"), err
    assert f"multiply {a} {b} {c} --resume" in err[0] and "not finished" in err[0]


@pytest.mark.parametrize("complete", [True, None])  # finished; not written by this tool
def test_verify_checks_other_outs_as_before(
    inputs: tuple[str, str, str], tmp_path: Path, complete: bool | None
) -> None:
    a, b, _ = inputs
    c = _unfinished(tmp_path / "c.zarr", complete=complete)
    assert check_shapes(a, b, c, {})[2].shape == (6, 5)
    with pytest.raises(UnfinishedOutputError):
        check_shapes(a, b, _unfinished(tmp_path / "u.zarr", complete=False), {})


def test_settings_are_read_only_through_pipeline_settings() -> None:
    """A new ``tilegemm.*`` reader elsewhere would skip the checks: register it in SETTINGS."""
    root = Path(__file__).resolve().parents[2]
    readers = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("pipeline", "kernels", "cluster")
        for path in (root / folder).rglob("*.py")
        if path.name != "settings.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "config.get(" in line and "tilegemm" in line
    ]
    assert readers == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100", 100),  # plain bytes
        ("4GiB", 4 * 2**30),  # binary unit
        ("512MB", 512 * 10**6),  # decimal unit
        ("1.5 gib", int(1.5 * 2**30)),  # case and space
        ("2e9", 2 * 10**9),  # float notation
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert settings.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-4GiB", "4XB", "0", "inf", "0.5", "nan"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="cannot read size"):
        settings.parse_size(text)

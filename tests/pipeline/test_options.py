"""Each product option is declared once (pipeline/options/product.py): the parser of multiply and
gram, the command line's keywords, the API's signatures and checks, and the docs all come from that
declaration, and a new option needs nothing else."""

from __future__ import annotations

import argparse
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import pytest

from cluster.spec import ClusterSpec
from pipeline.api import multiply, prepare
from pipeline.cli.main import _product_options
from pipeline.cli.parser import build_parser, parse_args
from pipeline.errors import UsageError
from pipeline.gramian import gram, prepare_gram
from pipeline.options import product as options
from pipeline.options.declaration import GRAM, MULTIPLY, PREPARE, Option, declarations
from pipeline.options.job_options import JobOptions
from pipeline.options.product import (
    DECLARED,
    PrepareOptions,
    carried,
    checked,
    options_for,
    takes_options,
)

ROOT = Path(__file__).resolve().parents[2]

CLI_OWN = {
    "help", "debug", "a", "b", "out", "x", "g", "rows", "scheduler", "scheduler_file", "workers",
    "threads_per_worker", "dashboard_address", "storage_option", "storage_options_file",
    "dry_run", "no_progress",
}  # fmt: skip
"""A product's arguments that are not declared options: its operands, the cluster's and the
storage's (which become ``cluster=`` and ``storage_options=``), and the command line's own."""
API_OWN = {"a", "b", "out", "x", "client", "rows"}
"""The API's parameters that are not declared options."""
API = [
    pytest.param(function, command, id=function.__name__)
    for function, command in [
        (prepare, PREPARE), (multiply, MULTIPLY), (gram, GRAM), (prepare_gram, GRAM)
    ]
]  # fmt: skip


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "docs/make_cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subs.choices[name]


def actions(command: str) -> dict[str, argparse.Action]:
    return {a.dest: a for a in subcommand(command)._actions}


@pytest.mark.parametrize("command", [MULTIPLY, GRAM])
def test_every_declared_option_reaches_the_parser(command: str) -> None:
    found = actions(command)
    for option in (o for o in options_for(command) if o.cli):
        action = found.pop(option.name)
        assert action.option_strings == [option.flag]
        assert (action.default, action.help) == (option.default, option.help), option.name
        assert (action.metavar, action.choices) == (option.metavar, option.choices), option.name
    assert set(found) - CLI_OWN == set(), "the parser has product options not declared"
    assert set(found) & {o.name for o in DECLARED} == set(), f"{command} takes more than declared"


def test_a_declared_parse_is_the_parsers_type() -> None:
    args = parse_args(build_parser(), ["multiply", "a", "b", "c", "--memory-limit", "1KiB"])
    assert (args.memory_limit, args.alpha) == (1024, 1.0)
    args = parse_args(build_parser(), ["multiply", "a", "b", "c", "--alpha=-0.5", "--beta", "2"])
    assert (args.alpha, args.beta) == (-0.5, 2.0)


@pytest.mark.parametrize(("function", "command"), API)
def test_the_api_lists_every_declared_option_with_its_default(
    function: Callable[..., Any], command: str
) -> None:
    parameters = dict(inspect.signature(function).parameters)
    for option in options_for(command):
        parameter = parameters.pop(option.name)
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default == option.default, option.name
        assert parameter.annotation == option.annotation
        assert f"{option.name}={option.default!r}: " in (function.__doc__ or "")
    assert set(parameters) - API_OWN == set()


@pytest.mark.parametrize(("function", "command"), API)
def test_an_unknown_keyword_is_a_type_error(function: Callable[..., Any], command: str) -> None:
    name = function.__name__
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'bogus'"):
        function("x.zarr", "y.zarr", bogus=1)


def test_multiply_takes_no_symmetric() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'symmetric'"):
        multiply("a.zarr", "b.zarr", "c.zarr", symmetric=True)


def test_gram_refuses_what_its_declarations_mark_as_not_for_it() -> None:
    assert options.not_for(GRAM) == (
        "transpose_a",
        "transpose_b",
        "ignore_coordinates",
        "accumulate",
        "alpha",
        "beta",
        "symmetric",
    )
    for name in options.not_for(GRAM):
        # as a Python caller reads it (pipeline.options.spelling)
        valued = not isinstance(options.declared(name).default, bool)
        keyword = name if valued else f"{name}=True"
        for function in (gram, prepare_gram):
            with pytest.raises(UsageError, match=f"^gram takes no {keyword}: G = Xᵀ X"):
                function("x.zarr", "g.zarr", **{name: True})
    with pytest.raises(UsageError, match="gram takes no transpose_b=True, alpha: "):
        prepare_gram("x.zarr", "g.zarr", alpha=2.0, transpose_b=True)


@pytest.mark.parametrize("command", [MULTIPLY, GRAM])
def test_the_command_line_gives_the_api_every_option(command: str) -> None:
    operands = ["a", "b", "c"] if command == MULTIPLY else ["x", "g"]
    args = parse_args(build_parser(), [command, *operands, "--dry-run", "--verify"])
    args.storage_options = {"anon": True}  # main() merges them from the file, env and flags
    given = _product_options(args, command)
    assert set(given) == {o.name for o in options_for(command)}
    assert given["verify"] is True and given["storage_options"] == {"anon": True}
    assert isinstance(given["cluster"], ClusterSpec)


def test_checked_fills_defaults_and_runs_each_check() -> None:
    values = checked({"memory_limit": "1KiB", "chunks": "2x3", "dtype": "f8", "alpha": "2"})
    assert checked({"memory_limit": "0.5"})["memory_limit"] == 0.5  # a fraction, not 0 bytes
    assert values["backend"] == "auto" and values["cluster"] == ClusterSpec()
    assert values["memory_limit"] == 1024 and values["device_memory_limit"] is None
    assert (values["chunks"], values["shards"], values["dtype"]) == ((2, 3), None, "float64")
    assert values["alpha"] == 2.0
    job = carried(values)
    assert job["memory_limit"] == 1024
    assert set(job) <= {f.name for f in JobOptions.__dataclass_fields__.values()}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"precision": "fp16"}, r"^unknown precision 'fp16'; choose fp32, tf32, 3xtf32$"),
        ({"backend": "gpu"}, r"^unknown backend 'gpu'; choose auto, "),
        ({"overwrite": True, "resume": True}, r"^--overwrite and --resume exclude each other"),
        ({"chunks": "two"}, r"^--chunks 'two' is not RxC with two positive integers"),
        ({"shards": (1, 2, 3)}, r"^--shards \(1, 2, 3\) is not RxC"),
        ({"memory_limit": "lots"}, "lots"),
        ({"dtype": "str"}, r"^--dtype 'str' is not an output dtype"),
    ],
)
def test_checked_refuses_with_the_options_messages(given: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        checked(given)


def test_readme_table_is_current() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme == load_generator().render_readme(readme), "run python docs/make_cli_reference.py"


def _tile_hint(value: int | str | None, flag: str) -> int | None:
    if value is not None and int(value) < 1:
        raise UsageError(f"{flag} {value} must be at least 1")
    return None if value is None else int(value)


class WithTileHint(PrepareOptions, total=False):
    """The declarations with one more option, as a change adding it would write it."""

    tile_hint: Annotated[
        int | None,
        Option(None, help="a throwaway option", metavar="N", parse=int, check=_tile_hint),
    ]


def test_a_new_option_is_one_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared once, it is an argument of both commands, a keyword from the command line to
    the API, listed in signatures, checked by prepare's checks, and in the docs."""
    monkeypatch.setattr(options, "DECLARED", declarations(WithTileHint))
    for command, operands in ((MULTIPLY, ["a", "b", "c"]), (GRAM, ["x", "g"])):
        action = actions(command)["tile_hint"]
        assert (action.option_strings, action.default, action.help, action.metavar) == (
            ["--tile-hint"], None, "a throwaway option", "N",
        )  # fmt: skip
        args = parse_args(build_parser(), [command, *operands, "--tile-hint", "7", "--dry-run"])
        args.storage_options = {}
        assert _product_options(args, command)["tile_hint"] == 7

    @takes_options(MULTIPLY)
    def product(a: Any, **given: Any) -> dict[str, Any]:
        return checked(given)

    assert inspect.signature(product).parameters["tile_hint"].default is None
    assert product("a", tile_hint="3")["tile_hint"] == 3
    with pytest.raises(UsageError, match="tile_hint=0 must be at least 1"):
        product("a", tile_hint=0)
    generator = load_generator()
    assert "| `--tile-hint` | `N` |  | a throwaway option |" in generator.render()
    assert "| `--tile-hint N` | a throwaway option |" in generator.readme_table()

"""Render docs/cli.md from the argument parsers: `python docs/make_cli_reference.py`.

Tables are built from the parsers' actions rather than argparse's help text, whose layout
changes between Python versions; tests/pipeline/test_docs.py fails when docs/cli.md is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "cli.md"
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

HEADER = """\
# Command-line reference

Generated from the argument parsers by `python docs/make_cli_reference.py`; do not edit by
hand (tests/pipeline/test_docs.py fails when this file and the parsers differ). Exit codes:
0 ok; 1 the job or a verification failed; 2 bad usage or bad input, with one `error:` line.
"""


def render() -> str:
    from pipeline.cli.main import build_parser

    parser = build_parser()
    parts = [HEADER, _section(parser, "python -m pipeline", parser.description or "")]
    for name, sub, help_text in _subcommands(parser):
        parts.append(_section(sub, f"python -m pipeline {name}", help_text))
    for name, sub, help_text in _subcommands(kernels_parser()):
        parts.append(_section(sub, f"python -m kernels {name}", help_text))
    parts += [_settings(), SECRETS]
    return "\n".join(parts)


SETTINGS_HEADER = """\
## Settings (`tilegemm.*`)

Dask config under one namespace: set a key in the environment (`DASK_TILEGEMM__KEY=VALUE`,
`__` nesting, `_` for `-`), in a dask YAML file, or with `dask.config.set` around the API call.
`prepare` (every `multiply`, `--dry-run` too) checks them all first: a bad value or an unknown
key is refused with one `error:` line and exit code 2. `none`, `true` and `false` from the
environment mean what they say.
"""

SECRETS = """\
## Storage options and secrets

The command line's fsspec options are merged from
`$TILEGEMM_STORAGE_OPTIONS` (a JSON object), then `--storage-options-file FILE.json`, then each
`--storage-option KEY=VALUE`, later ones winning key by key. Keep keys and secrets off the
command line (other users see it in `ps`): put them in the file (`chmod 600`; a file with
secrets that others may read is warned about) or the variable. The values of options whose
name holds key, secret, token, passw(ord), credential, auth, signature, connection string or
private (at any depth, e.g. in `client_kwargs`), and passwords in URLs, are shown as `***` in
reprs, messages, logs and `--debug` tracebacks.

The options travel inside every task, so a scheduler reached over plain `tcp://` passes them
unencrypted to anyone who can reach it: the job warns then. To keep secrets out of the tasks,
give them to the workers' processes instead: botocore's `AWS_ACCESS_KEY_ID` /
`AWS_SECRET_ACCESS_KEY` / `AWS_PROFILE` or an instance role for S3, or fsspec's own
configuration, which every file system reads where it is created — `FSSPEC_S3_KEY`,
`FSSPEC_S3_SECRET` (`FSSPEC_<PROTOCOL>_<OPTION>`), `FSSPEC_S3='{"key": ...}'`, or JSON/INI
files in `~/.config/fsspec` (`$FSSPEC_CONFIG_DIR`). Local workers inherit this process's
environment; set it on remote workers yourself.
"""


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _settings() -> str:
    from pipeline.settings import SETTINGS

    rows = [
        f"| `{s.name}` | `{s.env}` | `{_text(s.default)}` | {s.allowed} | {s.meaning} |"
        for s in SETTINGS.values()
    ]
    head = [
        "| setting | environment | default | values | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    return "\n".join([SETTINGS_HEADER, *head, *rows]) + "\n"


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def kernels_parser() -> argparse.ArgumentParser:
    """kernels/__main__.py builds its parser inside main(): catch it where main() uses it."""
    from kernels.__main__ import main

    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Caught(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            main([])
        except _Caught as caught:
            return caught.parser
    raise RuntimeError("kernels/__main__.py main() no longer calls parse_args")


def _subcommands(
    parser: argparse.ArgumentParser,
) -> list[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return []


def _section(parser: argparse.ArgumentParser, title: str, summary: str) -> str:
    rows = [_row(parser, a) for a in parser._actions if a.help != argparse.SUPPRESS]
    rows = [r for r in rows if r]
    synopsis = " ".join([title, *_synopsis(parser)])
    lines = [f"## `{title}`", "", summary, "", "```", synopsis, "```", ""]
    if rows:
        lines += ["| argument | value | default | meaning |", "| --- | --- | --- | --- |", *rows]
    return "\n".join(lines) + "\n"


def _synopsis(parser: argparse.ArgumentParser) -> list[str]:
    words = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            words.append("COMMAND ...")
        elif not action.option_strings:
            words.append(str(action.metavar or action.dest))
    has_options = any(a.option_strings and a.dest != "help" for a in parser._actions)
    return (["[options]"] if has_options else []) + words


def _row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
        return ""
    name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar}`"
    meaning = action.help or ""
    rivals = [
        s
        for group in parser._mutually_exclusive_groups
        if action in group._group_actions
        for other in group._group_actions
        if other is not action
        for s in other.option_strings
    ]
    if rivals:
        meaning += f" (not with {', '.join(f'`{s}`' for s in rivals)})"
    cells = [name, _value(action), _default(action), meaning]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _value(action: argparse.Action) -> str:
    if action.nargs == 0 or not action.option_strings:
        return ""
    if action.choices is not None:
        text = "|".join(f"`{c}`" for c in action.choices)
    else:
        text = f"`{action.metavar or action.dest.upper()}`"
    if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        text += " (repeatable)"
    if action.required and action.option_strings:
        text += " (required)"
    return text


def _default(action: argparse.Action) -> str:
    unset = action.default is None or action.default is False or action.default == []
    if unset or action.default == argparse.SUPPRESS or not action.option_strings:
        return ""
    return f"`{action.default}`"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is stale: run python docs/make_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

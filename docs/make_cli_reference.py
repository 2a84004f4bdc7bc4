"""Render docs/cli.md, and README.md's table of `multiply` options, from the argument
parsers: `python docs/make_cli_reference.py` (`--check`: exit 1 if either is stale).

Tables are built from the parsers' actions rather than argparse's help text, whose layout
changes between Python versions; tests/pipeline/test_docs.py fails when docs/cli.md is stale,
tests/pipeline/test_options.py when README's table is. A product option's row comes from its
declaration in pipeline/options/product.py (README_MEANINGS may say more than its help).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
README_TABLE = "`multiply` options:"
"""The line above README's generated table."""
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


README_VALUES = {"workers": "N", "threads_per_worker": "N"}
"""README's name for an argument's value where the parser has none."""

README_MEANINGS = {
    "debug": "tracebacks and debug logs (before or after the command); the exit code stays the "
    "same",
    "backend": "`auto` (default) uses CUDA when every worker sees a real GPU and the dtype is "
    "float32/float64, else CPU BLAS, and logs which; `cuda` and `cublas` need the GPU packages "
    '(`pip install ".[cuda]"` in the checkout; refused naming it without them); `cublas` runs '
    "the block products with cuBLAS through CuPy "
    '(`pip install ".[cublas]"` in the checkout, on every GPU worker: it brings '
    "`cupy-cuda13x[ctk]`, since CuPy 14 ships no cuBLAS without the `ctk` extra); `emulated` "
    "(only by name) drives a modelled GPU that "
    "does no math — OUT is NaN — to measure how well the host feeds a device (see "
    "`make bench-feed`)",
    "scheduler": "use a running cluster (never shut down); without it a local cluster on "
    "127.0.0.1 is started and closed",
    "scheduler_file": "use the running cluster whose scheduler wrote this file (`dask scheduler "
    "--scheduler-file`, dask-jobqueue, dask-mpi; waits up to 10 s for it to appear)",
    "workers": "local worker processes (default: one per GPU, or one CPU worker)",
    "threads_per_worker": "threads per local worker (default: one per GPU worker, or a thread "
    "per core on the CPU worker)",
    "memory_limit": "memory per worker as `dask worker --memory-limit` reads it: a size (`8GiB`), "
    "a fraction of the memory (`0.5`) or `auto` (the worker's share by its threads; on a running "
    "cluster a fraction is of each worker's own limit); the plan must fit it or the job is "
    "refused before it starts",
    "dashboard_address": "where the Dask dashboard listens (default 127.0.0.1:8787); the link is "
    "printed. A local cluster listens on loopback only (other hosts: "
    "`ssh -L 8787:127.0.0.1:8787 HOST`); see [Security](docs/cluster.md#security)",
    "storage_option": "fsspec options for URLs such as `s3://bucket/a.zarr` (repeatable)",
    "storage_options_file": "the same as a JSON object (or in `$TILEGEMM_STORAGE_OPTIONS`), to "
    "keep keys and secrets off the command line; secret values are shown as `***` everywhere, "
    "and sending them to a plain `tcp://` scheduler warns (see "
    "[docs/cli.md](docs/cli.md#storage-options-and-secrets))",
    "device_memory_limit": "GPU memory per worker for `cuda`/`cublas` plans, a size or a "
    "fraction of the device's (default: the device's, or the `tilegemm.device-class` defaults "
    "in a dry run); tiles are sized against "
    "it, the accumulator staying on the device",
    "device_class": "plan `cuda`/`cublas` for this GPU where the workers' own is not measured: "
    "with `--dry-run` and no cluster, `--device-class h100-sxm --workers 64 --memory-limit "
    "200GiB` sizes a cluster you don't have (each worker one GPU; its host's cores per GPU as "
    "the class's reference servers have them). Default: the GPU that `doctor` measured and "
    "saved on this machine, else the `tilegemm.device-class` setting. The dry run says which "
    "figures are vendor peaks, measured on a device or calibrated on this host, and each GPU "
    "backend's modelled time where they differ by over 1.3x; see "
    "[Sizing a cluster](#sizing-a-cluster-you-dont-have)",
    "storage_gbps": "GB/s of array data each worker reads from storage (a shared file system "
    "or an object store) in the plan's time, and writes unless `--write-gbps` says; default: "
    "this host's calibrated local reads and writes, which the dry run names",
    "write_gbps": "GB/s of OUT's data each worker writes to storage in the plan's time; "
    "default: `--storage-gbps`, else this host's calibrated local writes",
    "gpu_decode": "`cuda`/`emulated`: copy zstd chunks compressed and decode them on the GPU "
    "with nvCOMP (`pip install nvidia-nvcomp-cu13` on every GPU worker) instead of on the "
    "host; an input whose chunks are not plain zstd frames (sharded, Blosc, LZ4, ...) is "
    "decoded on the host, with a warning (refused when neither is), and so is a "
    "panel whose frames don't fit its staging buffer. Never run on a real GPU yet: see "
    "DESIGN.md",
    "precision": "the kernel's arithmetic: `fp32` (default) the dtype's own; `tf32` "
    "tensor cores with every factor rounded to TF32 (about 2⁻¹⁰ relative per product, "
    "K-independent; `cuda` and `cublas`, the latter through the cuBLAS handle's TF32 math "
    "mode set and restored per call); `3xtf32` three TF32 products per step, float32-class "
    "accuracy (`cuda` only). Tensor precisions take float32 data; the `cpu` backend refuses "
    "them (it does not emulate them), and so does `auto` when it resolves to `cpu`, before any "
    "work. OUT records it (`tilegemm.precision`), `--resume` keeps it and `verify` widens its "
    "tolerance by it; see [Precision](#precision)",
    "dtype": "OUT's dtype, e.g. `int64` or `float32` (default `numpy.result_type(A, B)`); the "
    "accumulator follows it (float16 sums in float32); integer products that could overflow "
    "it are refused",
    "chunks": "OUT's chunks (default: A's row chunk x B's column chunk, grown to 512 per axis "
    "when that makes over 1,024 chunks); alone, OUT is unsharded",
    "shards": "OUT's Zarr v3 shards, whole chunks each (default: the inputs' shards when they "
    "are sharded)",
    "transpose_a": "multiply by Aᵀ, read in place from the stored chunks (no transposed copy is "
    "written); see [Transposes and Gram matrices](#transposes-and-gram-matrices)",
    "over": "the dimension summed over, by name (`lat,lon`: several): chooses "
    "`--transpose-a/-b` so that each operand's `NAME` is the one contracted; an N-D field is read "
    "in place as a matrix; see [Transposes and Gram matrices](#transposes-and-gram-matrices)",
    "overwrite": "replace an OUT this tool wrote, removing only the files it writes (an OUT "
    "holding anything else is refused)",
    "resume": "finish an interrupted OUT (journaled tiles are skipped, except those that read a "
    "chunk of A or B changed since)",
    "accumulate": "OUT is an existing C (anyone's Zarr array of the product's shape): "
    "`C ← alpha·A·B + beta·C`, each product added exactly once (see "
    "[Accumulating](#accumulating-into-an-existing-array))",
    "alpha": "the product's factor (default 1; alone, a fresh `X·A·B`)",
    "beta": "C's old values' factor with `--accumulate` (default 1)",
    "verify": "Freivalds check after the product; the outcome is stored in OUT's attributes",
    "dry_run": "print the plan (tiles, K panels, memory per task and per GPU, flops, the time in "
    "hours and minutes, where each figure comes from, OUT's size and the free space where it "
    "goes, each resource's modelled seconds, reads vs the lower bound) and a last line "
    "`bound by: <resource>`; for the cluster `--scheduler` names, else the one the options "
    "describe (see [Sizing a cluster](#sizing-a-cluster-you-dont-have))",
    "report": "save distributed's performance report of the run (never onto or inside an input "
    "or OUT; an existing file is replaced only if it is such a report)",
    "no_progress": "no progress line (tiles and K panels done, GFLOP/s of this run's work, "
    "bytes read, ETA; it is also off when stderr is not a terminal)",
}
"""README's meaning of an argument of `multiply`, where it says more than the help."""


def readme_table() -> str:
    """README's table of `multiply` options: one row per argument, in --help's order."""
    from pipeline.cli.main import build_parser

    multiply = next(sub for name, sub, _ in _subcommands(build_parser()) if name == "multiply")
    actions = [a for a in multiply._actions if a.option_strings and a.dest != "help"]
    unknown = set(README_MEANINGS) - {a.dest for a in actions}
    if unknown:
        raise RuntimeError(f"README_MEANINGS names no argument of multiply: {sorted(unknown)}")
    rows = ["| option | meaning |", "| --- | --- |"]
    for action in actions:
        value = README_VALUES.get(action.dest) or _readme_value(action)
        shown = f" {value}" if value else ""
        name = ", ".join(f"`{s}{shown}`" for s in action.option_strings)
        rows.append(f"| {name} | {README_MEANINGS.get(action.dest, action.help or '')} |")
    return "\n".join(rows) + "\n"


def _readme_value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return "\\|".join(str(c) for c in action.choices)
    return str(action.metavar or action.dest.upper())


def render_readme(current: str) -> str:
    """README.md with its table of `multiply` options rendered anew."""
    lines = current.splitlines(keepends=True)
    start = lines.index(README_TABLE + "\n") + 2  # the line, then a blank one
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "".join(lines[:start]) + readme_table() + "".join(lines[end:])


def main() -> int:
    readme = README.read_text()
    wanted = {TARGET: render(), README: render_readme(readme)}
    if "--check" in sys.argv[1:]:
        stale = [p for p, text in wanted.items() if (p.read_text() if p.exists() else "") != text]
        for path in stale:
            print(f"{path} is stale: run python docs/make_cli_reference.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m kernels inspect [--cc 9.0] [--json] [--ptx-dir DIR]`."""

from __future__ import annotations

import argparse
import sys

from kernels.constants import CUDA_INSTALL


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect", help="compile every CUDA kernel variant (no GPU needed) and report its SASS"
    )
    inspect.add_argument("--cc", default="9.0", help="compute capability (default 9.0)")
    inspect.add_argument("--json", action="store_true", help="print a JSON list of reports")
    inspect.add_argument("--ptx-dir", help="write .ptx/.cubin here (default: a new temp dir)")
    args = parser.parse_args(argv)

    from kernels.inspect.machine_code import run

    try:
        print(run(args.cc, args.json, args.ptx_dir))
    except ImportError as err:  # a plain install: numba-cuda and the CUDA wheels are extras
        print(
            f"error: {parser.prog} inspect compiles with the CUDA packages ({err}): {CUDA_INSTALL}",
            file=sys.stderr,
        )
        return 2
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

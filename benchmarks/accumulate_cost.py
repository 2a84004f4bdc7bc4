"""What --accumulate costs over a fresh product of the same operands (ratios in one run).

    python -m benchmarks.accumulate_cost --size 4096 --chunk 1024 --repeats 3

Times (medians) a fresh ``multiply A B OUT``, ``multiply A B C --accumulate`` into an existing
C of the same layout, and one read of C (zarr, into memory, on the workers' threads): the target
is accumulate − fresh ≤ that read (DESIGN.md, "Accumulation, exactly once").
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from distributed import Client, LocalCluster

from pipeline import multiply
from pipeline.generate import write_random


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, c = args.size, args.chunk
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        root = Path(tmp)
        a, b = str(root / "a.zarr"), str(root / "b.zarr")
        write_random(a, (n, n), (c, c), "float32", 1)
        write_random(b, (n, n), (c, c), "float32", 2)
        fresh, acc, reads = [], [], []  # (wall s, CPU s of this process: the workers are here)

        def timed(call: Callable[[], object]) -> tuple[float, float]:
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            return time.perf_counter() - wall, time.process_time() - cpu

        for i in range(args.repeats):
            out = root / f"fresh{i}.zarr"
            fresh.append(timed(lambda: multiply(a, b, str(out), client=client)))  # noqa: B023
            target = root / f"c{i}.zarr"
            shutil.copytree(out, target)  # an existing C (ours here; anyone's works the same)
            reads.append(timed(lambda: client.submit(_read, str(out), pure=False).result()))  # noqa: B023
            acc.append(
                timed(lambda: multiply(a, b, str(target), client=client, accumulate=True, beta=0.5))  # noqa: B023
            )
        stored = sum(p.stat().st_size for p in (root / "c0.zarr").rglob("*") if p.is_file())
    print(f"# {platform.processor() or platform.machine()}, {n}² float32, {c}² chunks; medians of "
          f"{args.repeats}; C stored {stored / 2**20:.0f} MiB")  # fmt: skip
    for unit, k in (("wall s", 0), ("CPU s", 1)):
        f, m, r = (statistics.median(x[k] for x in runs) for runs in (fresh, acc, reads))
        print(f"{unit:7} fresh {f:6.2f}  --accumulate {m:6.2f} ({m / f:.2f}x)  one read of C "
              f"{r:5.2f}: the extra is {(m - f) / r:.2f} reads of C")  # fmt: skip


def _read(url: str) -> int:
    import zarr

    return int(zarr.open_array(url, mode="r")[:].nbytes)


if __name__ == "__main__":
    main()

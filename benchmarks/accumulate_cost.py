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
        fresh, acc, reads = [], [], []
        for i in range(args.repeats):
            out = root / f"fresh{i}.zarr"
            started = time.perf_counter()
            multiply(a, b, str(out), client=client)
            fresh.append(time.perf_counter() - started)
            target = root / f"c{i}.zarr"
            shutil.copytree(out, target)  # an existing C (ours here; anyone's works the same)
            started = time.perf_counter()
            client.submit(_read, str(out), pure=False).result()
            reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            multiply(a, b, str(target), client=client, accumulate=True, beta=0.5)
            acc.append(time.perf_counter() - started)
        stored = sum(p.stat().st_size for p in (root / "c0.zarr").rglob("*") if p.is_file())
    f, m, r = (statistics.median(x) for x in (fresh, acc, reads))
    print(f"# {platform.processor() or platform.machine()}, {n}² float32, {c}² chunks")
    print(f"fresh product      {f:7.2f} s (median of {args.repeats})")
    print(f"--accumulate       {m:7.2f} s ({m / f:.2f}x fresh; C stored {stored / 2**20:.0f} MiB)")
    extra = m - f
    print(f"one read of C      {r:7.2f} s; extra {extra:.2f} s = {extra / r:.2f} reads of C")


def _read(url: str) -> int:
    import zarr

    return int(zarr.open_array(url, mode="r")[:].nbytes)


if __name__ == "__main__":
    main()

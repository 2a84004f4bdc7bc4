"""The cost model's constants, written by ``python -m benchmarks.calibrate`` on the
machine named below (its ``measured``: when, and how each group was scaled to whole
jobs). Rerun it on the machine to plan for; do not edit by hand."""

from pipeline.plan.costs import ChunkCost, CostModel, HostProbe

COSTS = CostModel(
    read=ChunkCost(per_chunk=9.902e-05, per_byte=6.538e-11),
    decode=ChunkCost(per_chunk=0.000104, per_byte=7.555e-10),
    encode=ChunkCost(per_chunk=0.0001227, per_byte=4.811e-10),
    encode_compressed=ChunkCost(per_chunk=0.0003691, per_byte=4.043e-10),
    write=ChunkCost(per_chunk=0.001099, per_byte=8.828e-10),
    flops_per_second=9.126e10,
    accumulate_per_byte=1.239e-10,
    allocate_per_byte=4.404e-11,
    task_seconds=0.009216,
    setup_seconds=0.8616,
    machine="AMD EPYC, 2 cores",
    measured="2026-11-27, best of 5, in-job product x1.10, decode per chunk x5.18, write x0.90",
    probe=HostProbe(
        flops_per_second=9.885e10,
        decode_per_byte=6.898e-10,
        python_seconds=0.007255,
    ),
)

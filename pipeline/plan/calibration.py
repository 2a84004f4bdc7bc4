"""The cost model's constants, written by ``python -m benchmarks.calibrate`` on the
machine named below (its ``measured``: when, and how each group was scaled to whole
jobs). Rerun it on the machine to plan for; do not edit by hand."""

from pipeline.plan.costs import ChunkCost, CostModel

COSTS = CostModel(
    read=ChunkCost(per_chunk=3.054e-05, per_byte=2.129e-10),
    decode=ChunkCost(per_chunk=8.538e-05, per_byte=2.703e-09),
    encode=ChunkCost(per_chunk=0.0001624, per_byte=5.026e-10),
    encode_compressed=ChunkCost(per_chunk=0.0004665, per_byte=3.95e-10),
    write=ChunkCost(per_chunk=0.0004037, per_byte=4.864e-10),
    flops_per_second=1.477e11,
    accumulate_per_byte=9.653e-11,
    allocate_per_byte=8.806e-11,
    task_seconds=0.007554,
    setup_seconds=0.6103,
    machine="Intel(R) Xeon(R) Processor, 2 cores",
    measured="2026-11-25, best of 5, in-job product x1.35, decode x3.31, write x1.34",
)

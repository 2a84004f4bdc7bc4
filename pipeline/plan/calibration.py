"""The cost model's constants, written by ``python -m benchmarks.calibrate`` on the
machine named below (its ``measured``: when, and how each group was scaled to whole
jobs). Rerun it on the machine to plan for; do not edit by hand."""

from pipeline.plan.costs import ChunkCost, CostModel

COSTS = CostModel(
    read=ChunkCost(per_chunk=4.764e-05, per_byte=6.141e-11),
    decode=ChunkCost(per_chunk=0.0001056, per_byte=8.228e-10),
    encode=ChunkCost(per_chunk=0.0001933, per_byte=6.94e-10),
    encode_compressed=ChunkCost(per_chunk=0.0005995, per_byte=5.022e-10),
    write=ChunkCost(per_chunk=0.0006651, per_byte=4.939e-10),
    flops_per_second=1.505e11,
    accumulate_per_byte=8.752e-11,
    allocate_per_byte=9.771e-11,
    task_seconds=0.007424,
    setup_seconds=0.6208,
    machine="Intel(R) Xeon(R) Processor, 2 cores",
    measured="2026-11-25, best of 5, in-job product x1.17, decode per chunk x4.07, write x1.55",
)

"""The cost model's constants, written by ``python -m benchmarks.calibrate`` on the
machine named below (its ``measured``: when, and how each group was scaled to whole
jobs). Rerun it on the machine to plan for; do not edit by hand."""

from pipeline.plan.costs import ChunkCost, CostModel

COSTS = CostModel(
    read=ChunkCost(per_chunk=3.909e-05, per_byte=1.228e-10),
    decode=ChunkCost(per_chunk=4.787e-05, per_byte=1.628e-09),
    encode=ChunkCost(per_chunk=0.0002243, per_byte=1.024e-09),
    encode_compressed=ChunkCost(per_chunk=0.0004916, per_byte=6.856e-10),
    write=ChunkCost(per_chunk=0.0004829, per_byte=6.964e-10),
    flops_per_second=9.808e10,
    accumulate_per_byte=1.483e-10,
    allocate_per_byte=2.147e-10,
    task_seconds=0.007258,
    setup_seconds=0.7094,
    machine="Intel(R) Xeon(R) Processor, 2 cores",
    measured="2026-11-25, best of 5, in-job product x1.57, decode x1.73, write x1.71",
)

"""The cost model's constants, written by ``python -m benchmarks.calibrate`` on
Intel(R) Xeon(R) Processor, 2 cores (2026-11-25, best of 5). Rerun it on the
machine to plan for; do not edit by hand."""

from pipeline.plan.costs import ChunkCost, CostModel

COSTS = CostModel(
    read=ChunkCost(per_chunk=2.305e-05, per_byte=8.709e-11),
    decode=ChunkCost(per_chunk=2.742e-05, per_byte=9.596e-10),
    encode=ChunkCost(per_chunk=0.0001392, per_byte=5.234e-10),
    encode_compressed=ChunkCost(per_chunk=0.0002593, per_byte=3.55e-10),
    write=ChunkCost(per_chunk=0.0002263, per_byte=3.896e-10),
    flops_per_second=1.577e11,
    accumulate_per_byte=1.364e-10,
    allocate_per_byte=8.846e-11,
    task_seconds=0.007479,
    setup_seconds=0.05208,
    machine="Intel(R) Xeon(R) Processor, 2 cores",
    measured="2026-11-25, best of 5",
)

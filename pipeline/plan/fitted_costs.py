"""The cost model's constants, written by ``python -m benchmarks.calibrate`` on the
machine named below (its ``measured``: when, and how each group was scaled to whole
jobs). Rerun it on the machine to plan for; do not edit by hand."""

from pipeline.plan.costs import ChunkCost, CostModel, HostProbe

COSTS = CostModel(
    read=ChunkCost(per_chunk=4.393e-05, per_byte=6.111e-11),
    decode=ChunkCost(per_chunk=9.625e-05, per_byte=7.203e-10),
    encode=ChunkCost(per_chunk=0.000154, per_byte=5.122e-10),
    encode_compressed=ChunkCost(per_chunk=0.0004266, per_byte=3.711e-10),
    write=ChunkCost(per_chunk=0.0009309, per_byte=8.084e-10),
    flops_per_second=8.013e10,
    accumulate_per_byte=1.706e-10,
    allocate_per_byte=5.403e-11,
    task_seconds=0.00866,
    setup_seconds=0.7772,
    machine="AMD EPYC, 2 cores",
    measured="2026-11-27, best of 5, in-job product x1.22, decode per chunk x4.37, write x1.06",
    probe=HostProbe(
        flops_per_second=9.393e10,
        decode_per_byte=7.216e-10,
        python_seconds=0.008757,
    ),
)

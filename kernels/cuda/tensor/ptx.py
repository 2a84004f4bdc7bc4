"""Inline-PTX intrinsics for tensor cores, which numba has no API for (numba#5899):
``tf32_round(x)`` is ``cvt.rna.tf32.f32`` and ``mma(a0..a3, b0, b1, c0..c3)`` is one warp-wide
``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` returning (d0, d1, d2, d3).

Built on first use (numba is imported lazily). PTX cannot run in numba's CUDA simulator:
kernels using these compile with ``compile_ptx`` and run on a GPU only.
"""

from __future__ import annotations

import functools
from typing import Any

CVT_PTX = "cvt.rna.tf32.f32 $0, $1;"
MMA_PTX = (
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)
TF32_MASK = 0xFFFFE000
"""Sign, exponent and the 10 stored mantissa bits of a TF32 value held in 32 bits. PTX leaves
the low 13 bits of cvt's result unspecified; 3xTF32 subtracts the big part, so they are
cleared."""


@functools.cache
def intrinsics() -> tuple[Any, Any]:
    """(tf32_round, mma): numba intrinsics usable in @cuda.jit kernels."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)

    @intrinsic  # type: ignore[misc]
    def tf32_round(typingctx: Any, x: Any) -> Any:
        """x rounded to TF32 (nearest, ties away from zero), as a float32."""

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            cvt = ir.InlineAsm(ir.FunctionType(i32, [f32]), CVT_PTX, "=r,f")
            bits = builder.and_(builder.call(cvt, args), ir.Constant(i32, TF32_MASK))
            return builder.bitcast(bits, f32)

        return types.float32(types.float32), codegen

    @intrinsic  # type: ignore[misc]
    def mma(  # noqa: PLR0913 - one operand per PTX register
        typingctx: Any,
        a0: Any,
        a1: Any,
        a2: Any,
        a3: Any,
        b0: Any,
        b1: Any,
        c0: Any,
        c1: Any,
        c2: Any,
        c3: Any,
    ) -> Any:
        """D = A @ B + C for one 16 x 8 x 8 tile; each lane passes its fragments (PTX layout:
        kernels.cuda.tensor.spec) as float32 holding TF32 values, and gets its 4 of D."""

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            out = ir.LiteralStructType([f32] * 4)
            asm = ir.InlineAsm(
                ir.FunctionType(out, [i32] * 6 + [f32] * 4),
                MMA_PTX,
                "=f,=f,=f,=f," + ",".join(["r"] * 6 + ["f"] * 4),
            )
            bits = [builder.bitcast(v, i32) for v in args[:6]]
            d = builder.call(asm, [*bits, *args[6:]])
            values = [builder.extract_value(d, i) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, values)

        return types.UniTuple(types.float32, 4)(*[types.float32] * 10), codegen

    return tf32_round, mma

"""Verify: Freivalds' check of C == op(A) @ op(B) (``check`` submits and explains, ``tasks`` run
on the workers), with the readers it needs (transposed operands, non-finite values, C after an
accumulation, a Gram's symmetry)."""

"""The tensor-core kernel's Python source, generated from an MmaSpec (see
kernels.cuda.tensor.kernel for the design): the K step, the fragment loads and the epilogue written
out, since Numba has no unroll pragma. Its globals: ``cuda``, ``elem`` (float32), ``tf32_round``
and ``mma`` (the inline-PTX intrinsics of kernels.cuda.tensor.ptx, or the simulator's emulation of
them)."""

from __future__ import annotations

from kernels.cuda.blocked.source import k_loop, pipelined_tile, prefetch_lines
from kernels.cuda.tensor import spec as ms
from kernels.cuda.tensor.spec import MMA_K, MMA_M, MMA_N, RUN, WARP, MmaSpec


def _log2(x: int) -> int:
    return x.bit_length() - 1


def _a_runs(spec: MmaSpec) -> list[int]:
    """Row offsets (within the tile) of a thread's runs of RUN K-elements of A, per K tile."""
    rows_per_pass = spec.threads // (spec.block_k // RUN)
    return [p * rows_per_pass for p in range(spec.a_loads // RUN)]


def _b_runs(spec: MmaSpec) -> list[int]:
    rows_per_pass = spec.threads // (spec.block_n // RUN)
    return [p * rows_per_pass for p in range(spec.b_loads // RUN)]


def a_offsets(spec: MmaSpec) -> list[int]:
    """Shared-memory offset of A fragment register 0..3 from the lane's own element (reg 0):
    lane-independent, as the PTX layout is (tests check both)."""
    return [r * spec.a_pitch + c for r, c in (ms.a_fragment(0, reg) for reg in range(4))]


def b_offsets(spec: MmaSpec) -> list[int]:
    return [r * spec.b_pitch + c for r, c in (ms.b_fragment(0, reg) for reg in range(2))]


def c_offsets() -> list[tuple[int, int]]:
    """(row, col) of accumulator 0..3 from the lane's accumulator 0."""
    return [ms.c_fragment(0, reg) for reg in range(4)]


def generate_source(spec: MmaSpec, name: str = "mma_matmul") -> str:
    """Python source of ``kernel(a, b, c)`` doing c += a @ b on tensor cores for ``spec``."""
    bm, bn, bk = spec.block_m, spec.block_n, spec.block_k
    a_buf, b_buf = bm * spec.a_pitch, bk * spec.b_pitch
    out = [f"def {name}(a, b, c):"]
    for p in range(spec.planes):
        what = "TF32 values" if spec.planes == 1 else ("big parts", "small parts")[p]
        out += [
            f"    sa{p} = cuda.shared.array({2 * a_buf}, elem)  # 2 buffers of A, {what}",
            f"    sb{p} = cuda.shared.array({2 * b_buf}, elem)  # 2 buffers of B, {what}",
        ]
    warps = spec.warps_m * spec.warps_n
    out += [
        "    zero = elem(0)",
        "    tid = cuda.threadIdx.x",
        f"    lane = tid & {WARP - 1}",
        f"    warp = (tid >> {_log2(WARP)}) & {warps - 1}",
        "    g = (lane >> 2) & 7  # the PTX layout's groupID",
        "    t = lane & 3  # threadID_in_group",
        f"    wr = (warp >> {_log2(spec.warps_n)}) & {spec.warps_m - 1}",
        f"    wc = warp & {spec.warps_n - 1}",
        "    m = c.shape[0]",
        "    n = c.shape[1]",
        "    k = a.shape[1]",
        f"    row0 = cuda.blockIdx.y * {bm}",
        f"    col0 = cuda.blockIdx.x * {bn}",
        f"    full = row0 + {bm} <= m and col0 + {bn} <= n",
        # The thread's first run of A (row, K offset) and of B (K row, column) in a tile.
        f"    ar_t = (tid >> {_log2(bk // RUN)}) & {spec.threads // (bk // RUN) - 1}",
        f"    ac = (tid & {bk // RUN - 1}) << {_log2(RUN)}",
        f"    br = (tid >> {_log2(bn // RUN)}) & {spec.threads // (bn // RUN) - 1}",
        f"    bc_t = (tid & {bn // RUN - 1}) << {_log2(RUN)}",
        "    ar = (row0 + ar_t) & 0x7FFFFFFF",
        "    bc = (col0 + bc_t) & 0x7FFFFFFF",
        f"    sa_st = ar_t * {spec.a_pitch} + ac",
        f"    sb_st = br * {spec.b_pitch} + bc_t",
        # The lane's fragment register 0 of its warp's first mma tile, in a buffer.
        f"    fa = (wr * {spec.warp_m} + g) * {spec.a_pitch} + t",
        f"    fb = t * {spec.b_pitch} + wc * {spec.warp_n} + g",
    ]
    out += [f"    c{i}_{j}_{r} = zero" for i, j, r in _accumulators(spec)]
    out += [f"    pa{e} = zero" for e in range(spec.a_loads)]
    out += [f"    pb{e} = zero" for e in range(spec.b_loads)]
    out += k_loop(
        bk,
        _prefetch(spec, "0", indent=8) + _store(spec, "0", indent=8),
        "any warp loads a fragment of it",
        "kt",
        lambda checked: _tile_step(spec, a_buf, b_buf, checked),
    )
    return "\n".join(out + _epilogue(spec)) + "\n"


def _accumulators(spec: MmaSpec) -> list[tuple[int, int, int]]:
    return [(i, j, r) for i in range(spec.m_tiles) for j in range(spec.n_tiles) for r in range(4)]


def _tile_step(spec: MmaSpec, a_buf: int, b_buf: int, checked: bool) -> list[str]:
    """One K tile: prefetch the next tile, multiply the current one, store the prefetched one.
    3xTF32 loads the next tile after the multiply: its temporaries (_mma_lines) leave no room
    under the 128-register cap for the loaded values, and ptxas spills with them live."""
    lines = ["        cur = kt & 1", f"        kn = ((kt + 1) * {spec.block_k}) & 0x7FFFFFFF"]
    return lines + pipelined_tile(
        "kt",
        checked,
        lambda indent, check: _prefetch(spec, "kn", indent, check),
        _multiply(spec, a_buf, b_buf),
        lambda indent: _store(spec, "(1 - cur)", indent),
        "every warp",
        load_last=spec.planes == 2,
    )


def _prefetch(spec: MmaSpec, k0: str, indent: int, checked: bool | None = None) -> list[str]:
    """Global loads of one K tile into registers: unchecked inside, zero-filled at the edges."""
    a_at = [(r, j) for r in _a_runs(spec) for j in range(RUN)]
    b_at = [(r, j) for r in _b_runs(spec) for j in range(RUN)]
    return prefetch_lines(a_at, b_at, k0, spec.block_k, indent, checked)


def _store(spec: MmaSpec, buf: str, indent: int) -> list[str]:
    """Prefetched registers to shared buffer ``buf``, rounded to TF32 once here (not per warp
    that loads them); 3xTF32 stores the big part and the TF32 rounding of the remainder."""
    pad = " " * indent
    a_at = [r * spec.a_pitch + j for r in _a_runs(spec) for j in range(RUN)]
    b_at = [r * spec.b_pitch + j for r in _b_runs(spec) for j in range(RUN)]
    stores = [
        ("a", e, f"{buf} * {spec.block_m * spec.a_pitch} + sa_st + {o}") for e, o in enumerate(a_at)
    ]
    stores += [
        ("b", e, f"{buf} * {spec.block_k * spec.b_pitch} + sb_st + {o}") for e, o in enumerate(b_at)
    ]
    lines = []
    for x, e, at in stores:
        if spec.planes == 1:
            lines += [f"{pad}s{x}0[{at}] = tf32_round(p{x}{e})"]
            continue
        lines += [
            f"{pad}hi = tf32_round(p{x}{e})",
            f"{pad}s{x}0[{at}] = hi",
            f"{pad}s{x}1[{at}] = tf32_round(p{x}{e} - hi)",  # exact: x - round(x) fits float32
        ]
    return lines


def _multiply(spec: MmaSpec, a_buf: int, b_buf: int) -> list[str]:
    """The warp's mma tiles for each k-step: B fragments of every n-tile once, then per m-tile
    its A fragment and its mma (_mma_lines)."""
    a_off, b_off = a_offsets(spec), b_offsets(spec)
    planes = range(spec.planes)
    lines = [f"        fa_k = cur * {a_buf} + fa", f"        fb_k = cur * {b_buf} + fb"]
    for s in range(spec.k_steps):
        for j in range(spec.n_tiles):
            base = s * MMA_K * spec.b_pitch + j * MMA_N
            lines += [
                f"        b{p}_{j}_{r} = sb{p}[fb_k + {base + o}]"
                for p in planes
                for r, o in enumerate(b_off)
            ]
        for i in range(spec.m_tiles):
            base = i * MMA_M * spec.a_pitch + s * MMA_K
            lines += [
                f"        a{p}_{r} = sa{p}[fa_k + {base + o}]"
                for p in planes
                for r, o in enumerate(a_off)
            ]
            for j in range(spec.n_tiles):
                lines += _mma_lines(spec, i, j)
    return lines


def _mma_lines(spec: MmaSpec, i: int, j: int) -> list[str]:
    """One k-step of mma tile (i, j). tf32: one mma into the accumulators. 3xtf32: small.big,
    big.small, big.big chained into a temporary that starts at zero, then 4 float adds into the
    accumulators: one rounding at the accumulators' magnitude per k-step, not three (the two
    small terms round at their own, ~2^-11 smaller, magnitude)."""
    acc = ", ".join(f"c{i}_{j}_{r}" for r in range(4))

    def mma(pa: int, pb: int, c: str) -> str:
        a_args = ", ".join(f"a{pa}_{r}" for r in range(4))
        return f"mma({a_args}, b{pb}_{j}_0, b{pb}_{j}_1, {c})"

    if spec.planes == 1:
        return [f"        {acc} = {mma(0, 0, acc)}"]
    tmp = ", ".join(f"t{r}" for r in range(4))
    return [
        f"        {tmp} = {mma(1, 0, 'zero, zero, zero, zero')}",
        f"        {tmp} = {mma(0, 1, tmp)}",
        f"        {tmp} = {mma(0, 0, tmp)}",
    ] + [f"        c{i}_{j}_{r} += t{r}" for r in range(4)]


def _epilogue(spec: MmaSpec) -> list[str]:
    """C += accumulators: unchecked for full blocks, per-element bounds checks at the edges."""
    lines = [
        f"    er = (row0 + wr * {spec.warp_m} + g) & 0x7FFFFFFF",
        f"    ec = (col0 + wc * {spec.warp_n} + 2 * t) & 0x7FFFFFFF",
    ]
    cells = [
        (i, j, r, i * MMA_M + dr, j * MMA_N + dc)
        for i, j, r in _accumulators(spec)
        for dr, dc in [c_offsets()[r]]
    ]
    lines += ["    if full:"]
    lines += [f"        c[er + {y}, ec + {x}] += c{i}_{j}_{r}" for i, j, r, y, x in cells]
    lines += ["    else:"]
    for i, j, r, y, x in cells:
        lines += [
            f"        if er + {y} < m and ec + {x} < n:",
            f"            c[er + {y}, ec + {x}] += c{i}_{j}_{r}",
        ]
    return lines

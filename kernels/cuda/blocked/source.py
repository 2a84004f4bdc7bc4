"""The register-blocked kernel's Python source, generated from a BlockedSpec (see
kernels.cuda.blocked.kernel for the design): Numba has no unroll pragma, so the unrolled K step, the
prefetch and the epilogue are written out here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernels.cuda.blocked.spec import BlockedSpec


class _Index:
    """Writes power-of-two index math as shifts and masks (or, for the bad kernel, // and %)."""

    def __init__(self, style: str) -> None:
        self.style = style

    def div(self, x: str, d: int, bound: int) -> str:
        """x // d for 0 <= x // d < bound; the mask proves the result non-negative."""
        if self.style == "divmod":
            return f"({x} // {d})"
        return f"(({x} >> {d.bit_length() - 1}) & {bound - 1})"

    def mod(self, x: str, d: int) -> str:
        return f"({x} % {d})" if self.style == "divmod" else f"({x} & {d - 1})"

    def mul(self, x: str, d: int) -> str:
        if d == 1:
            return x
        return f"({x} * {d})" if self.style == "divmod" else f"({x} << {d.bit_length() - 1})"


def _load_coords(spec: BlockedSpec) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(row, col) offsets of each prefetched element relative to the thread's base coordinates."""
    v = spec.load_vec
    a_rows_per_pass = spec.threads // (spec.block_k // v)
    b_rows_per_pass = spec.threads // (spec.block_n // v)
    a = [(p * a_rows_per_pass, j) for p in range(spec.a_loads // v) for j in range(v)]
    b = [(p * b_rows_per_pass, j) for p in range(spec.b_loads // v) for j in range(v)]
    return a, b


def _fragment_offsets(spec: BlockedSpec, half: int) -> list[int]:
    """Offsets of a thread's outputs along one axis: FRAG in each half of the block tile."""
    return [f * half + i for f in range(2) for i in range(spec.frag)]


def generate_source(spec: BlockedSpec, name: str = "blocked_matmul") -> str:
    """Python source of the kernel for `spec`; `elem` (numba type) and `cuda` are its globals."""
    ix = _Index(spec.index_math)
    bm, bn, bk, v = spec.block_m, spec.block_n, spec.block_k, spec.load_vec
    a_coords, b_coords = _load_coords(spec)
    rows = _fragment_offsets(spec, bm // 2)
    cols = _fragment_offsets(spec, bn // 2)
    a_buf, b_buf = bk * spec.a_pitch, bk * bn
    zero = "0.0" if spec.acc_init == "float64" else "zero"
    out = [
        f"def {name}(a, b, c):",
        f"    sa = cuda.shared.array({2 * a_buf}, elem)  # 2 buffers of A^T, pitch {spec.a_pitch}",
        f"    sb = cuda.shared.array({2 * b_buf}, elem)  # 2 buffers of B",
        "    zero = elem(0)",
        "    tid = cuda.threadIdx.x",
        f"    tx = {ix.mod('tid', spec.thread_cols)}",
        f"    ty = {ix.div('tid', spec.thread_cols, spec.thread_rows)}",
        "    m = c.shape[0]",
        "    n = c.shape[1]",
        "    k = a.shape[1]",
        f"    row0 = cuda.blockIdx.y * {bm}",
        f"    col0 = cuda.blockIdx.x * {bn}",
        f"    full = row0 + {bm} <= m and col0 + {bn} <= n",
        # This thread's A rows / column segment and B rows / column segment within the tile.
        f"    ar_t = {ix.div('tid', bk // v, bm)}",
        f"    ac = {ix.mul(ix.mod('tid', bk // v), v)}",
        f"    br = {ix.div('tid', bn // v, bk)}",
        f"    bc_t = {ix.mul(ix.mod('tid', bn // v), v)}",
        # Global indices masked to 31 bits: provably non-negative, so no wraparound fixups.
        "    ar = (row0 + ar_t) & 0x7FFFFFFF",
        "    bc = (col0 + bc_t) & 0x7FFFFFFF",
        f"    sa_st = ac * {spec.a_pitch} + ar_t",
        f"    sb_st = br * {bn} + bc_t",
        f"    sa_ld = {ix.mul('ty', spec.frag)}",
        f"    sb_ld = {ix.mul('tx', spec.frag)}",
    ]
    out += [f"    c{i}_{j} = {zero}" for i in range(len(rows)) for j in range(len(cols))]
    out += [f"    pa{e} = zero" for e in range(len(a_coords))]
    out += [f"    pb{e} = zero" for e in range(len(b_coords))]
    out += k_loop(
        bk,
        _prefetch(spec, "0", indent=8) + _store(spec, "0", indent=8),
        "any thread multiplies it",
        "t",
        lambda checked: _tile_step(spec, ix, a_buf, b_buf, rows, cols, checked),
    )
    out += _epilogue(spec, rows, cols, ix)
    return "\n".join(out) + "\n"


def _tile_step(
    spec: BlockedSpec,
    ix: _Index,
    a_buf: int,
    b_buf: int,
    rows: list[int],
    cols: list[int],
    checked: bool,
) -> list[str]:
    """One K tile: prefetch the next tile, multiply the current one, store the prefetched one."""
    # Masking to 31 bits proves the K index non-negative, which drops numba's wraparound fixups
    # from the global loads (K of one panel is below 2**31; the host checks).
    lines = [
        f"        cur = {ix.mod('t', 2)}",
        f"        kn = ((t + 1) * {spec.block_k}) & 0x7FFFFFFF",
    ]
    return lines + pipelined_tile(
        "t",
        checked,
        lambda indent, check: _prefetch(spec, "kn", indent, check),
        _multiply(spec, a_buf, b_buf, rows, cols),
        lambda indent: _store(spec, "(1 - cur)", indent),
        "everyone",
    )


def k_loop(
    bk: int,
    first_tile: list[str],
    first_user: str,
    var: str,
    tile_step: Callable[[bool], list[str]],
) -> list[str]:
    """The kernel's K loop: tile 0 loaded (``first_tile``) and stored before the barrier, then
    the unchecked iterations (the next tile wholly inside A and B) and the checked rest, each
    ``tile_step(checked)`` with loop variable ``var``; ``first_user``: who reads tile 0."""
    return [
        f"    n_tiles = (k + {bk - 1}) // {bk}",
        "    # Iterations whose next tile lies wholly inside A and B: the unchecked loop.",
        f"    n_inner = k // {bk} - 1 if full and k >= {2 * bk} else 0",
        "    if n_tiles > 0:",
        *first_tile,
        f"    # Tile 0 must be in shared memory before {first_user}.",
        "    cuda.syncthreads()",
        f"    for {var} in range(n_inner):",
        *tile_step(False),
        f"    for {var} in range(n_inner, n_tiles):",
        *tile_step(True),
    ]


def pipelined_tile(
    counter: str,
    checked: bool,
    prefetch: Callable[[int, bool], list[str]],
    multiply: list[str],
    store: Callable[[int], list[str]],
    who: str,
    load_last: bool = False,
) -> list[str]:
    """The body of one K tile after its indices: prefetch the next tile into registers (only if
    there is one, when ``checked``), multiply the current one, store the prefetched one into the
    other buffer, then the one barrier. Shared by the fp32 and tensor-core generators.
    ``load_last``: load the next tile after the multiply instead, so its registers are not live
    during it (3xTF32, whose multiply needs them)."""
    lines = [f"        more = {counter} + 1 < n_tiles"] if checked else []
    guard, indent = (["        if more:"], 12) if checked else ([], 8)
    loads, stores = prefetch(indent, checked), store(indent)
    if load_last:
        lines += multiply + guard + loads + stores
    else:
        lines += guard + loads + multiply + guard + stores
    return lines + [
        f"        # The next buffer is complete, and {who} is done with this one before",
        "        # the next iteration overwrites it: one barrier per tile, reached by all threads.",
        "        cuda.syncthreads()",
    ]


def _prefetch(spec: BlockedSpec, k0: str, indent: int, checked: bool | None = None) -> list[str]:
    """Global loads of one K tile into registers (see ``prefetch_lines``)."""
    a_coords, b_coords = _load_coords(spec)
    return prefetch_lines(a_coords, b_coords, k0, spec.block_k, indent, checked)


def prefetch_lines(
    a_coords: list[tuple[int, int]],
    b_coords: list[tuple[int, int]],
    k0: str,
    block_k: int,
    indent: int,
    checked: bool | None,
) -> list[str]:
    """Global loads of one K tile into registers ``pa0..``, ``pb0..`` from a thread's (row,
    column) offsets: unchecked inside, zero-filled at the edges; checked=None emits both with a
    runtime test (the prologue's tile 0). Shared by the fp32 and tensor-core generators."""
    pad = " " * indent
    a_ld = [f"a[ar + {r}, {k0} + ac + {j}]" for r, j in a_coords]
    b_ld = [f"b[{k0} + br + {r}, bc + {j}]" for r, j in b_coords]
    a_ok = [f"ar + {r} < m and {k0} + ac + {j} < k" for r, j in a_coords]
    b_ok = [f"{k0} + br + {r} < k and bc + {j} < n" for r, j in b_coords]
    fast = [f"pa{e} = {x}" for e, x in enumerate(a_ld)]
    fast += [f"pb{e} = {x}" for e, x in enumerate(b_ld)]
    safe = [
        f"pa{e} = {x} if {ok} else zero" for e, (x, ok) in enumerate(zip(a_ld, a_ok, strict=True))
    ]
    safe += [
        f"pb{e} = {x} if {ok} else zero" for e, (x, ok) in enumerate(zip(b_ld, b_ok, strict=True))
    ]
    if checked is not None:
        return [pad + line for line in (safe if checked else fast)]
    lines = [f"{pad}if full and {k0} + {block_k} <= k:"]
    lines += [f"{pad}    {line}" for line in fast]
    lines += [f"{pad}else:"]
    return lines + [f"{pad}    {line}" for line in safe]


def _store(spec: BlockedSpec, buf: str, indent: int) -> list[str]:
    """Registers to shared buffer `buf`: A transposed (k-major), B as is."""
    pad = " " * indent
    a_coords, b_coords = _load_coords(spec)
    a_base = f"{buf} * {spec.block_k * spec.a_pitch} + sa_st"
    b_base = f"{buf} * {spec.block_k * spec.block_n} + sb_st"
    lines = [
        f"{pad}sa[{a_base} + {j * spec.a_pitch + r}] = pa{e}" for e, (r, j) in enumerate(a_coords)
    ]
    lines += [
        f"{pad}sb[{b_base} + {r * spec.block_n + j}] = pb{e}" for e, (r, j) in enumerate(b_coords)
    ]
    return lines


def _multiply(
    spec: BlockedSpec, a_buf: int, b_buf: int, rows: list[int], cols: list[int]
) -> list[str]:
    """The BK loop written out: per k, load the thread's A column and B row, then outer product."""
    lines = [f"        sa_k = cur * {a_buf} + sa_ld", f"        sb_k = cur * {b_buf} + sb_ld"]
    for kk in range(spec.block_k):
        lines += [f"        x{i} = sa[sa_k + {kk * spec.a_pitch + r}]" for i, r in enumerate(rows)]
        lines += [f"        y{j} = sb[sb_k + {kk * spec.block_n + q}]" for j, q in enumerate(cols)]
        lines += [
            f"        c{i}_{j} += x{i} * y{j}" for i in range(len(rows)) for j in range(len(cols))
        ]
    return lines


def _epilogue(spec: BlockedSpec, rows: list[int], cols: list[int], ix: _Index) -> list[str]:
    """C += accumulators: unchecked for full blocks, per-element bounds checks at the edges."""
    lines = [
        f"    r0 = row0 + {ix.mul('ty', spec.frag)}",
        f"    q0 = col0 + {ix.mul('tx', spec.frag)}",
        "    if full:",
    ]
    pairs = [(i, r, j, q) for i, r in enumerate(rows) for j, q in enumerate(cols)]
    lines += [f"        c[r0 + {r}, q0 + {q}] += c{i}_{j}" for i, r, j, q in pairs]
    lines += ["    else:"]
    for i, r in enumerate(rows):
        lines += [f"        if r0 + {r} < m:"]
        for j, q in enumerate(cols):
            lines += [
                f"            if q0 + {q} < n:",
                f"                c[r0 + {r}, q0 + {q}] += c{i}_{j}",
            ]
    return lines


def compiled(source: str, name: str, namespace: dict[str, Any]) -> Callable[..., None]:
    """The function ``name`` defined by generated ``source``, run in ``namespace`` (its
    globals), with the source kept on it as ``__source__`` (inspect and tests read it)."""
    exec(compile(source, f"<{name}>", "exec"), namespace)
    kernel: Callable[..., None] = namespace[name]
    kernel.__source__ = source  # type: ignore[attr-defined]
    return kernel

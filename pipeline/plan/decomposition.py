"""Randomized PCA and truncated SVD (Halko, Martinsson & Tropp 2011, algorithm 4.4) as passes
over a stored X, planned here with no I/O: the request as checked, the steps in order, what
each reads, and the small dense algebra between passes.

M is X as decomposed (observations x variables; ``rows``: X's rows are the variables, M = Xᵀ),
standardized implicitly: M_s = (M − 1μᵀ) F, with F = diag(f). Nothing rewrites X: a product
``M S`` is ``X``'s product with ``F S``, corrected by the rank-one ``1 (μᵀ F S)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pipeline.errors import UsageError
from pipeline.plan.units import format_bytes

KINDS = ("pca", "svd")
DEFAULT_OVERSAMPLE = 10
"""scikit-learn's ``randomized_svd`` default."""
EXACT_INTEGERS = {"int8", "uint8", "int16", "uint16", "int32", "uint32", "bool"}
"""Integer dtypes whose every value float64 holds exactly (wider ones are refused)."""


def default_power_iterations(components: int, shape: tuple[int, int]) -> int:
    """scikit-learn's rule (``n_iter="auto"``): 7 when K is under a tenth of the smaller side,
    else 4."""
    return 7 if components < 0.1 * min(shape) else 4


@dataclass(frozen=True)
class Request:
    """What the user asked, checked against X's shape and dtype."""

    kind: str
    """pca (centred; ``scale``: each variable to unit variance) or svd (X as it is)."""
    components: int
    oversample: int
    power_iterations: int
    seed: int
    center: bool
    scale: bool
    rows: bool
    """X's rows are the variables (M = Xᵀ)."""

    @property
    def width(self) -> int:
        """l = K + P: the sketch's columns."""
        return self.components + self.oversample

    def words(self) -> str:
        flags = [f"--components {self.components}", f"--oversample {self.oversample}"]
        flags += [f"--power-iterations {self.power_iterations}", f"--seed {self.seed}"]
        if self.kind == "pca" and self.scale:
            flags.append("--scale")
        if self.rows:
            flags.append("--rows")
        return " ".join(flags)


def request(
    kind: str,
    shape: tuple[int, int],
    dtype: str,
    components: Any,
    oversample: Any = None,
    power_iterations: Any = None,
    seed: Any = 0,
    scale: bool = False,
    rows: bool = False,
) -> Request:
    """The options as a Request; UsageError (the numbers and the fix) for what has no answer.
    ``shape`` is X's as stored."""
    n, p = (shape[1], shape[0]) if rows else shape
    for name, value, least in (
        ("--components", components, 1),
        ("--oversample", oversample, 0),
        ("--power-iterations", power_iterations, 0),
        ("--seed", seed, 0),
    ):
        if value is None and name != "--components":
            continue
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
            raise UsageError(f"{name} takes a whole number >= {least}; got {value!r}")
    if kind not in KINDS:
        raise UsageError(f"unknown decomposition {kind!r}; choose {' or '.join(KINDS)}")
    if scale and kind == "svd":
        raise UsageError(
            "svd decomposes X as it is; for each variable scaled to unit variance run "
            "`pca X OUT --scale` (centred), or scale X first"
        )
    smaller = min(n, p)
    if components > smaller:
        raise UsageError(
            f"--components {components} is more than X has: it is {n} x {p} (observations x "
            f"variables), so at most {smaller} components; pass --components {smaller} or fewer"
        )
    kind_of = np.dtype(dtype)
    if (
        kind_of.kind not in "fiub"
        or kind_of.itemsize > 8
        or kind_of.kind == "f"
        and kind_of.itemsize > 8
    ):
        raise UsageError(f"{kind} takes real numbers (floats, integers, bool); X is {dtype}")
    if kind_of.kind in "iu" and kind_of.name not in EXACT_INTEGERS:
        raise UsageError(
            f"X is {dtype}, whose values beyond 2^53 float64 cannot hold exactly, and {kind} "
            "computes in float64; cast X to float64 (or a narrower integer) first"
        )
    width = components + (DEFAULT_OVERSAMPLE if oversample is None else int(oversample))
    width = min(width, smaller)  # a sketch wider than X spans no more
    iterations = (
        default_power_iterations(components, (n, p))
        if power_iterations is None
        else int(power_iterations)
    )
    return Request(
        kind, int(components), width - int(components), iterations, int(seed),
        center=kind == "pca", scale=bool(scale), rows=bool(rows),
    )  # fmt: skip


@dataclass(frozen=True)
class Step:
    """One step of the run, named for the record (a finished step is kept by --resume)."""

    name: str
    what: str
    """``moments``, ``sketch``, ``product`` (a pass over X), ``orthonormalize`` or ``finish``."""
    side: str = ""
    """The tall-skinny array's side: ``n`` (observations) or ``p`` (variables)."""
    source: str = ""
    """The array the step reads (a product: its small operand; else the one it transforms)."""
    target: str = ""
    """The array it writes."""


def steps(req: Request) -> tuple[Step, ...]:
    """Moments, Ω, then Y = M_s Ω, Q = orth(Y), (W = orth(M_sᵀ Q), Q = orth(M_s W)) x q,
    Bᵀ = M_sᵀ Q, and the SVD of B with the components and scores written."""
    found = [Step("moments", "moments"), Step("sketch", "sketch", "p", "", "omega")]
    found += [
        Step("y0", "product", "n", "omega", "y0"),
        Step("q0", "orthonormalize", "n", "y0", "q0"),
    ]
    q = "q0"
    for i in range(1, req.power_iterations + 1):
        found += [
            Step(f"z{i}", "product", "p", q, f"z{i}"),
            Step(f"w{i}", "orthonormalize", "p", f"z{i}", f"w{i}"),
            Step(f"y{i}", "product", "n", f"w{i}", f"y{i}"),
            Step(f"q{i}", "orthonormalize", "n", f"y{i}", f"q{i}"),
        ]
        q = f"q{i}"
    found += [Step("b", "product", "p", q, "b"), Step("finish", "finish", "p", "b", q)]
    return tuple(found)


def x_passes(req: Request) -> int:
    """Reads of X: the moments pass and 2q + 2 products."""
    return 2 * req.power_iterations + 3


def band_rows(chunk: int, width: int, budget: int = 64 * 2**20) -> int:
    """Rows of a tall-skinny array per band task: whole chunks, about ``budget`` bytes of
    float64 at ``width`` columns (the QR's copy included)."""
    per_chunk = max(chunk, 1) * max(width, 1) * 8 * 3
    return max(chunk, 1) * max(1, budget // per_chunk)


def bands(length: int, rows: int) -> list[tuple[int, int]]:
    return [(r0, min(r0 + rows, length)) for r0 in range(0, length, max(rows, 1))]


def stacked_r(
    parts: list[NDArray[np.float64]], width: int
) -> tuple[NDArray[np.float64], list[NDArray[np.float64]]]:
    """TSQR's second level: the R factors of the bands stacked and factored again. Returns R
    and each band's block of the second Q (Q_band = Q_i @ block_i)."""
    stacked = np.concatenate([r.reshape(-1, width) for r in parts], axis=0)
    if stacked.shape[0] < width:  # fewer values than columns: pad with zero rows
        stacked = np.concatenate([stacked, np.zeros((width - stacked.shape[0], width))])
    q2, r = np.linalg.qr(stacked)
    blocks, at = [], 0
    for part in parts:
        blocks.append(q2[at : at + part.shape[0]])
        at += part.shape[0]
    return r, blocks


def small_svd(r: NDArray[np.float64], components: int) -> tuple[NDArray[np.float64], ...]:
    """B's SVD from Bᵀ = Q_B R: R = Ua S Vaᵀ, so B = Va S (Q_B Ua)ᵀ. Returns (Ua, S, Va) cut
    to K, and all l singular values of B (verify's bound on what the sketch missed)."""
    ua, s, vat = np.linalg.svd(r)
    return ua[:, :components], s[:components], vat.T[:, :components], s


def flip_signs(peaks: list[NDArray[np.float64]]) -> NDArray[np.float64]:
    """scikit-learn's sign rule (``svd_flip(u_based_decision=False)``): each component's
    largest entry in absolute value is positive. ``peaks``: each band's signed peak per
    component (the first band's wins a tie)."""
    best = np.zeros_like(peaks[0])
    for peak in peaks:
        take = np.abs(peak) > np.abs(best)
        best = np.where(take, peak, best)
    return np.where(best < 0, -1.0, 1.0)


def explained(
    req: Request,
    singular: NDArray[np.float64],
    n: int,
    total_ss: float,
    score_sums: NDArray[np.float64] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """explained_variance_ and explained_variance_ratio_ as scikit-learn defines them: PCA's
    S² / (n − 1) over the variables' total variance; TruncatedSVD's variance of each score
    column (ddof 0) over X's columns' total variance (ddof 0). ``total_ss``: the variables'
    summed squared deviations, standardized."""
    if req.kind == "pca":
        divisor = max(n - 1, 1)
        variance = singular**2 / divisor
        total = total_ss / divisor
    else:
        means = np.zeros_like(singular) if score_sums is None else score_sums / n
        variance = singular**2 / n - means**2
        total = total_ss / n
    ratio = variance / total if total > 0 else np.full_like(variance, np.nan)
    return variance, ratio


@dataclass(frozen=True)
class Sizes:
    """What a decomposition reads, keeps and writes, for the plan and the dry run."""

    n: int
    p: int
    x_bytes: int
    """X's elements' bytes (as decoded) read by one pass."""
    width: int

    def scratch_bytes(self) -> int:
        """The tall-skinny arrays kept at once in OUT (float64): Ω or W and Y or Z, and Q."""
        return 8 * self.width * (2 * self.n + 2 * self.p)

    def result_bytes(self, itemsize: int, components: int) -> int:
        return itemsize * components * (self.n + self.p) + 8 * (2 * self.p + 3 * components)


def describe(
    req: Request,
    sizes: Sizes,
    product_lines: list[str],
    seconds: float | None,
    passes_from: str = "auto",
) -> str:
    """The dry run's table: the request, the passes, the bytes, the product pass's plan."""
    reads = x_passes(req)
    held = {
        "auto": f"X ({format_bytes(sizes.x_bytes)} decoded) is read once and held by the "
        "workers where it fits half their memory and the passes run on the CPU; else as below",
        "memory": f"X ({format_bytes(sizes.x_bytes)} decoded) read once and held by the "
        "workers (refused at the start where it does not fit half their memory)",
        "storage": "every pass reads X where it is stored",
    }[passes_from]
    rows = [
        (
            "decomposition",
            f"{req.kind} of {sizes.n} x {sizes.p} (observations x variables), "
            f"K = {req.components}, l = K + P = {req.width}, q = {req.power_iterations}",
        ),
        ("passes from", held),
        (
            "passes over X",
            f"{reads} (moments, then 2q + 2 = {reads - 1} products), "
            f"{format_bytes(reads * sizes.x_bytes)} read",
        ),
        (
            "between passes",
            "each sketch orthonormalized by TSQR in bands (at most "
            f"{format_bytes(8 * sizes.width * max(sizes.n, sizes.p))} per array); the small "
            "SVD in memory",
        ),
        (
            "OUT",
            f"{format_bytes(sizes.scratch_bytes())} of passes at most (removed at the end), "
            "then components, scores and the spectra",
        ),
    ]
    if seconds is not None:
        rows.append(
            (
                "time",
                f"about {seconds:.1f} s modelled: {reads} passes at one product pass's modelled "
                "time (below), start-up not counted",
            )
        )
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    if product_lines:
        text += "\none product pass (M_s times the sketch):\n" + "\n".join(
            "  " + line for line in product_lines
        )
    return text


def total_seconds(req: Request, product_seconds: float) -> float:
    return x_passes(req) * product_seconds


def check_finite(nonfinite: int, absent: int, x_name: str = "X") -> None:
    """NaN and infinite values have no place in a decomposition (nothing is imputed)."""
    if absent or nonfinite:
        what = f"{absent:,} NaN value(s)" if absent else f"{nonfinite:,} infinite value(s)"
        raise UsageError(
            f"{x_name} holds {what}; a decomposition needs every value: impute or drop them "
            "first (e.g. xarray's fillna or dropna), or compute a covariance with "
            "`gram X G --center --missing impute` instead"
        )


def missed_factor(req_width: int, components: int, iterations: int, smaller: int) -> float:
    """How far past σ_(K+1) the sketch's spectral error may go: the bracket of Halko, Martinsson
    & Tropp (2011, corollary 10.10) to the power 1 / (2q + 1), for ‖(I − QQᵀ) M_s‖ <=
    factor · σ_(K+1) in expectation (with oversampling P >= 2)."""
    p = max(req_width - components, 2)
    bracket = (
        1
        + math.sqrt(components / (p - 1))
        + math.e * math.sqrt(req_width) / p * math.sqrt(max(smaller - components, 1))
    )
    return float(bracket ** (1 / (2 * iterations + 1)))


HOLD_FRACTION = 0.5
"""X is held in the workers' memory when its decoded bytes are at most this share of it."""
PASSES_FROM = ("auto", "memory", "storage")
HELD_BAND_BYTES = 256 * 2**20


def check_passes_from(mode: str) -> None:
    if mode not in PASSES_FROM:
        raise UsageError(f"--passes-from takes {' or '.join(PASSES_FROM)}; got {mode!r}")


def hold(mode: str, x_bytes: int, workers: int, memory_limit: int, backend: str) -> bool:
    """Whether X is read once and held by the workers: ``auto`` when it fits HOLD_FRACTION of
    their memory and the passes run on the CPU (a GPU backend's go through its kernels);
    ``memory`` insists (refused when it does not fit); ``storage`` never."""
    check_passes_from(mode)
    room = int(HOLD_FRACTION * workers * memory_limit) if memory_limit > 0 else 0
    fits = 0 < x_bytes <= room
    if mode == "memory" and not fits:
        raise UsageError(
            f"--passes-from memory: X ({format_bytes(x_bytes)} decoded) does not fit half the "
            f"workers' memory ({workers} x {format_bytes(memory_limit)}); add workers or memory, "
            "or pass --passes-from storage (each pass reads X)"
        )
    return mode == "memory" or (mode == "auto" and fits and backend == "cpu")


def held_rows(shape: tuple[int, int], chunk_rows: int, x_bytes: int, threads: int) -> int:
    """Rows of a held band: whole row chunks of X, at most HELD_BAND_BYTES, and enough bands
    for two per thread where X has the chunks for it."""
    rows, _ = shape
    per_row = max(x_bytes // max(rows, 1), 1)
    target = min(HELD_BAND_BYTES, max(x_bytes // max(2 * threads, 1), 1))
    return max(chunk_rows, 1) * max(1, target // (max(chunk_rows, 1) * per_row))

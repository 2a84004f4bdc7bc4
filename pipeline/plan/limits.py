"""How big a plan may get: tile tasks, and K panels per task, counted before anything is
created (pure). Hostile or mistaken metadata (a 10^12 x 10^12 OUT, a 10^12-wide K in tiny
chunks) is refused here with its numbers, before OUT exists, rather than by the client, the
scheduler or the journal running out of memory. Also the least a part of a plan must read
(a resumed run computes only the tiles, and rows, not yet written)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from pipeline.errors import PlanLimitError
from pipeline.plan.matmul import MatmulPlan, ceil_div
from pipeline.plan.spec import KPanels

MAX_TASKS = 1_000_000
"""Tile tasks one plan may submit (each is a scheduler task and a journal entry)."""
MAX_PANELS = 100_000
"""K panels one tile may stream (each is two reads and a gemm call; the job's fingerprint
lists them, ~100 bytes each)."""


@dataclass(frozen=True)
class PlanLimits:
    max_tasks: int = MAX_TASKS
    """Tile tasks (tiles x K groups) a plan may submit."""
    max_panels: int = MAX_PANELS
    """K panels one tile may stream."""


def check_panels(panels: KPanels, limits: PlanLimits) -> None:
    """Refuse a K streamed in more panels than the limit, saying what chunking would do."""
    if len(panels) <= limits.max_panels:
        return
    need = ceil_div(panels.k, limits.max_panels)
    raise PlanLimitError(
        f"K ({panels.k:,}) would be streamed in {len(panels):,} panels of {panels.width:,} "
        f"per tile, more than the limit of {limits.max_panels:,}; store A's columns or B's "
        f"rows in chunks of at least {need:,} (a panel is as wide as the larger K chunk)"
    )


def task_limit_message(fewest: MatmulPlan, limits: PlanLimits, forced: bool = False) -> str:
    """Why no plan within the memory limit has few enough tasks, and what to change
    (``forced``: the tiling is the one OUT was started with)."""
    (rows, cols), (tm, tn) = fewest.grid, fewest.tile_shape
    split = f" x {fewest.split_k} K groups" if fewest.split_k > 1 else ""
    fix = (
        "pass --overwrite instead of --resume to plan OUT afresh"
        if forced
        else "raise --memory-limit so that bigger tiles fit, multiply smaller blocks of A and "
        "B as separate jobs, or raise the limit (DASK_TILEGEMM__MAX_TASKS) if the scheduler "
        "can take that many tasks"
    )
    return (
        f"the plan needs at least {fewest.n_tasks:,} tasks ({rows:,}x{cols:,} tiles of "
        f"{tm:,}x{tn:,}{split}{' kept from OUT' if forced else ''}) within the memory limit, "
        f"more than the limit of {limits.max_tasks:,}; {fix}"
    )


Region = tuple[tuple[int, int], tuple[int, int]]
"""Rows [r0, r1) and columns [c0, c1) of OUT."""


def computed_regions(
    plan: MatmulPlan,
    skip: Iterable[tuple[int, int]],
    resumed: Mapping[tuple[int, int], tuple[int, int]],
) -> tuple[Region, ...]:
    """What a run computes: the tiles not in ``skip``, each from the first row ``resumed``
    gives it (--resume: a tile in flight keeps the bands it wrote; values as
    pipeline.store.journal.written_rows returns them)."""
    done = set(skip)
    return tuple(
        ((resumed[t.index][0] if t.index in resumed else t.rows[0], t.rows[1]), t.cols)
        for t in plan.tiles()
        if t.index not in done
    )


def read_lower_bound(plan: MatmulPlan, regions: Iterable[Region]) -> int:
    """The least ``plan``'s workers can read to compute ``regions`` of OUT, in bytes: every
    input element the regions need, once, and Smith's bound in proportion to their share of
    the product where the whole's exceeds its compulsory reads (else the compulsory reads
    of the part are the larger: a share f of OUT's area needs at least f of A's rows and of
    B's columns). All of OUT's tiles give ``plan.lower_bound_read_bytes``."""
    regions = list(regions)
    total = sum(t.shape[0] * t.shape[1] for t in plan.tiles())
    share = sum((r1 - r0) * (c1 - c0) for (r0, r1), (c0, c1) in regions) / max(total, 1)
    whole = plan.lower_bound_read_bytes
    smith = int(whole * share) if whole > plan.compulsory_read_bytes else 0
    k = plan.a.shape[1]
    a_item, b_item = np.dtype(plan.a.dtype).itemsize, np.dtype(plan.b.dtype).itemsize
    rows, cols = [r for r, _ in regions], [c for _, c in regions]
    if plan.symmetric:  # G's rows and columns both index X's one operand axis
        compulsory = _covered(rows + cols) * k * a_item
    else:
        compulsory = k * (_covered(rows) * a_item + _covered(cols) * b_item)
    return max(smith, compulsory)


def _covered(ranges: list[tuple[int, int]]) -> int:
    """How many indices the half-open ``ranges`` cover together."""
    count, end = 0, 0
    for lo, hi in sorted(ranges):
        if hi > end:
            count += hi - max(lo, end)
            end = hi
    return count

"""How big a plan may get: tile tasks, and K panels per task, counted before anything is
created (pure). Hostile or mistaken metadata (a 10^12 x 10^12 OUT, a 10^12-wide K in tiny
chunks) is refused here with its numbers, before OUT exists, rather than by the client, the
scheduler or the journal running out of memory."""

from __future__ import annotations

from dataclasses import dataclass

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

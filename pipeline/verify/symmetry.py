"""Verify's side of a Gram product: which operation C records, and the check that C equals
its transpose bitwise (one more read of C, beside Freivalds' reads of X twice and C once)."""

from __future__ import annotations

import dataclasses
from typing import Any

from distributed import Client, Future

from pipeline.errors import UsageError
from pipeline.store import inputs
from pipeline.store.fs import check_credentials, local_path
from pipeline.store.reach import check_readable
from pipeline.store.record import ATTRS_KEY, OutRecord, of_array
from pipeline.verify import tasks


def recorded(
    ours: OutRecord | None, given: tuple[bool | None, bool | None], url: str
) -> tuple[tuple[bool, bool], bool]:
    """(the transposes, symmetric) of the product C holds: as given, else as C's record
    (``ours``; None: C has none) says; a given transpose that differs from C's record is
    refused."""
    ours = ours or OutRecord()
    record = (ours.transpose_a, ours.transpose_b)
    chosen = (
        record[0] if given[0] is None else bool(given[0]),
        record[1] if given[1] is None else bool(given[1]),
    )
    if ours.fingerprint is not None and chosen != record:
        raise UsageError(
            f"C ({url}) records the product {_text(record)} (its {ATTRS_KEY} attributes), not "
            f"{_text(chosen)}; drop the --transpose flags (verify reads them from C)"
        )
    return chosen, ours.symmetric


def gram_operands(x_url: str, g_url: str, options: dict[str, Any] | None) -> tuple[str, str, str]:
    """``verify X G``'s A, B and C: X, X and G, when G's record says `gram` wrote it (the
    transposes, Xᵀ·X or X·Xᵀ, are then read from there too); any other G is refused with the
    fix, three operands."""
    check_credentials(g_url, "G")
    local = local_path(g_url)
    if local is not None:
        check_readable("G", g_url, local)
    ours = of_array(inputs.open_input(g_url, options, "G"))
    if ours is None or not ours.symmetric:
        raise UsageError(
            f"G ({g_url}) is not a Gram product this tool wrote (its {ATTRS_KEY} attribute "
            "does not record one), so `verify X G` cannot tell what it is a product of; pass "
            "A B C: `python -m pipeline verify A B C`"
        )
    return x_url, x_url, g_url


def submit(client: Client, job: tasks.CheckSpec, run: str) -> list[Future[Any]]:
    """One task per row block of C: its elements right of the diagonal against their mirror."""
    m, step = job.specs[2].shape[0], job.specs[2].chunks[0]
    return [
        client.submit(tasks.asymmetric, job, (r0, min(r0 + step, m)), key=f"verify-sym-{run}-{r0}")
        for r0 in range(0, m, step)
    ]


def add(result: Any, futures: list[Future[Any]]) -> Any:
    """``result`` with the elements not equal to their mirror counted; any fails it."""
    found = sum(int(f.result()) for f in futures)
    return dataclasses.replace(result, asymmetric=found, passed=result.passed and found == 0)


def _text(transposed: tuple[bool, bool]) -> str:
    return f"{'Aᵀ' if transposed[0] else 'A'}·{'Bᵀ' if transposed[1] else 'B'}"

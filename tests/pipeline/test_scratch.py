"""Reused read buffers: a buffer given back is handed out again, never to two readers at once,
and the pool keeps at most KEEP_BYTES idle."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.memory import scratch


@pytest.fixture(autouse=True)
def empty_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "_idle", [])


def test_a_buffer_given_back_is_reused_for_a_smaller_read() -> None:
    with scratch.scratch(1000) as first:
        first[:] = 7
        address = first.__array_interface__["data"][0]
    with scratch.scratch(600) as again:
        assert again.nbytes == 600
        assert again.__array_interface__["data"][0] == address  # the same pages
    assert scratch.idle_bytes() == 1000


def test_readers_at_once_get_separate_buffers() -> None:
    with scratch.scratch(100) as a, scratch.scratch(100) as b:
        a[:] = 1
        b[:] = 2
        assert not np.shares_memory(a, b)
        assert (a == 1).all()
    assert scratch.idle_bytes() == 200


def test_the_smallest_fitting_buffer_is_taken() -> None:
    with scratch.scratch(5000), scratch.scratch(300):
        pass
    with scratch.scratch(200) as small:
        assert scratch.idle_bytes() == 5000  # the 300-byte one is out
        assert small.base is not None and small.base.nbytes == 300


def test_idle_bytes_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "KEEP_BYTES", 1000)
    with scratch.scratch(600), scratch.scratch(500), scratch.scratch(300):
        pass
    assert scratch.idle_bytes() == 600  # the largest kept first: any later read fits it
    with scratch.scratch(2000):
        pass
    assert scratch.idle_bytes() == 0  # one buffer over the cap is not kept

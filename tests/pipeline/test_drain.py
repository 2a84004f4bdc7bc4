"""A stopped job waits for its running tasks (pipeline.run.client.drain): what the workers'
answers mean, with a worker gone or one that never answers."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from pipeline.run import stopping
from pipeline.run.stopping import drain, running


class Answers:
    """A client whose workers answer ``client.run`` from a script, one answer per poll."""

    def __init__(self, *polls: Any) -> None:
        self.polls, self.calls = list(polls), []

    def run(self, function: Any, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        answer = self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


OURS = {"tile-a", "tile-b"}


def test_only_our_keys_count_and_a_gone_worker_runs_nothing() -> None:
    gone = OSError("CommClosedError: the worker died")
    workers = Answers({"w1": ["tile-a", "other-job"], "w2": gone, "w3": ["tile-b"], "w4": []})
    assert running(workers, OURS, 5.0) == 2  # type: ignore[arg-type]
    # errors come back per worker (one dead worker must not hide the others), bounded in time
    assert workers.calls == [{"on_error": "return", "callback_timeout": 5.0}]


def test_a_worker_that_does_not_answer_is_not_taken_for_idle() -> None:
    assert running(Answers(TimeoutError()), OURS, 5.0) is None  # type: ignore[arg-type]
    assert running(Answers(RuntimeError("closing")), OURS, 5.0) == 0  # type: ignore[arg-type]


def test_drain_waits_through_silence_until_the_tasks_are_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: None)
    workers = Answers({"w": ["tile-a"]}, TimeoutError(), {"w": ["tile-b"]}, {"w": []})
    drain(workers, sorted(OURS), timeout=60)  # type: ignore[arg-type]
    assert len(workers.calls) == 4 and workers.polls == [{"w": []}]


def test_drain_gives_up_at_its_deadline_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(stopping.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(stopping.time, "sleep", lambda s: None)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        drain(Answers(TimeoutError()), sorted(OURS), timeout=25)  # type: ignore[arg-type]
    assert caplog.messages == [
        "some tile task(s) may still be running on the workers after 25 s; "
        "wait for them before --resume"
    ]

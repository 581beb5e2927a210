"""The progress throttle (controlplane.domain.progress): which readings become task events."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain.progress import (
    ProgressMark,
    ProgressThrottle,
    next_mark,
    progress_applies,
)
from controlplane.domain.states import AttemptState, TaskState
from vidroute_core.adapter import JobState

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
THROTTLE = ProgressThrottle(min_step=0.05, min_interval_s=5.0)


def _mark(
    fraction: float | None = None,
    position: int | None = None,
    *,
    after_s: float = 0.0,
    attempt: int = 7,
) -> ProgressMark:
    return ProgressMark(attempt, fraction, position, T0 + timedelta(seconds=after_s))


def test_first_reading_of_an_attempt_is_kept() -> None:
    """The first reading with a fraction or a queue position is written at once."""
    assert next_mark(_mark(0.0), None, THROTTLE) == _mark(0.0)
    assert next_mark(_mark(position=3), None, THROTTLE) == _mark(position=3)


def test_reading_with_nothing_in_it_is_dropped() -> None:
    """A reading with neither fraction nor queue position is never an event."""
    assert next_mark(_mark(), None, THROTTLE) is None


def test_same_progress_again_writes_nothing() -> None:
    """A reading equal to the last mark is dropped however late it comes."""
    assert next_mark(_mark(0.4, after_s=60), _mark(0.4), THROTTLE) is None
    assert next_mark(_mark(position=2, after_s=60), _mark(position=2), THROTTLE) is None


@pytest.mark.parametrize(
    ("last", "now", "kept"),
    [(0.10, 0.149, False), (0.10, 0.15, True), (0.1, 0.9, True), (0.0, 0.05, True)],
)
def test_fraction_must_rise_by_the_step(last: float, now: float, kept: bool) -> None:
    """A fraction is kept once it rose by at least 5 points (decimal noise aside)."""
    mark = next_mark(_mark(now, after_s=10), _mark(last), THROTTLE)
    assert (mark is not None) is kept


def test_falling_fraction_is_not_shown() -> None:
    """A fraction below the last mark is dropped: the bar never goes back."""
    assert next_mark(_mark(0.2, after_s=10), _mark(0.6), THROTTLE) is None


def test_interval_holds_back_a_change_until_it_has_passed() -> None:
    """Within min_interval_s of the last mark nothing is written; the same change after it is."""
    last = _mark(0.1)
    assert next_mark(_mark(0.5, after_s=4.9), last, THROTTLE) is None
    assert next_mark(_mark(0.5, after_s=5.0), last, THROTTLE) == _mark(0.5, after_s=5.0)


def test_queue_position_change_is_kept_and_fraction_appearing_too() -> None:
    """A new queue position is written; so is the first fraction after queue-only marks."""
    assert next_mark(_mark(position=1, after_s=6), _mark(position=2), THROTTLE) is not None
    assert next_mark(_mark(0.0, after_s=6), _mark(position=0), THROTTLE) is not None
    # Leaving the queue (no position reported) is the attempt's state event, not a mark.
    assert next_mark(_mark(after_s=6), _mark(position=0), THROTTLE) is None


def test_mark_of_another_attempt_does_not_throttle() -> None:
    """A new attempt starts its own bar: the previous attempt's mark is ignored."""
    assert next_mark(_mark(0.1, attempt=8), _mark(0.9, attempt=7), THROTTLE) is not None


def test_payload_round_trips_and_names_the_attempt_state() -> None:
    """A mark survives its event payload; the payload carries only the reported fields."""
    mark = _mark(0.25, 4)
    payload = mark.payload(AttemptState.PROVIDER_QUEUED)
    assert payload == {
        "attempt_id": 7,
        "state": "PROVIDER_QUEUED",
        "fraction": 0.25,
        "queue_position": 4,
    }
    assert ProgressMark.from_payload(payload, mark.at) == mark
    assert "fraction" not in _mark(position=1).payload(AttemptState.RUNNING)
    assert ProgressMark.from_payload({"fraction": 0.5}, T0) is None


_J, _A, _T = JobState, AttemptState, TaskState


@pytest.mark.parametrize(
    ("case", "shown"),
    [
        ((_J.RUNNING, _A.RUNNING, _T.RUNNING, None, 7), True),
        ((_J.QUEUED, _A.PROVIDER_QUEUED, _T.RUNNING, None, 7), True),
        ((_J.RUNNING, _A.ACCEPTED, _T.SUBMITTING, None, 7), True),
        ((_J.SUCCEEDED, _A.SUCCEEDED, _T.OUTPUT_FETCHING, 7, 7), False),
        ((_J.RUNNING, _A.SUCCEEDED, _T.OUTPUT_FETCHING, 7, 7), False),
        ((_J.RUNNING, _A.CANCEL_REQUESTED, _T.RUNNING, None, 7), False),
        ((_J.RUNNING, _A.RUNNING, _T.CANCELLED, None, 7), False),
        ((_J.RUNNING, _A.RUNNING, _T.RUNNING, 5, 7), False),
        ((_J.RUNNING, _A.RUNNING, _T.RUNNING, None, 8), False),
        ((_J.UNRECOGNIZED, _A.RUNNING, _T.RUNNING, None, 7), False),
    ],
)
def test_progress_applies_only_to_a_live_attempt_the_task_waits_on(
    case: tuple[JobState, AttemptState, TaskState, int | None, int], shown: bool
) -> None:
    """Progress is shown for a live job of a live, awaited attempt; a late one is dropped."""
    job, attempt, task, adopted, latest = case
    applies = progress_applies(
        job_state=job,
        attempt_id=7,
        attempt_state=attempt,
        task_state=task,
        adopted_attempt_id=adopted,
        latest_attempt_id=latest,
    )
    assert applies is shown


def test_throttle_rejects_nonsense_settings() -> None:
    """A step outside (0, 1] or a negative interval is refused when the config is built."""
    with pytest.raises(ValueError, match="min_step"):
        ProgressThrottle(min_step=0.0)
    with pytest.raises(ValueError, match="min_interval_s"):
        ProgressThrottle(min_interval_s=-1.0)


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 30.0)), min_size=1, max_size=200)
)
def test_written_marks_are_bounded_rising_and_spaced(steps: list[tuple[float, float]]) -> None:
    """Over any reading sequence the marks rise by >= the step, are >= the interval apart, and
    number at most 1 / step + 1."""
    last: ProgressMark | None = None
    at = 0.0
    written: list[ProgressMark] = []
    for fraction, gap in steps:
        at += gap
        mark = next_mark(_mark(fraction, after_s=at), last, THROTTLE)
        if mark is not None:
            written.append(mark)
            last = mark
    assert len(written) <= round(1 / THROTTLE.min_step) + 1
    for before, after in itertools.pairwise(written):
        assert after.fraction is not None
        assert before.fraction is not None
        assert after.fraction - before.fraction >= THROTTLE.min_step - 1e-9
        assert (after.at - before.at).total_seconds() >= THROTTLE.min_interval_s

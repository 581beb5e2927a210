"""Which provider progress becomes a task event (issue 13, design 9.18): the throttle, no I/O.

Providers report progress on every poll and callback: a 0..1 fraction (Runway's ``progress``
while RUNNING, the model server's ``progress``) and a queue position (the model server's,
0 = next). A caller draws a bar from ``provider.progress`` task events, streamed by WatchTask;
writing every reading would flood the stream and the events table, so `next_mark` keeps a
reading only when:

- it is about a live attempt the task still waits on, and the provider calls the job queued or
  running (`progress_applies`): progress never moves a state, and a reading that arrives after
  the attempt or the task ended (or from an attempt the task no longer waits on) is dropped;
- it says something new against the last mark *written* for the attempt: the fraction rose by at
  least `ProgressThrottle.min_step` or appeared, or the queue position changed. A falling
  fraction is not shown (a bar never goes back), nor a reading equal to the last mark;
- and the last mark is at least `ProgressThrottle.min_interval_s` old. A reading held back by
  the interval is not lost: the next one is compared with the last written mark again.

So an attempt writes at most ``1 / min_step + 1`` fraction marks (21 at the default 5 points),
and queue marks no faster than one per ``min_interval_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.domain.observation import task_waits_on
from controlplane.domain.states import AttemptState, TaskState
from vidroute_core.adapter import JobState

__all__ = [
    "PROGRESS_EVENT",
    "ProgressMark",
    "ProgressThrottle",
    "next_mark",
    "progress_applies",
]

PROGRESS_EVENT = "provider.progress"
"""The ``task_events.kind`` of a progress mark."""

# Job states progress is shown for; a terminal one has its own state event.
_LIVE_JOB = frozenset({JobState.QUEUED, JobState.THROTTLED, JobState.RUNNING})
# Attempt states whose progress a caller sees; a cancelling attempt's is of no interest.
_LIVE_ATTEMPT = frozenset(
    {
        AttemptState.ACCEPTED,
        AttemptState.PROVIDER_QUEUED,
        AttemptState.PROVIDER_THROTTLED,
        AttemptState.RUNNING,
    }
)
# Float noise of a provider's decimal fractions (0.1 + 0.05 != 0.15).
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class ProgressThrottle:
    """How much progress is worth an event.

    `min_step` (0.05): 5 points of fraction, a smooth bar in at most 21 marks. `min_interval_s`
    (5 s, scaled by the time scale): Runway documents no updates more often than every 5 s per
    task, and the running poll schedule (10-30 s) rarely comes closer; callbacks may."""

    min_step: float = 0.05
    min_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 < self.min_step <= 1.0:
            raise ValueError("min_step must be in (0, 1]")
        if self.min_interval_s < 0:
            raise ValueError("min_interval_s must not be negative")


@dataclass(frozen=True, slots=True)
class ProgressMark:
    """One reading as written (or read back from a ``provider.progress`` event)."""

    attempt_id: int
    fraction: float | None
    queue_position: int | None
    at: datetime

    def payload(self, attempt_state: AttemptState) -> dict[str, Any]:
        """The event payload: the attempt (and its state) and what the provider reported."""
        values: dict[str, Any] = {"attempt_id": self.attempt_id, "state": attempt_state.value}
        if self.fraction is not None:
            values["fraction"] = self.fraction
        if self.queue_position is not None:
            values["queue_position"] = self.queue_position
        return values

    @classmethod
    def from_payload(cls, payload: dict[str, Any], at: datetime) -> ProgressMark | None:
        """The mark a stored event payload holds; None if it is not one."""
        attempt_id = payload.get("attempt_id")
        if not isinstance(attempt_id, int):
            return None
        fraction = payload.get("fraction")
        position = payload.get("queue_position")
        return cls(
            attempt_id,
            float(fraction) if isinstance(fraction, int | float) else None,
            position if isinstance(position, int) else None,
            at,
        )


def progress_applies(
    *,
    job_state: JobState,
    attempt_id: int,
    attempt_state: AttemptState,
    task_state: TaskState,
    adopted_attempt_id: int | None,
    latest_attempt_id: int | None,
) -> bool:
    """Whether a reading of this attempt's job may be shown at all (live job, live attempt,
    and the task still waits on the attempt)."""
    return (
        job_state in _LIVE_JOB
        and attempt_state in _LIVE_ATTEMPT
        and task_waits_on(task_state, adopted_attempt_id, latest_attempt_id, attempt_id)
    )


def next_mark(
    reading: ProgressMark, last: ProgressMark | None, throttle: ProgressThrottle
) -> ProgressMark | None:
    """The mark to write for `reading` given the attempt's `last` written one; None: nothing.

    `last` of another attempt counts as none (a new attempt starts its own bar)."""
    if reading.fraction is None and reading.queue_position is None:
        return None
    if last is None or last.attempt_id != reading.attempt_id:
        return reading
    if (reading.at - last.at).total_seconds() < throttle.min_interval_s:
        return None
    fraction_new = reading.fraction is not None and (
        last.fraction is None or reading.fraction - last.fraction >= throttle.min_step - _EPSILON
    )
    queue_new = reading.queue_position is not None and reading.queue_position != last.queue_position
    return reading if fraction_new or queue_new else None

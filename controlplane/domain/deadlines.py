"""Task and queue deadlines (design 9.16.4 ``task_deadline``; ``routing.max_queue_delay_ms``).

Both are absolute instants written on the task at CreateTask, so every replica and every later
decision reads the same bound:

* ``deadline_at``: the task's whole life. Past it no new attempt starts (no failover, no
  requeue, no retry); an attempt already at a provider is left to finish, because the provider
  already runs and bills it and its result is still worth delivering. Set from the platform's
  `max_task_age_s`.
* ``queue_deadline_at``: how long the task may wait for its *first* attempt. A task still queued
  past it with no attempt is FAILED with QUEUE_DEADLINE_EXCEEDED. The user's
  ``max_queue_delay_ms`` (0: the platform default) is capped by the platform's
  `max_queue_delay_s`, and both by ``deadline_at``. A task requeued after a failover has
  already started; only ``deadline_at`` bounds it from then on.

0 in a policy field means "no platform limit".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from vidroute_core.spec import GenerationSpec

__all__ = [
    "QUEUE_DEADLINE_EXCEEDED",
    "TASK_DEADLINE_EXCEEDED",
    "DeadlinePolicy",
    "deadlines_for",
]

QUEUE_DEADLINE_EXCEEDED = "QUEUE_DEADLINE_EXCEEDED"
TASK_DEADLINE_EXCEEDED = "TASK_DEADLINE_EXCEEDED"


@dataclass(frozen=True, slots=True)
class DeadlinePolicy:
    """Platform defaults; seconds, so one time-scale factor can multiply them."""

    max_task_age_s: float = 86_400.0  # a day: far beyond any provider's longest job
    max_queue_delay_s: float = 21_600.0  # six hours waiting for a first attempt

    def __post_init__(self) -> None:
        if self.max_task_age_s < 0 or self.max_queue_delay_s < 0:
            raise ValueError("deadline policy durations must not be negative")


def _min(*bounds: datetime | None) -> datetime | None:
    present = [b for b in bounds if b is not None]
    return min(present) if present else None


def deadlines_for(
    spec: GenerationSpec, policy: DeadlinePolicy, now: datetime
) -> tuple[datetime | None, datetime | None]:
    """``(queue_deadline_at, deadline_at)`` for a task created at `now`; None: unbounded."""
    deadline = now + timedelta(seconds=policy.max_task_age_s) if policy.max_task_age_s else None
    platform_queue = (
        now + timedelta(seconds=policy.max_queue_delay_s) if policy.max_queue_delay_s else None
    )
    asked_ms = spec.routing.max_queue_delay_ms
    asked = now + timedelta(milliseconds=asked_ms) if asked_ms > 0 else None
    return _min(asked, platform_queue, deadline), deadline

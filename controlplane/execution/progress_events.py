"""Provider progress into ``provider.progress`` task events (issue 13), inside the normalizer's
transaction, after the observation's own verdict was applied.

The rule is the domain's (`controlplane.domain.progress`); this is its I/O: the last mark
written for the task is read back from ``task_events`` (so every replica and a restarted control
plane throttle alike, with no table of their own), and a kept reading is appended as an event
WatchTask streams. The attempt and task rows are locked by the caller, so two observations of one
job never both pass the throttle against the same last mark. Nothing here moves a state.
"""

from __future__ import annotations

from controlplane.domain.progress import (
    PROGRESS_EVENT,
    ProgressMark,
    ProgressThrottle,
    next_mark,
    progress_applies,
)
from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import AttemptRecord, TaskRecord
from vidroute_core.adapter import JobSnapshot

__all__ = ["record_progress"]


async def record_progress(
    u: UnitOfWork,
    throttle: ProgressThrottle,
    attempt: AttemptRecord,
    task: TaskRecord,
    snap: JobSnapshot,
) -> ProgressMark | None:
    """Append the snapshot's progress as an event when the throttle keeps it; the mark or None.

    `attempt` and `task` are the rows after the observation was applied (both locked)."""
    if snap.progress is None and snap.queue_position is None:
        return None
    live = progress_applies(
        job_state=snap.state,
        attempt_id=attempt.id,
        attempt_state=attempt.state,
        task_state=task.state,
        adopted_attempt_id=task.adopted_attempt_id,
        latest_attempt_id=attempt.id,  # checked below, only for a reading the throttle keeps
    )
    if not live:
        return None
    reading = ProgressMark(attempt.id, snap.progress, snap.queue_position, u.now)
    stored = await u.last_task_event(task.id, PROGRESS_EVENT)
    last = ProgressMark.from_payload(stored.payload, stored.created_at) if stored else None
    mark = next_mark(reading, last, throttle)
    if mark is None:
        return None
    attempts = await u.attempts_of(task.id)
    if attempts and attempts[-1].id != attempt.id:
        return None  # the task has moved on to a newer attempt: its bar is not this one's
    await u.append_task_event(task.id, PROGRESS_EVENT, mark.payload(attempt.state))
    return mark

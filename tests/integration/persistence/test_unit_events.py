"""A unit of work writes its task events at its end (issue 22): numbered in the order they
happened whatever statement reserved the numbers, and none left behind by a rolled-back
savepoint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.errors import DuplicateRecord
from controlplane.persistence.models import generation_tasks, task_events
from tests.integration.persistence.builders import NOW, Scenario

LATER = NOW + timedelta(seconds=5)


async def _events(db: Database, task_id: int) -> list[tuple[int, str, str | None]]:
    async with db.reading() as conn:
        rows = await conn.execute(
            select(task_events.c.seq, task_events.c.kind, task_events.c.payload)
            .where(task_events.c.task_id == task_id)
            .order_by(task_events.c.seq)
        )
        return [(int(s), str(k), p.get("state")) for s, k, p in rows]


async def _last_seq(db: Database, task_id: int) -> int:
    async with db.reading() as conn:
        seq = await conn.scalar(
            select(generation_tasks.c.last_event_seq).where(generation_tasks.c.id == task_id)
        )
    assert seq is not None
    return int(seq)


async def test_events_are_numbered_in_the_order_they_happened(db: Database) -> None:
    """An attempt's moves before its task's move, and one after, keep their order and leave
    the task's counter at the last number."""
    scenario = Scenario(db)
    attempt = await scenario.attempt()
    before = await _last_seq(db, attempt.task_id)
    async with db.unit(LATER) as u:
        task = await u.task(attempt.task_id)
        assert task is not None
        submitting = await u.move_attempt(attempt, AttemptState.SUBMITTING, "submit started")
        assert submitting is not None
        accepted = await u.move_attempt(submitting, AttemptState.ACCEPTED, "accepted")
        assert accepted is not None
        assert await u.move_task(task, TaskState.RUNNING, "accepted") is not None
        assert await u.move_attempt(accepted, AttemptState.RUNNING, "running") is not None
    events = (await _events(db, attempt.task_id))[-4:]
    assert [e[0] for e in events] == list(range(before + 1, before + 5))
    assert [(k, s) for _, k, s in events] == [
        ("attempt.state_changed", "SUBMITTING"),
        ("attempt.state_changed", "ACCEPTED"),
        ("task.state_changed", "RUNNING"),
        ("attempt.state_changed", "RUNNING"),
    ]
    assert await _last_seq(db, attempt.task_id) == before + 4


async def test_a_rolled_back_create_attempt_leaves_no_event(db: Database) -> None:
    """`create_attempt` refused for a taken client request key writes no event, and the
    unit's other events still go in with the numbers that follow."""
    scenario = Scenario(db)
    account = await scenario.account()
    taken = await scenario.attempt(account)
    task = await scenario.scheduling_task()
    before = await _last_seq(db, task.id)
    async with db.unit(LATER) as u:
        with pytest.raises(DuplicateRecord):
            await u.create_attempt(
                task.id,
                task.status_version,
                scenario.new_attempt(account, taken.client_request_key),
                scenario.new_decision(),
            )
        assert await u.move_task(task, TaskState.QUEUED, "no capacity") is not None
    events = await _events(db, task.id)
    assert [(k, s) for _, k, s in events if _ > before] == [("task.state_changed", "QUEUED")]
    assert await _last_seq(db, task.id) == before + 1

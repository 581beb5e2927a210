"""A unit's kept writes and held rows (`persistence._deferred`, issue 22): the same rows and
events as each write sent when made, with fewer statements.

Every read sees the kept writes (they go out before it); a counter's increments and a value
set for it keep their order; held rows are read once and moves on them are kept and sent
set-based at the unit's end, leaving exactly what the moves sent one by one leave; a kept CAS
that does not win as computed rolls the unit back.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence import _deferred, transitions
from controlplane.persistence.database import Database
from controlplane.persistence.errors import ConcurrentModification
from controlplane.persistence.models import attempt_runtime, task_attempts, task_events
from controlplane.persistence.records import AttemptChanges, AttemptRecord, Failure
from controlplane.persistence.statement_tally import count_statements, labelled
from tests.integration.persistence.builders import NOW, Scenario

LATER = NOW + timedelta(seconds=5)


async def _runtime(db: Database, attempt_id: int) -> dict[str, Any]:
    async with db.reading() as conn:
        row = (
            (
                await conn.execute(
                    select(attempt_runtime).where(attempt_runtime.c.attempt_id == attempt_id)
                )
            )
            .mappings()
            .one()
        )
    return dict(row)


async def test_a_read_after_a_kept_write_sees_it(db: Database) -> None:
    """A runtime row written and then read in one unit reads as written (not held: read)."""
    attempt = await Scenario(db).attempt()
    due = LATER + timedelta(seconds=30)
    async with db.unit(LATER) as u:
        await u.set_runtime(attempt.id, attempt.task_id, next_poll_at=due, poll_phase="RUNNING")
        runtime = await u.runtime(attempt.id)
        assert runtime is not None
        assert (runtime.next_poll_at, runtime.poll_phase) == (due, "RUNNING")
    assert (await _runtime(db, attempt.id))["next_poll_at"] == due


async def test_increments_and_values_of_a_counter_keep_their_order(db: Database) -> None:
    """Two increments then a value: the value; a value then an increment: one more."""
    scenario = Scenario(db)
    first, second = await scenario.attempt(), await scenario.attempt()
    async with db.unit(LATER) as u:
        await u.bump_runtime(first.id, first.task_id, "submit_retries")
        await u.bump_runtime(first.id, first.task_id, "submit_retries")
        await u.set_runtime(first.id, first.task_id, submit_retries=0)
        await u.set_runtime(second.id, second.task_id, submit_retries=5)
        await u.bump_runtime(second.id, second.task_id, "submit_retries")
    assert (await _runtime(db, first.id))["submit_retries"] == 0
    assert (await _runtime(db, second.id))["submit_retries"] == 6


async def _moves(db: Database, attempt: AttemptRecord, *, hold: bool) -> None:
    """An attempt's submit, acceptance with a failure-free change, its task's move and a
    stale move that must lose, in one unit (holding the rows first, or not)."""
    async with db.unit(LATER) as u:
        if hold:
            await u.hold([attempt.id])
        task = await u.task(attempt.task_id)
        assert task is not None
        current = await u.attempt(attempt.id)
        assert current is not None
        submitting = await u.move_attempt(current, AttemptState.SUBMITTING, "submit started")
        assert submitting is not None
        accepted = await u.move_attempt(
            submitting,
            AttemptState.ACCEPTED,
            "accepted",
            AttemptChanges(actual_cost_micros=7, transport_error_stage="NONE"),
        )
        assert accepted is not None
        assert await u.move_attempt(current, AttemptState.SUBMITTING, "stale") is None
        running = await u.move_task(task, TaskState.RUNNING, "accepted")
        assert running is not None
        assert running.state is TaskState.RUNNING
        assert await u.move_task(task, TaskState.RUNNING, "stale") is None
        failed = await u.move_attempt(
            accepted,
            AttemptState.FAILED,
            "failed",
            AttemptChanges(failure=Failure("PROVIDER", "X", "boom")),
        )
        assert failed is not None
        assert (await u.attempts_of(task.id))[-1] == failed
        assert await u.attempt(attempt.id) == failed


async def _rows(db: Database, attempt: AttemptRecord) -> tuple[Any, ...]:
    async with db.reading() as conn:
        row = dict(
            (await conn.execute(select(task_attempts).where(task_attempts.c.id == attempt.id)))
            .mappings()
            .one()
        )
        events = (
            await conn.execute(
                select(task_events.c.seq, task_events.c.kind, task_events.c.payload)
                .where(task_events.c.task_id == attempt.task_id)
                .order_by(task_events.c.seq)
            )
        ).all()
    dropped = ("id", "task_id", "client_request_key", "route_decision_id", "provider_account_id")
    payloads = [
        (seq, kind, {k: v for k, v in p.items() if k not in ("attempt_id", "provider_account_id")})
        for seq, kind, p in events
    ]
    return {k: v for k, v in row.items() if k not in dropped}, payloads


async def test_moves_on_held_rows_leave_what_moves_sent_one_by_one_leave(db: Database) -> None:
    """The same moves (two of one attempt, a task's, two stale ones) with the rows held and
    without: the same attempt row and the same events, numbered alike; held, the reads and
    the moves send nothing until the unit's end."""
    scenario = Scenario(db)
    plain, held = await scenario.attempt(), await scenario.attempt()
    counted: Counter[str] = Counter()
    count_statements(db.engine, lambda stage, kind: counted.update([f"{stage}.{kind}"]))
    with labelled("plain"):
        await _moves(db, plain, hold=False)
    with labelled("held"):
        await _moves(db, held, hold=True)
    assert await _rows(db, held) == await _rows(db, plain)
    # Held, the reads cost the hold's two statements and no stale move sends anything.
    assert counted["held.statement"] < counted["plain.statement"], counted


async def test_a_kept_cas_that_does_not_win_rolls_the_unit_back(db: Database) -> None:
    """A kept attempt move whose row is not at the version it was computed from raises
    `ConcurrentModification` when sent, and nothing of the unit commits."""
    attempt = await Scenario(db).attempt()
    wrong = transitions.AttemptMove(
        attempt.id, attempt.state, attempt.status_version + 1, AttemptState.SUBMITTING, "x"
    )
    computed = _deferred.moved_attempt(attempt, AttemptState.SUBMITTING, None, LATER)

    async def unit() -> None:
        async with db.unit(LATER) as u:
            await u.set_runtime(attempt.id, attempt.task_id, poll_phase="RUNNING")
            u._writes.attempt_moves[attempt.id] = (wrong, computed)  # the seam under test

    with pytest.raises(ConcurrentModification):
        await unit()
    async with db.reading() as conn:
        state = await conn.scalar(
            select(task_attempts.c.status).where(task_attempts.c.id == attempt.id)
        )
        runtime = await conn.scalar(
            select(attempt_runtime.c.poll_phase).where(attempt_runtime.c.attempt_id == attempt.id)
        )
    assert state == attempt.state.value
    assert runtime is None

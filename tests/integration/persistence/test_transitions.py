"""State changes are the compare-and-set of design 9.8.1, and multi-row writes are atomic."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.domain.outbox import Topic
from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    TASK_MACHINE,
    AttemptState,
    StateMachine,
    TaskState,
)
from controlplane.persistence.database import Database
from controlplane.persistence.errors import ConcurrentModification, DuplicateRecord
from controlplane.persistence.models import outbox, route_decisions, task_attempts
from controlplane.persistence.records import AttemptChanges, Failure, NewOutboxMessage
from controlplane.persistence.tasks import TaskQueries
from tests.integration.persistence.builders import NOW, Scenario
from vidroute_core.exceptions import NotFound

LATER = NOW + timedelta(minutes=1)


def _path(machine: StateMachine[Any], start: Any, goal: Any) -> list[Any]:
    """The shortest chain of states after `start` that reaches `goal` in `machine`."""
    queue: deque[list[Any]] = deque([[start]])
    while queue:
        path = queue.popleft()
        if path[-1] == goal:
            return path[1:]
        for nxt in sorted(machine.transitions[path[-1]], key=lambda state: str(state.value)):
            if nxt not in path:
                queue.append([*path, nxt])
    raise AssertionError(f"{goal} unreachable from {start}")


async def _move_task(
    db: Database, task_id: int, version: int, target: TaskState, **kw: Any
) -> bool:
    """One task CAS at `version` in a unit of its own."""
    async with db.unit(LATER) as u:
        return await u.move_task_at(task_id, version, target, **kw)


async def _move_attempt(
    db: Database,
    attempt_id: int,
    version: int,
    target: AttemptState,
    changes: AttemptChanges | None = None,
) -> bool:
    """One attempt CAS from the stored state at `version` (stale when `version` is old)."""
    async with db.unit(LATER) as u:
        current = await u.attempt(attempt_id)
        assert current is not None
        stale_or_current = replace(current, status_version=version)
        return await u.move_attempt(stale_or_current, target, "", changes) is not None


async def _rows(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table)))  # type: ignore[arg-type]  # table is a Table typed object here


async def test_task_transition_applies_and_bumps_version(
    db: Database, tasks: TaskQueries, scenario: Scenario
) -> None:
    """An allowed change at the current version applies, bumps the version and logs an event."""
    task = await scenario.task()
    applied = await _move_task(
        db,
        task.id,
        0,
        TaskState.SCHEDULING,
        reason="picked",
        outbox=[NewOutboxMessage("task.scheduling", str(task.id))],
    )
    assert applied
    detail = await tasks.get_task(task.id)
    assert detail is not None
    assert (detail.task.state, detail.task.status_version) == (TaskState.SCHEDULING, 1)
    assert detail.task.updated_at == LATER
    events = await tasks.task_events(task.id)
    assert [(e.seq, e.kind, e.payload.get("reason")) for e in events] == [
        (1, "task.queued", None),
        (2, "task.state_changed", "picked"),
    ]
    async with db.unit(LATER) as u:
        assert await u.claim_messages("task.scheduling", "w", limit=5, lease_seconds=5)


async def test_stale_version_loses(db: Database, tasks: TaskQueries, scenario: Scenario) -> None:
    """A change carrying an outdated status_version does not apply and writes nothing."""
    task = await scenario.task()
    assert await _move_task(db, task.id, 0, TaskState.SCHEDULING)
    assert not await _move_task(db, task.id, 0, TaskState.CANCELLED)
    detail = await tasks.get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SCHEDULING
    assert len(await tasks.task_events(task.id)) == 2


async def test_disallowed_from_state_loses(
    db: Database, tasks: TaskQueries, scenario: Scenario
) -> None:
    """A change whose current state is not in allowed_from(target) does not apply."""
    task = await scenario.task()  # QUEUED
    assert TaskState.QUEUED not in TASK_MACHINE.allowed_from(TaskState.SUCCEEDED)
    assert not await _move_task(db, task.id, 0, TaskState.SUCCEEDED)
    assert not await _move_task(db, task.id, 0, TaskState.RUNNING)


@pytest.mark.parametrize("terminal", [s for s in TaskState if TASK_MACHINE.is_terminal(s)])
async def test_terminal_task_is_never_left(
    db: Database, tasks: TaskQueries, scenario: Scenario, terminal: TaskState
) -> None:
    """Once terminal, no target state applies, even at the exact current version."""
    task = await scenario.task()
    path = _path(TASK_MACHINE, TaskState.QUEUED, terminal)
    for version, step in enumerate(path):
        assert await _move_task(db, task.id, version, step)
    for target in TaskState:
        assert not await _move_task(db, task.id, len(path), target), target
    detail = await tasks.get_task(task.id)
    assert detail is not None
    assert (detail.task.state, detail.task.status_version) == (terminal, len(path))


async def test_failure_is_recorded_with_the_transition(
    db: Database, tasks: TaskQueries, scenario: Scenario
) -> None:
    """A failing transition stores the normalized failure on the task."""
    task = await scenario.task()
    failure = Failure("USER_INPUT", "PROMPT_TOO_LONG", "prompt exceeds 2000 characters")
    assert await _move_task(db, task.id, 0, TaskState.FAILED, failure=failure)
    detail = await tasks.get_task(task.id)
    assert detail is not None
    assert detail.task.failure == failure


async def test_cancel_queued_task(db: Database, tasks: TaskQueries, scenario: Scenario) -> None:
    """A QUEUED task is cancelled; a task past QUEUED is returned unchanged; unknown ids raise."""
    queued = await scenario.task()
    async with db.unit(LATER) as u:
        cancelled = await u.cancel_queued_task(queued.id, reason="user")
    assert (cancelled.state, cancelled.status_version) == (TaskState.CANCELLED, 1)
    scheduling = await scenario.scheduling_task()
    async with db.unit(LATER) as u:
        untouched = await u.cancel_queued_task(scheduling.id)
    assert untouched == scheduling
    with pytest.raises(NotFound):
        async with db.unit(LATER) as u:
            await u.cancel_queued_task(10_000)


async def test_attempt_with_decision_is_one_transaction(
    db: Database, tasks: TaskQueries, scenario: Scenario, engine: AsyncEngine
) -> None:
    """Attempt, decision, outbox and task SCHEDULING->SUBMITTING are written together."""
    attempt = await scenario.attempt()
    assert (attempt.attempt_no, attempt.state, attempt.status_version) == (
        1,
        AttemptState.READY_TO_SUBMIT,
        0,
    )
    detail = await tasks.get_task(attempt.task_id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    assert detail.route_decisions[0].decision_no == 1
    async with db.unit(LATER) as u:
        messages = await u.claim_messages(Topic.SUBMIT, "w", limit=5, lease_seconds=5)
    assert [(m.aggregate_id, m.payload["attempt_id"]) for m in messages] == [
        (str(attempt.id), attempt.id)
    ]
    kinds = [e.kind for e in await tasks.task_events(attempt.task_id)]
    assert kinds[-2:] == ["task.state_changed", "attempt.created"]


async def test_attempt_with_decision_rolls_back_when_task_cas_loses(
    db: Database, tasks: TaskQueries, scenario: Scenario, engine: AsyncEngine
) -> None:
    """If the task is not SCHEDULING at the expected version, nothing at all is written."""
    account = await scenario.account()
    task = await scenario.task()  # still QUEUED
    before = await _rows(engine, outbox)
    with pytest.raises(ConcurrentModification):
        async with db.unit(LATER) as u:
            await u.create_attempt(
                task.id, 0, scenario.new_attempt(account), scenario.new_decision()
            )
    assert await _rows(engine, task_attempts) == 0
    assert await _rows(engine, route_decisions) == 0
    assert await _rows(engine, outbox) == before


async def test_attempt_with_taken_client_request_key_rolls_back(
    db: Database, tasks: TaskQueries, scenario: Scenario, engine: AsyncEngine
) -> None:
    """A reused (account, client_request_key) raises DuplicateRecord; the task is untouched."""
    account = await scenario.account()
    first = await scenario.scheduling_task()
    async with db.unit(LATER) as u:
        await u.create_attempt(
            first.id, 1, scenario.new_attempt(account, "crk"), scenario.new_decision()
        )
    second = await scenario.scheduling_task()
    with pytest.raises(DuplicateRecord):
        async with db.unit(LATER) as u:
            await u.create_attempt(
                second.id, 1, scenario.new_attempt(account, "crk"), scenario.new_decision()
            )
    detail = await tasks.get_task(second.id)
    assert detail is not None
    assert (detail.task.state, detail.task.status_version) == (TaskState.SCHEDULING, 1)
    assert detail.attempts == ()
    assert detail.route_decisions == ()


async def test_attempt_transition_is_cas(
    db: Database, tasks: TaskQueries, scenario: Scenario
) -> None:
    """Attempt changes apply once at the right version and from an allowed state only."""
    attempt = await scenario.attempt()
    started = AttemptChanges(request_started_at=LATER, request_hash="req-hash")
    assert await _move_attempt(db, attempt.id, 0, AttemptState.SUBMITTING, started)
    assert not await _move_attempt(db, attempt.id, 0, AttemptState.ACCEPTED)
    assert AttemptState.SUBMITTING not in ATTEMPT_MACHINE.allowed_from(AttemptState.RESERVING)
    assert not await _move_attempt(db, attempt.id, 1, AttemptState.RESERVING)
    unknown = AttemptChanges(transport_error_stage="BODY_SENT_AWAITING_RESPONSE")
    assert await _move_attempt(db, attempt.id, 1, AttemptState.SUBMIT_UNKNOWN, unknown)
    stored = await tasks.get_attempt(attempt.id)
    assert stored is not None
    assert (stored.state, stored.status_version) == (AttemptState.SUBMIT_UNKNOWN, 2)
    assert (stored.request_hash, stored.request_started_at) == ("req-hash", LATER)
    assert stored.transport_error_stage == "BODY_SENT_AWAITING_RESPONSE"
    assert (stored.lease_token, stored.fencing_token) == ("lease-1", 7)


@pytest.mark.parametrize("terminal", [s for s in AttemptState if ATTEMPT_MACHINE.is_terminal(s)])
async def test_terminal_attempt_is_never_left(
    db: Database, tasks: TaskQueries, scenario: Scenario, terminal: AttemptState
) -> None:
    """A terminal attempt accepts no further change, however late the event arrives."""
    attempt = await scenario.attempt()
    path = _path(ATTEMPT_MACHINE, AttemptState.READY_TO_SUBMIT, terminal)
    for version, step in enumerate(path):
        assert await _move_attempt(db, attempt.id, version, step)
    for target in AttemptState:
        assert not await _move_attempt(db, attempt.id, len(path), target)
    stored = await tasks.get_attempt(attempt.id)
    assert stored is not None
    assert (stored.state, stored.status_version) == (terminal, len(path))

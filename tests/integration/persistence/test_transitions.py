"""State changes are the compare-and-set of design 9.8.1, and multi-row writes are atomic."""

from __future__ import annotations

from collections import deque
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    TASK_MACHINE,
    AttemptState,
    StateMachine,
    TaskState,
)
from controlplane.persistence.errors import ConcurrentModification, DuplicateRecord
from controlplane.persistence.models import outbox, route_decisions, task_attempts
from controlplane.persistence.records import AttemptChanges, Failure, NewOutboxMessage
from controlplane.persistence.repository import Store
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


async def _rows(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table)))  # type: ignore[arg-type]


async def test_task_transition_applies_and_bumps_version(store: Store, scenario: Scenario) -> None:
    """An allowed change at the current version applies, bumps the version and logs an event."""
    task = await scenario.task()
    applied = await store.transition_task(
        task.id,
        0,
        TaskState.SCHEDULING,
        now=LATER,
        reason="picked",
        outbox=[NewOutboxMessage("task.scheduling", str(task.id))],
    )
    assert applied
    detail = await store.get_task(task.id)
    assert detail is not None
    assert (detail.task.state, detail.task.status_version) == (TaskState.SCHEDULING, 1)
    assert detail.task.updated_at == LATER
    events = await store.task_events(task.id)
    assert [(e.seq, e.kind, e.payload.get("reason")) for e in events] == [
        (1, "task.queued", None),
        (2, "task.state_changed", "picked"),
    ]
    assert await store.claim("task.scheduling", "w", limit=5, lease_seconds=5, now=LATER)


async def test_stale_version_loses(store: Store, scenario: Scenario) -> None:
    """A change carrying an outdated status_version does not apply and writes nothing."""
    task = await scenario.task()
    assert await store.transition_task(task.id, 0, TaskState.SCHEDULING, now=LATER)
    assert not await store.transition_task(task.id, 0, TaskState.CANCELLED, now=LATER)
    detail = await store.get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SCHEDULING
    assert len(await store.task_events(task.id)) == 2


async def test_disallowed_from_state_loses(store: Store, scenario: Scenario) -> None:
    """A change whose current state is not in allowed_from(target) does not apply."""
    task = await scenario.task()  # QUEUED
    assert TaskState.QUEUED not in TASK_MACHINE.allowed_from(TaskState.SUCCEEDED)
    assert not await store.transition_task(task.id, 0, TaskState.SUCCEEDED, now=LATER)
    assert not await store.transition_task(task.id, 0, TaskState.RUNNING, now=LATER)


@pytest.mark.parametrize("terminal", [s for s in TaskState if TASK_MACHINE.is_terminal(s)])
async def test_terminal_task_is_never_left(
    store: Store, scenario: Scenario, terminal: TaskState
) -> None:
    """Once terminal, no target state applies, even at the exact current version."""
    task = await scenario.task()
    path = _path(TASK_MACHINE, TaskState.QUEUED, terminal)
    for version, step in enumerate(path):
        assert await store.transition_task(task.id, version, step, now=LATER)
    for target in TaskState:
        assert not await store.transition_task(task.id, len(path), target, now=LATER), target
    detail = await store.get_task(task.id)
    assert detail is not None
    assert (detail.task.state, detail.task.status_version) == (terminal, len(path))


async def test_failure_is_recorded_with_the_transition(store: Store, scenario: Scenario) -> None:
    """A failing transition stores the normalized failure on the task."""
    task = await scenario.task()
    failure = Failure("USER_INPUT", "PROMPT_TOO_LONG", "prompt exceeds 2000 characters")
    assert await store.transition_task(task.id, 0, TaskState.FAILED, now=LATER, failure=failure)
    detail = await store.get_task(task.id)
    assert detail is not None
    assert detail.task.failure == failure


async def test_cancel_queued_task(store: Store, scenario: Scenario) -> None:
    """A QUEUED task is cancelled; a task past QUEUED is returned unchanged; unknown ids raise."""
    queued = await scenario.task()
    cancelled = await store.cancel_queued_task(queued.id, now=LATER, reason="user")
    assert (cancelled.state, cancelled.status_version) == (TaskState.CANCELLED, 1)
    scheduling = await scenario.scheduling_task()
    untouched = await store.cancel_queued_task(scheduling.id, now=LATER)
    assert untouched == scheduling
    with pytest.raises(NotFound):
        await store.cancel_queued_task(10_000, now=LATER)


async def test_attempt_with_decision_is_one_transaction(
    store: Store, scenario: Scenario, engine: AsyncEngine
) -> None:
    """Attempt, decision, outbox and task SCHEDULING->SUBMITTING are written together."""
    attempt = await scenario.attempt()
    assert (attempt.attempt_no, attempt.state, attempt.status_version) == (
        1,
        AttemptState.READY_TO_SUBMIT,
        0,
    )
    detail = await store.get_task(attempt.task_id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    assert detail.route_decisions[0].decision_no == 1
    messages = await store.claim("attempt.submit", "w", limit=5, lease_seconds=5, now=LATER)
    assert [(m.aggregate_id, m.payload["attempt_id"]) for m in messages] == [
        (str(attempt.id), attempt.id)
    ]
    kinds = [e.kind for e in await store.task_events(attempt.task_id)]
    assert kinds[-2:] == ["task.state_changed", "attempt.created"]


async def test_attempt_with_decision_rolls_back_when_task_cas_loses(
    store: Store, scenario: Scenario, engine: AsyncEngine
) -> None:
    """If the task is not SCHEDULING at the expected version, nothing at all is written."""
    account = await scenario.account()
    task = await scenario.task()  # still QUEUED
    before = await _rows(engine, outbox)
    with pytest.raises(ConcurrentModification):
        await store.create_attempt_with_decision(
            task.id, 0, scenario.new_attempt(account), scenario.new_decision(), now=LATER
        )
    assert await _rows(engine, task_attempts) == 0
    assert await _rows(engine, route_decisions) == 0
    assert await _rows(engine, outbox) == before


async def test_attempt_with_taken_client_request_key_rolls_back(
    store: Store, scenario: Scenario, engine: AsyncEngine
) -> None:
    """A reused (account, client_request_key) raises DuplicateRecord; the task is untouched."""
    account = await scenario.account()
    first = await scenario.scheduling_task()
    await store.create_attempt_with_decision(
        first.id, 1, scenario.new_attempt(account, "crk"), scenario.new_decision(), now=LATER
    )
    second = await scenario.scheduling_task()
    with pytest.raises(DuplicateRecord):
        await store.create_attempt_with_decision(
            second.id, 1, scenario.new_attempt(account, "crk"), scenario.new_decision(), now=LATER
        )
    detail = await store.get_task(second.id)
    assert detail is not None
    assert (detail.task.state, detail.task.status_version) == (TaskState.SCHEDULING, 1)
    assert detail.attempts == ()
    assert detail.route_decisions == ()


async def test_attempt_transition_is_cas(store: Store, scenario: Scenario) -> None:
    """Attempt changes apply once at the right version and from an allowed state only."""
    attempt = await scenario.attempt()
    started = AttemptChanges(request_started_at=LATER, request_hash="req-hash")
    assert await store.transition_attempt(
        attempt.id, 0, AttemptState.SUBMITTING, now=LATER, changes=started
    )
    assert not await store.transition_attempt(attempt.id, 0, AttemptState.ACCEPTED, now=LATER)
    assert AttemptState.SUBMITTING not in ATTEMPT_MACHINE.allowed_from(AttemptState.RESERVING)
    assert not await store.transition_attempt(attempt.id, 1, AttemptState.RESERVING, now=LATER)
    unknown = AttemptChanges(transport_error_stage="BODY_SENT_AWAITING_RESPONSE")
    assert await store.transition_attempt(
        attempt.id, 1, AttemptState.SUBMIT_UNKNOWN, now=LATER, changes=unknown
    )
    stored = await store.get_attempt(attempt.id)
    assert stored is not None
    assert (stored.state, stored.status_version) == (AttemptState.SUBMIT_UNKNOWN, 2)
    assert (stored.request_hash, stored.request_started_at) == ("req-hash", LATER)
    assert stored.transport_error_stage == "BODY_SENT_AWAITING_RESPONSE"
    assert (stored.lease_token, stored.fencing_token) == ("lease-1", 7)


@pytest.mark.parametrize("terminal", [s for s in AttemptState if ATTEMPT_MACHINE.is_terminal(s)])
async def test_terminal_attempt_is_never_left(
    store: Store, scenario: Scenario, terminal: AttemptState
) -> None:
    """A terminal attempt accepts no further change, however late the event arrives."""
    attempt = await scenario.attempt()
    path = _path(ATTEMPT_MACHINE, AttemptState.READY_TO_SUBMIT, terminal)
    for version, step in enumerate(path):
        assert await store.transition_attempt(attempt.id, version, step, now=LATER)
    for target in AttemptState:
        assert not await store.transition_attempt(attempt.id, len(path), target, now=LATER)
    stored = await store.get_attempt(attempt.id)
    assert stored is not None
    assert (stored.state, stored.status_version) == (terminal, len(path))

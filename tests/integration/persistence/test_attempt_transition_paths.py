"""One attempt transition, single or bulk (issue 22): the same attempt moves written one at a
time (`move_attempt`) and as one batch per round (`move_attempts`) leave the same rows in every
table they touch, on PostgreSQL and on SQLite; and neither path writes an edge
`ATTEMPT_MACHINE` forbids.

Rows are compared as tests/integration/persistence/test_transition_paths.py compares the task
paths' (row ids and the ids inside payloads replaced by their position in the run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from controlplane.domain.states import ATTEMPT_MACHINE, AttemptState, IllegalTransition, TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.records import AttemptChanges, AttemptRecord, Failure
from controlplane.persistence.transitions import AttemptMove, TaskMove, TaskStep
from tests.integration.persistence.builders import NOW, Scenario, make_spec
from tests.integration.persistence.test_transition_paths import (
    HOOK,
    _rows,
    _same,
    _unit_facts,
)

A = AttemptState
LATER = NOW + timedelta(seconds=5)
UNKNOWN = Failure("SUBMISSION_UNKNOWN", "TIMEOUT", "no answer")


def _started(i: int) -> AttemptChanges:
    """The SUBMITTING CAS's columns; every other attempt under a new lease (differing per row,
    so the bulk path's UPDATE sets them per row)."""
    if i % 2:
        return AttemptChanges(
            request_started_at=LATER, lease_token=f"new-{i}", fencing_token=10 + i
        )
    return AttemptChanges(request_started_at=LATER)


# Each attempt's moves, one per round: (target, reason, changes of attempt i).
ROUNDS: list[list[tuple[AttemptState, str, AttemptChanges | None] | None]] = [
    [
        (A.SUBMITTING, "submit started", _started(0)),
        (A.SUBMITTING, "submit started", _started(1)),
        (A.SUBMITTING, "submit started", _started(2)),
        (A.CANCELLED, "task ended", None),
        (A.FAILED, "PROVEN_ABSENT", AttemptChanges(failure=Failure("X", "PROVEN_ABSENT", "m"))),
    ],
    [
        (
            A.SUBMIT_UNKNOWN,
            "submit outcome unknown at SEND_REQUEST",
            AttemptChanges(failure=UNKNOWN, transport_error_stage="SEND_REQUEST"),
        ),
        (A.ACCEPTED, "provider accepted the submit", None),
        (A.ACCEPTED, "provider accepted the submit", None),
        None,
        None,
    ],
    [
        None,
        (A.RUNNING, "polled", None),
        (A.ABANDONED, "job lost", AttemptChanges(failure=Failure("LOST", "NOT_FOUND", "gone"))),
        None,
        None,
    ],
]


async def _attempts(
    db: Database, scenario: Scenario, account: int, run: str, n: int
) -> list[AttemptRecord]:
    """`n` READY_TO_SUBMIT attempts, each of its own SUBMITTING task subscribed to every
    state change, created alike on `account`."""
    async with db.unit(NOW) as u:
        tasks = [
            (
                await u.create_task(
                    make_spec(), idempotency_key=f"{run}-{i}", spec_hash=f"{run}-{i}", webhook=HOOK
                )
            )[0]
            for i in range(n)
        ]
        step = (TaskStep(TaskState.SCHEDULING),)
        moves = [TaskMove(t.id, t.state, t.status_version, step) for t in tasks]
        assert await u.move_tasks(moves) == {t.id for t in tasks}
    out = []
    async with db.unit(NOW) as u:
        for i, t in enumerate(tasks):
            attempt, _ = await u.create_attempt(
                t.id, 1, scenario.new_attempt(account, f"{run}-{i}"), scenario.new_decision()
            )
            out.append(attempt)
    return out


def _moves(
    attempts: Sequence[AttemptRecord], round_: int
) -> list[tuple[AttemptRecord, AttemptState, str, AttemptChanges | None]]:
    return [
        (a, *step) for a, step in zip(attempts, ROUNDS[round_], strict=True) if step is not None
    ]


async def _current(db: Database, attempts: Sequence[AttemptRecord]) -> list[AttemptRecord]:
    async with db.unit(LATER) as u:
        found = [await u.attempt(a.id, lock=False) for a in attempts]
    assert all(a is not None for a in found)
    return [a for a in found if a is not None]


async def test_attempt_moves_write_the_same_rows_single_or_bulk(db: Database) -> None:
    """Rounds of attempt moves (same or differing columns per row, terminal or not, an
    ABANDONED ending, a task CAS after them in the same unit): one `move_attempt` per attempt
    and one `move_attempts` per round write the same attempts, task events, webhook messages
    and tasks, and leave the same wake-ups and endings."""
    scenario = Scenario(db)
    n = len(ROUNDS[0])
    account = await scenario.account()
    single = await _attempts(db, scenario, account, "single", n)
    bulk = await _attempts(db, scenario, account, "bulk", n)
    single_facts, bulk_facts = [], []
    for r in range(len(ROUNDS)):
        current = await _current(db, single)
        async with db.unit(LATER) as u:
            for a, target, reason, changes in _moves(current, r):
                assert await u.move_attempt(a, target, reason, changes) is not None
            task = await u.task(single[1].task_id)
            assert task is not None
            if r == 1:  # numbers the attempt events buffered before it
                assert await u.move_task(task, TaskState.RUNNING, "accepted") is not None
        single_facts.append(_unit_facts(u, [a.task_id for a in single]))

        current = await _current(db, bulk)
        async with db.unit(LATER) as u:
            moves = [AttemptMove.of(a, t, why, c) for a, t, why, c in _moves(current, r)]
            moved = await u.move_attempts(moves)
            assert set(moved) == {m.attempt_id for m in moves}
            assert [moved[m.attempt_id].state for m in moves] == [m.target for m in moves]
            task = await u.task(bulk[1].task_id)
            assert task is not None
            if r == 1:
                assert await u.move_task(task, TaskState.RUNNING, "accepted") is not None
        bulk_facts.append(_unit_facts(u, [a.task_id for a in bulk]))

    ones = await _rows(db, [a.task_id for a in single])
    many = await _rows(db, [a.task_id for a in bulk])
    assert [a["status"] for a in ones["attempts"]] == [
        "SUBMIT_UNKNOWN",
        "RUNNING",
        "ABANDONED",
        "CANCELLED",
        "FAILED",
    ]
    assert ones["attempts"][1]["lease_token"] == "new-1"
    assert ones["attempts"][0]["failure_code"] == "TIMEOUT"
    assert ones["webhooks"]
    _same(many, ones)
    assert bulk_facts == single_facts
    assert any(facts[1] for facts in single_facts)  # the ABANDONED attempt's ending


async def test_a_bulk_move_that_lost_its_cas_writes_nothing_for_that_attempt(
    db: Database,
) -> None:
    """An attempt moved since it was read (another version) is left alone, the others move:
    the single path's compare-and-set, row for row."""
    scenario = Scenario(db)
    fresh, stale = await _attempts(db, scenario, await scenario.account(), "cas", 2)
    async with db.unit(LATER) as u:
        assert await u.move_attempt(stale, A.SUBMITTING, "another worker") is not None
    async with db.unit(LATER) as u:
        moved = await u.move_attempts(
            [AttemptMove.of(a, A.CANCELLED, "task ended") for a in (fresh, stale)]
        )
    assert set(moved) == {fresh.id}
    after = await _current(db, [fresh, stale])
    assert [(a.state, a.status_version) for a in after] == [(A.CANCELLED, 1), (A.SUBMITTING, 1)]


# A legal way from READY_TO_SUBMIT into every attempt state (CREATED and RESERVING are seeded
# as the attempt's initial state): how the table test seeds its attempts.
REACH: dict[AttemptState, tuple[AttemptState, ...]] = {
    A.CREATED: (),
    A.RESERVING: (A.RESERVING,),
    A.READY_TO_SUBMIT: (),
    A.SUBMITTING: (A.SUBMITTING,),
    A.SUBMIT_UNKNOWN: (A.SUBMITTING, A.SUBMIT_UNKNOWN),
    A.ACCEPTED: (A.SUBMITTING, A.ACCEPTED),
    A.PROVIDER_QUEUED: (A.SUBMITTING, A.PROVIDER_QUEUED),
    A.PROVIDER_THROTTLED: (A.SUBMITTING, A.PROVIDER_THROTTLED),
    A.RUNNING: (A.SUBMITTING, A.RUNNING),
    A.SUCCEEDED: (A.SUBMITTING, A.SUCCEEDED),
    A.FAILED: (A.FAILED,),
    A.CANCEL_REQUESTED: (A.SUBMITTING, A.CANCEL_REQUESTED),
    A.CANCELLED: (A.CANCELLED,),
    A.ABANDONED: (A.SUBMITTING, A.ACCEPTED, A.ABANDONED),
}
PAIRS = [(s, t) for s in AttemptState for t in AttemptState]


async def _seeded(db: Database, states: Sequence[AttemptState]) -> list[AttemptRecord]:
    """An attempt in each of `states` (each of its own task), moved there along `REACH` in
    bulk moves, one per step."""
    scenario = Scenario(db)
    account = await scenario.account()
    async with db.unit(NOW) as u:
        tasks = [
            (await u.create_task(make_spec(), idempotency_key=f"t-{i}", spec_hash=f"t-{i}"))[0]
            for i in range(len(states))
        ]
        step = (TaskStep(TaskState.SCHEDULING),)
        await u.move_tasks([TaskMove(t.id, t.state, t.status_version, step) for t in tasks])
        attempts = []
        for i, (t, s) in enumerate(zip(tasks, states, strict=True)):
            start = A.CREATED if s in (A.CREATED, A.RESERVING) else A.READY_TO_SUBMIT
            new = replace(scenario.new_attempt(account, f"seed-{i}"), initial_state=start)
            attempt, _ = await u.create_attempt(t.id, 1, new, scenario.new_decision())
            attempts.append(attempt)
    for depth in range(max(len(p) for p in REACH.values())):
        current = await _current(db, attempts)
        async with db.unit(NOW) as u:
            await u.move_attempts(
                [
                    AttemptMove.of(a, REACH[s][depth])
                    for a, s in zip(current, states, strict=True)
                    if len(REACH[s]) > depth
                ]
            )
    seeded = await _current(db, attempts)
    assert [a.state for a in seeded] == list(states)
    return seeded


@pytest.mark.parametrize("path", ["move_attempt", "move_attempts"])
async def test_no_path_writes_an_edge_the_state_machine_forbids(db: Database, path: str) -> None:
    """From every attempt state to every attempt state, each path moves the attempt exactly
    when `ATTEMPT_MACHINE` lists the edge; otherwise the attempt row and its task's events
    stay as they were."""
    attempts = await _seeded(db, [s for s, _ in PAIRS])
    before = await _rows(db, [a.task_id for a in attempts])
    async with db.unit(LATER) as u:
        for attempt, (state, target) in zip(attempts, PAIRS, strict=True):
            if path == "move_attempt":
                moved = await u.move_attempt(attempt, target, "table test") is not None
            else:
                try:
                    found = await u.move_attempts([AttemptMove.of(attempt, target, "table test")])
                except IllegalTransition:
                    found = {}
                moved = attempt.id in found
            assert moved is ATTEMPT_MACHINE.can(state, target), (state, target)
    after = await _rows(db, [a.task_id for a in attempts])
    for i, (state, target) in enumerate(PAIRS):
        events = [e for e in after["events"] if e["task_id"] == f"task#{i}"]
        old = [e for e in before["events"] if e["task_id"] == f"task#{i}"]
        if ATTEMPT_MACHINE.can(state, target):
            assert after["attempts"][i]["status"] == target.value
            assert events[:-1] == old
            assert (events[-1]["kind"], events[-1]["payload"]["state"]) == (
                "attempt.state_changed",
                target.value,
            )
        else:
            assert after["attempts"][i] == before["attempts"][i], (state, target)
            assert events == old


async def test_a_batch_with_one_forbidden_move_writes_nothing(db: Database) -> None:
    """Every move of a batch is asked of `ATTEMPT_MACHINE` before any write: one forbidden
    move among allowed ones raises `IllegalTransition` and no attempt of the batch moves."""
    ready, done = await _seeded(db, [A.READY_TO_SUBMIT, A.CANCELLED])
    before = await _rows(db, [ready.task_id, done.task_id])
    async with db.unit(LATER) as u:
        with pytest.raises(IllegalTransition):
            await u.move_attempts(
                [AttemptMove.of(ready, A.SUBMITTING), AttemptMove.of(done, A.SUBMITTING)]
            )
    assert await _rows(db, [ready.task_id, done.task_id]) == before

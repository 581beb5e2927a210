"""One transition, single or bulk (issue 22): the same task moves written through the single path
(`move_task`, `create_attempt`) and through the bulk one (`move_tasks`, `write_selected`) leave
the same rows in every table they touch, on PostgreSQL and on SQLite; and no path writes an edge
`TASK_MACHINE` forbids.

Rows are compared whole, with only what legitimately differs between two tasks replaced by the
task's position in its run: row ids, task / attempt / decision ids inside payloads and webhook
bodies, idempotency and client request keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.domain.states import TASK_MACHINE, IllegalTransition, TaskState
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.persistence.batch import Numbers, SelectedTask
from controlplane.persistence.database import Database
from controlplane.persistence.models import (
    credit_ledger,
    generation_tasks,
    outbox,
    route_decisions,
    task_attempts,
    task_events,
    webhook_messages,
)
from controlplane.persistence.records import Failure, TaskEnd, TaskRecord
from controlplane.persistence.transitions import TaskMove, TaskStep
from controlplane.persistence.unit import SqlUnitOfWork
from tests.integration.persistence.builders import NOW, Scenario, make_spec

T = TaskState
HOOK = WebhookSubscription("https://hooks.example.com/in", ("task.state_changed",))
LATER = NOW + timedelta(seconds=5)
SUBMIT_BODY = {"deadline_s": 30, "trace": "t-1"}
# Ids that differ between two runs of the same moves (rows' own ids are dropped).
ID_KEYS = frozenset({"task_id", "attempt_id", "route_decision_id", "aggregate_id"})
DROPPED = frozenset({"id", "idempotency_key", "spec_hash", "normalized_spec_hash"})


async def _tasks(db: Database, run: str, n: int) -> list[TaskRecord]:
    """`n` QUEUED tasks subscribed to every state change, created alike."""
    out = []
    async with db.unit(NOW) as u:
        for i in range(n):
            record, _ = await u.create_task(
                make_spec(),
                idempotency_key=f"{run}-{i}",
                spec_hash=f"{run}-{i}",
                webhook=HOOK,
            )
            out.append(record)
    return out


class _Ids:
    """Each id seen, by table, replaced by its position in the run (first seen, first)."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[int, int]] = {}

    def of(self, kind: str, value: Any) -> str:
        numbers = self._seen.setdefault(kind, {})
        return f"{kind}#{numbers.setdefault(int(value), len(numbers))}"


def _normal(value: Any, ids: _Ids, key: str = "") -> Any:
    if isinstance(value, Mapping):
        return {k: _normal(v, ids, k) for k, v in value.items() if k not in DROPPED}
    if isinstance(value, list):
        return [_normal(v, ids) for v in value]
    if key in ID_KEYS and value is not None:
        return ids.of(key.removesuffix("_id") if key != "aggregate_id" else "attempt", value)
    if key == "client_request_key":
        return str(value).split("-", 1)[1]
    if key == "body":
        return _normal(json.loads(value), ids)
    return value


async def _rows(db: Database, task_ids: Sequence[int]) -> dict[str, list[Any]]:
    """Every row the moves of `task_ids` wrote or changed, normalised (module docstring)."""
    ids = _Ids()
    for t in task_ids:
        ids.of("task", t)  # tasks are numbered in the order the run made them
    tables = {
        "tasks": (generation_tasks, generation_tasks.c.id, (generation_tasks.c.id,)),
        "decisions": (route_decisions, route_decisions.c.task_id, (route_decisions.c.id,)),
        "attempts": (task_attempts, task_attempts.c.task_id, (task_attempts.c.id,)),
        "events": (task_events, task_events.c.task_id, (task_events.c.task_id, task_events.c.seq)),
        "webhooks": (
            webhook_messages,
            webhook_messages.c.task_id,
            (webhook_messages.c.task_id, webhook_messages.c.event_seq),
        ),
        "ledger": (credit_ledger, credit_ledger.c.task_id, (credit_ledger.c.id,)),
    }
    out: dict[str, list[Any]] = {}
    async with db.reading() as conn:
        for name, (table, owner, order) in tables.items():
            rows = await conn.execute(select(table).where(owner.in_(task_ids)).order_by(*order))
            out[name] = [dict(r) for r in rows.mappings()]
        # Outbox rows name their task in the payload only: this run's are those of its tasks.
        rows = await conn.execute(select(outbox).order_by(outbox.c.id))
        out["outbox"] = [
            dict(r)
            for r in rows.mappings()
            if isinstance(r["payload"], Mapping) and r["payload"].get("task_id") in task_ids
        ]
    # Attempts and decisions are numbered before they are referenced from other tables.
    for a in out["decisions"]:
        ids.of("route_decision", a["id"])
    for a in out["attempts"]:
        ids.of("attempt", a["id"])
    return {name: [_normal(r, ids) for r in rows] for name, rows in out.items()}


def _same(many: dict[str, list[Any]], ones: dict[str, list[Any]]) -> None:
    """Every table equal; on a difference, the table, the row and the columns that differ."""
    for table, rows in ones.items():
        assert len(many[table]) == len(rows), table
        for i, (got, want) in enumerate(zip(many[table], rows, strict=True)):
            diff = {
                k: (got.get(k), want.get(k)) for k in {*got, *want} if got.get(k) != want.get(k)
            }
            assert diff == {}, (table, i)


def _unit_facts(u: SqlUnitOfWork, task_ids: Sequence[int]) -> tuple[set[str], list[Any]]:
    """What a unit left for after its commit (read once it ended: its task events, and so its
    webhook wake-up, are written at its end): the topics to wake, the endings to log."""
    order = {t: i for i, t in enumerate(task_ids)}
    endings = [(order[e.task_id], e.state, e.reason) for e in u.endings]
    return set(u.topics), endings


async def test_a_dispatch_writes_the_same_rows_single_or_bulk(db: Database) -> None:
    """QUEUED -> SCHEDULING -> SUBMITTING with a decision, an attempt and its submit message:
    `move_task` + `create_attempt` per task and one `write_selected` for all write the same
    tasks, events, webhook messages, decisions, attempts and outbox rows."""
    scenario = Scenario(db)
    account = await scenario.account()
    decision = scenario.new_decision()

    single = await _tasks(db, "single", 3)
    async with db.unit(LATER) as u:
        for i, task in enumerate(single):
            scheduling = await u.move_task(task, T.SCHEDULING, "dispatch")
            assert scheduling is not None
            await u.create_attempt(
                task.id,
                scheduling.status_version,
                scenario.new_attempt(account, f"single-{i}"),
                decision,
                outbox_payload=SUBMIT_BODY,
            )
    single_facts = _unit_facts(u, [t.id for t in single])

    bulk = await _tasks(db, "bulk", 3)
    async with db.unit(LATER) as u:
        claimed = await u.claim_queued({t.id: t.status_version for t in bulk})
        assert claimed == {t.id for t in bulk}
        written = await u.write_selected(
            [
                SelectedTask(
                    t.id,
                    t.status_version,
                    Numbers(),
                    scenario.new_attempt(account, f"bulk-{i}"),
                    decision,
                    SUBMIT_BODY,
                )
                for i, t in enumerate(bulk)
            ]
        )
        assert set(written) == {t.id for t in bulk}
    bulk_facts = _unit_facts(u, [t.id for t in bulk])

    ones = await _rows(db, [t.id for t in single])
    many = await _rows(db, [t.id for t in bulk])
    kinds = [(e["kind"], e["payload"].get("state")) for e in ones["events"][1:4]]
    assert kinds == [
        ("task.state_changed", "SCHEDULING"),
        ("task.state_changed", "SUBMITTING"),
        ("attempt.created", "READY_TO_SUBMIT"),
    ]
    assert ones["webhooks"]
    assert ones["outbox"]
    assert ones["attempts"]
    assert ones["decisions"]
    _same(many, ones)
    assert bulk_facts == single_facts


MOVES: list[tuple[TaskStep, ...]] = [
    (TaskStep(T.CANCELLED, "caller cancelled"),),
    (TaskStep(T.SCHEDULING, "dispatch"), TaskStep(T.QUEUED, "no capacity")),
    (TaskStep(T.FAILED, "queue deadline"),),
    (TaskStep(T.SCHEDULING, "dispatch"), TaskStep(T.SUBMITTING), TaskStep(T.RUNNING, "accepted")),
]


async def test_state_changes_write_the_same_rows_single_or_bulk(db: Database) -> None:
    """Moves with one or several steps, terminal or not: one `move_task` per step per task and
    one `move_tasks` for all write the same tasks, events, webhook messages and settlements,
    and leave the same wake-ups and endings."""
    single = await _tasks(db, "single", len(MOVES))
    async with db.unit(LATER) as u:
        for task, steps in zip(single, MOVES, strict=True):
            record: TaskRecord | None = task
            for step in steps:
                assert record is not None
                record = await u.move_task(record, step.target, step.reason)
            assert record is not None
    single_facts = _unit_facts(u, [t.id for t in single])

    bulk = await _tasks(db, "bulk", len(MOVES))
    async with db.unit(LATER) as u:
        moved = await u.move_tasks(
            [
                TaskMove(t.id, t.state, t.status_version, steps)
                for t, steps in zip(bulk, MOVES, strict=True)
            ]
        )
        assert moved == {t.id for t in bulk}
    bulk_facts = _unit_facts(u, [t.id for t in bulk])

    ones = await _rows(db, [t.id for t in single])
    many = await _rows(db, [t.id for t in bulk])
    assert [t["status"] for t in ones["tasks"]] == ["CANCELLED", "QUEUED", "FAILED", "RUNNING"]
    _same(many, ones)
    assert bulk_facts == single_facts


# Terminal moves as the output step makes them: (state reached first, the end, its columns).
ENDS: list[tuple[tuple[TaskState, ...], TaskState, str, Failure | None, dict[str, Any] | None]] = [
    (
        (T.SCHEDULING, T.SUBMITTING, T.RUNNING, T.OUTPUT_FETCHING),
        T.SUCCEEDED,
        "output stored",
        None,
        {"uri": "s3://bucket/out.mp4", "sha256": "ab" * 32, "size_bytes": 1234},
    ),
    (
        (T.SCHEDULING, T.SUBMITTING, T.RUNNING),
        T.FAILED,
        "provider refused",
        Failure("CONTENT_POLICY", "SAFETY", "blocked by the provider"),
        None,
    ),
    ((), T.CANCELLED, "caller cancelled", None, None),
    ((T.SCHEDULING,), T.QUEUED, "not terminal: refused before any write", None, None),
]


async def _reached(db: Database, run: str) -> list[TaskRecord]:
    """A task per `ENDS` row, moved along its first steps (one bulk move, then read back)."""
    tasks = await _tasks(db, run, len(ENDS))
    async with db.unit(NOW) as u:
        moves = [
            TaskMove(t.id, t.state, t.status_version, tuple(TaskStep(x) for x in way))
            for t, (way, *_) in zip(tasks, ENDS, strict=True)
            if way
        ]
        await u.move_tasks(moves)
    out = []
    async with db.unit(NOW) as u:
        for t in tasks:
            record = await u.task(t.id, lock=True)
            assert record is not None
            out.append(record)
    return out


async def test_terminal_moves_write_the_same_rows_one_by_one_or_ended_together(
    db: Database,
) -> None:
    """A delivery, a failure and a cancellation, with their failure and output columns: one
    `move_task` per task and one `end_tasks` for all write the same tasks, events, webhook
    messages and settlements and leave the same wake-ups and endings; `end_tasks` refuses a
    move into a state that is not terminal before writing anything."""
    terminal = [row for row in ENDS if TASK_MACHINE.is_terminal(row[1])]
    single = await _reached(db, "end-single")
    async with db.unit(LATER) as u:
        for task, (_, target, reason, failure, asset) in zip(single, terminal, strict=False):
            moved = await u.move_task(task, target, reason, failure=failure, output_asset=asset)
            assert moved is not None
    single_facts = _unit_facts(u, [t.id for t in single])

    bulk = await _reached(db, "end-bulk")
    ends = [
        TaskEnd(task, target, reason, failure, asset)
        for task, (_, target, reason, failure, asset) in zip(bulk, ENDS, strict=True)
    ]
    with pytest.raises(ValueError, match="not a terminal task state"):
        async with db.unit(LATER) as u:
            await u.end_tasks(ends)
    async with db.unit(LATER) as u:
        moved_many = await u.end_tasks(ends[: len(terminal)])
        assert set(moved_many) == {t.id for t in bulk[: len(terminal)]}
        assert [moved_many[t.id].state for t in bulk[: len(terminal)]] == [
            row[1] for row in terminal
        ]
    bulk_facts = _unit_facts(u, [t.id for t in bulk])

    ones = await _rows(db, [t.id for t in single])
    many = await _rows(db, [t.id for t in bulk])
    assert [t["status"] for t in ones["tasks"]] == [
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "SCHEDULING",
    ]
    assert ones["tasks"][0]["output_asset"]
    assert ones["tasks"][1]["failure_code"] == "SAFETY"
    assert ones["webhooks"]
    _same(many, ones)
    assert bulk_facts == single_facts


async def test_a_bulk_move_that_lost_its_cas_writes_nothing_for_that_task(db: Database) -> None:
    """A task moved since it was read (another version) is left alone, the others move: the
    single path's compare-and-set, row for row."""
    fresh, stale = await _tasks(db, "cas", 2)
    async with db.unit(LATER) as u:
        assert await u.move_task(stale, T.SCHEDULING, "another dispatcher") is not None
    step = (TaskStep(T.CANCELLED, "caller cancelled"),)
    async with db.unit(LATER) as u:
        moved = await u.move_tasks(
            [TaskMove(t.id, T.QUEUED, t.status_version, step) for t in (fresh, stale)]
        )
    assert moved == {fresh.id}
    rows = await _rows(db, [stale.id])
    assert [(t["status"], t["status_version"]) for t in rows["tasks"]] == [("SCHEDULING", 1)]


# A legal way from QUEUED into every task state: how the table test seeds its tasks.
REACH: dict[TaskState, tuple[TaskState, ...]] = {
    T.QUEUED: (),
    T.SCHEDULING: (T.SCHEDULING,),
    T.SUBMITTING: (T.SCHEDULING, T.SUBMITTING),
    T.RUNNING: (T.SCHEDULING, T.SUBMITTING, T.RUNNING),
    T.OUTPUT_FETCHING: (T.SCHEDULING, T.SUBMITTING, T.RUNNING, T.OUTPUT_FETCHING),
    T.SUCCEEDED: (T.SCHEDULING, T.SUBMITTING, T.RUNNING, T.OUTPUT_FETCHING, T.SUCCEEDED),
    T.FAILED: (T.FAILED,),
    T.CANCELLED: (T.CANCELLED,),
}
PAIRS = [(s, t) for s in TaskState for t in TaskState]
PATHS = ("move_task", "move_task_at", "move_tasks")


async def _seeded(db: Database, states: Sequence[TaskState]) -> list[TaskRecord]:
    """A task in each of `states`, moved there along `REACH` in one bulk move."""
    tasks = await _tasks(db, f"seed-{len(states)}", len(states))
    async with db.unit(NOW) as u:
        moves = [
            TaskMove(t.id, t.state, t.status_version, tuple(TaskStep(x) for x in REACH[s]))
            for t, s in zip(tasks, states, strict=True)
            if REACH[s]
        ]
        assert await u.move_tasks(moves) == {m.task_id for m in moves}
    out = []
    for t, s in zip(tasks, states, strict=True):
        async with db.unit(NOW) as u:
            record = await u.task(t.id, lock=False)
        assert record is not None
        assert record.state is s
        out.append(record)
    return out


async def _try(db: Database, path: str, task: TaskRecord, target: TaskState) -> bool:
    """Move `task` to `target` through `path`; whether that path reported a move."""
    async with db.unit(LATER) as u:
        if path == "move_task":
            return await u.move_task(task, target, "table test") is not None
        if path == "move_task_at":
            return await u.move_task_at(task.id, task.status_version, target, "table test")
        step = (TaskStep(target, "table test"),)
        try:
            moved = await u.move_tasks([TaskMove(task.id, task.state, task.status_version, step)])
        except IllegalTransition:
            return False
        return moved == {task.id}


@pytest.mark.parametrize("path", PATHS)
async def test_no_path_writes_an_edge_the_state_machine_forbids(db: Database, path: str) -> None:
    """From every task state to every task state, each path moves the task exactly when
    `TASK_MACHINE` lists the edge; otherwise the task row and its events stay as they were."""
    tasks = await _seeded(db, [s for s, _ in PAIRS])
    before = await _rows(db, [t.id for t in tasks])
    for task, (state, target) in zip(tasks, PAIRS, strict=True):
        assert await _try(db, path, task, target) is TASK_MACHINE.can(state, target), (
            state,
            target,
        )
    after = await _rows(db, [t.id for t in tasks])
    for i, (state, target) in enumerate(PAIRS):
        events = [e for e in after["events"] if e["task_id"] == f"task#{i}"]
        old = [e for e in before["events"] if e["task_id"] == f"task#{i}"]
        if TASK_MACHINE.can(state, target):
            assert after["tasks"][i]["status"] == target.value
            assert events[:-1] == old
            assert events[-1]["payload"]["state"] == target.value
        else:
            assert after["tasks"][i] == before["tasks"][i], (state, target)
            assert events == old

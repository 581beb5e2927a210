"""Task state changes in bulk: the set-based form of `SqlUnitOfWork._move_task` (issue 22).

A `TaskMove` names a task, the state and ``status_version`` its writer read, and the steps to
take from there (QUEUED -> SCHEDULING -> SUBMITTING is two). `cas_many` asks the domain's
`TASK_MACHINE` for every edge of every move (a forbidden one raises `IllegalTransition` before
anything is written), then applies the moves as the compare-and-set of design 9.8.1, one UPDATE
per (from state, final state, number of steps)::

    UPDATE generation_tasks SET status = :final, status_version = status_version + :n,
           last_event_seq = last_event_seq + :n + :extra
     WHERE (id, status_version) IN (...) AND status = :from RETURNING id, last_event_seq

A row whose version or state moved since it was read is not written (its CAS lost), exactly as
the single path's. Each step gets its ``task.state_changed`` event, with the payload the single
path writes (`_sql.state_payload`), numbered from the task's ``last_event_seq``; `extra`
numbers are reserved after them for the caller's own events (a dispatch's
``attempt.created``). `insert_events` writes the events and their caller-webhook messages in
one statement each, whatever the number of tasks.

`TaskCas` and `cas_tasks` are the set-based form of the single path's one-step CAS
(`_sql.cas_task`) for a unit that numbers the moves' events itself (a unit's deferred moves,
`_deferred`; the terminal moves of `end_tasks` with `cas_task_rows`): one UPDATE per (from
state, to state), the optional columns of each row (`_sql.task_extra`) by ``CASE id WHEN ...``,
``last_event_seq`` left to the unit.

`AttemptMove` and `cas_attempts` are the same for attempts (the set-based form of
`SqlUnitOfWork.move_attempt`, which is its batch of one): every move asked of `ATTEMPT_MACHINE`
before any write, then one UPDATE per (from state, to state) with the version CAS, the columns
a move sets alongside its state (`AttemptChanges`) given per row by ``CASE id WHEN ...`` where
the moves of a group differ. The unit adds each moved attempt's ``attempt.state_changed`` event
in the callers' order, so the events are numbered as the single path numbers them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, case, literal, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from controlplane.domain.states import ATTEMPT_MACHINE, TASK_MACHINE, AttemptState, TaskState
from controlplane.persistence import _bulk, _rows, _sql, webhooks
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.models import task_events as E
from controlplane.persistence.records import AttemptChanges, AttemptRecord, TaskRecord

__all__ = [
    "AttemptMove",
    "Moved",
    "TaskCas",
    "TaskMove",
    "TaskStep",
    "cas_attempts",
    "cas_many",
    "cas_task_rows",
    "cas_tasks",
    "insert_events",
    "planned",
]


@dataclass(frozen=True, slots=True)
class TaskStep:
    """One edge of a move: the state entered and why (the event's ``reason``; empty: none)."""

    target: TaskState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TaskMove:
    """Move `task_id` from `state` at `expected_version` through `steps`, in order."""

    task_id: int
    state: TaskState
    expected_version: int
    steps: tuple[TaskStep, ...]

    @property
    def final(self) -> TaskState:
        return self.steps[-1].target if self.steps else self.state


@dataclass(frozen=True, slots=True)
class Moved:
    """A move whose CAS won: its last reserved event number and its state events (rows for
    ``task_events``, not yet inserted)."""

    task_id: int
    last_seq: int
    events: list[dict[str, Any]]


def planned(move: TaskMove) -> list[tuple[TaskState, int, dict[str, Any]]]:
    """Each step's (state, version, event payload); `IllegalTransition` if `TASK_MACHINE`
    forbids any edge of the move (or it has no step)."""
    if not move.steps:
        raise ValueError(f"task {move.task_id}: a move needs at least one step")
    out = []
    state, version = move.state, move.expected_version
    for step in move.steps:
        TASK_MACHINE.check(state, step.target)
        state, version = step.target, version + 1
        out.append((state, version, _sql.state_payload(state, version, step.reason)))
    return out


async def cas_many(
    conn: AsyncConnection,
    moves: Sequence[TaskMove],
    now: datetime,
    *,
    extra_events: int = 0,
) -> dict[int, Moved]:
    """Apply `moves` (see module); task id -> `Moved` for those whose CAS won."""
    plans = {m.task_id: planned(m) for m in moves}  # every edge asked before any write
    if len(plans) != len(moves):
        raise ValueError("a task may be moved once per call")
    groups: dict[tuple[TaskState, TaskState, int], list[TaskMove]] = defaultdict(list)
    for m in moves:
        groups[m.state, m.final, len(m.steps)].append(m)
    moved: dict[int, Moved] = {}
    for (state, final, n), members in groups.items():
        rows = await conn.execute(
            update(T)
            .where(_still_at(T, state, ((m.task_id, m.expected_version) for m in members)))
            .values(
                status=final.value,
                status_version=T.c.status_version + n,
                last_event_seq=T.c.last_event_seq + n + extra_events,
                updated_at=now,
            )
            .returning(T.c.id, T.c.last_event_seq)
        )
        for task_id, last in rows:
            first = int(last) - n - extra_events + 1
            events = [
                {
                    "task_id": int(task_id),
                    "seq": first + i,
                    "kind": "task.state_changed",
                    "payload": payload,
                    "created_at": now,
                }
                for i, (_, _, payload) in enumerate(plans[int(task_id)])
            ]
            moved[int(task_id)] = Moved(int(task_id), int(last), events)
    return moved


async def insert_events(
    conn: AsyncConnection,
    events: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    outputs: Mapping[tuple[int, int], Sequence[Mapping[str, Any]]] | None = None,
) -> bool:
    """Insert ``task_events`` rows and their caller-webhook messages (subscribed tasks only;
    `outputs` by (task id, seq) go into their event's message): ONE statement on PostgreSQL
    (the events a data-modifying CTE of the messages' INSERT), two on SQLite. True when a
    message may have been written (the delivery worker's wake-up hint)."""
    rows = list(events)
    if not rows:
        return False
    if conn.dialect.name != "postgresql":
        await _bulk.insert_rows(conn, E, rows)
        return await webhooks.enqueue_many(conn, rows, now, outputs=outputs) > 0
    statement = _bulk.unnest_insert(E, tuple(rows[0]))
    params = _bulk.unnest_params(E, rows)
    announced = await webhooks.enqueue_many(
        conn, rows, now, outputs=outputs, with_events=(statement, params)
    )
    if not announced:  # no message statement ran, so the events go alone
        await conn.execute(statement, params)
    return announced > 0


@dataclass(frozen=True, slots=True)
class AttemptMove:
    """Move `attempt_id` from `state` at `expected_version` to `target`, setting `changes`'
    columns with it (None fields are left as they are); `reason` goes into its event."""

    attempt_id: int
    state: AttemptState
    expected_version: int
    target: AttemptState
    reason: str = ""
    changes: AttemptChanges | None = None

    @classmethod
    def of(
        cls,
        record: AttemptRecord,
        target: AttemptState,
        reason: str = "",
        changes: AttemptChanges | None = None,
    ) -> AttemptMove:
        """The move of `record` as its writer read it (state and version)."""
        return cls(record.id, record.state, record.status_version, target, reason, changes)


async def cas_attempts(
    conn: AsyncConnection, moves: Sequence[AttemptMove], now: datetime
) -> dict[int, AttemptRecord]:
    """Apply `moves` (see module); attempt id -> the moved row, for those whose CAS won.
    `IllegalTransition` (nothing written) if `ATTEMPT_MACHINE` forbids any of them."""
    for m in moves:  # every edge asked before any write
        ATTEMPT_MACHINE.check(m.state, m.target)
    steps = [
        (m.attempt_id, m.state, m.expected_version, m.target, _sql.attempt_extra(m.changes))
        for m in moves
    ]
    records = [_rows.attempt(row) for row in await _cas_steps(conn, A, steps, now, (A,))]
    return {record.id: record for record in records}


@dataclass(frozen=True, slots=True)
class TaskCas:
    """Move `task_id` from `state` at `expected_version` one step to `target`, setting the
    `extra` columns (`_sql.task_extra`) with it."""

    task_id: int
    state: TaskState
    expected_version: int
    target: TaskState
    extra: Mapping[str, Any]


async def cas_tasks(
    conn: AsyncConnection, moves: Sequence[TaskCas], now: datetime
) -> dict[int, int]:
    """Apply `moves` (see module): task id -> its new ``status_version``, for those whose CAS
    won. `IllegalTransition` (nothing written) if `TASK_MACHINE` forbids any of them."""
    rows = await _cas_steps(conn, T, _task_steps(moves), now, (T.c.id, T.c.status_version))
    return {int(row["id"]): int(row["status_version"]) for row in rows}


async def cas_task_rows(
    conn: AsyncConnection, moves: Sequence[TaskCas], now: datetime
) -> dict[int, TaskRecord]:
    """`cas_tasks` answering with the moved rows themselves (the single path's RETURNING), for
    a caller that needs more of them than the version (`SqlUnitOfWork.end_tasks`)."""
    records = [_rows.task(row) for row in await _cas_steps(conn, T, _task_steps(moves), now, (T,))]
    return {record.id: record for record in records}


Step = tuple[int, Any, int, Any, Mapping[str, Any]]


def _task_steps(moves: Sequence[TaskCas]) -> list[Step]:
    """The `_cas_steps` of task moves, every edge asked of `TASK_MACHINE` first (before any
    write: `IllegalTransition`)."""
    for m in moves:
        TASK_MACHINE.check(m.state, m.target)
    return [(m.task_id, m.state, m.expected_version, m.target, m.extra) for m in moves]


async def _cas_steps(
    conn: AsyncConnection,
    table: Table,
    steps: Sequence[Step],
    now: datetime,
    returning: Sequence[Any],
) -> list[Any]:
    """One step of each row, (id, from state, version, to state, optional columns), tasks or
    attempts alike: one UPDATE per (from, to) with the version CAS (`_still_at`), the columns by
    `_columns`; the RETURNING rows of those whose CAS won."""
    if len({step[0] for step in steps}) != len(steps):
        raise ValueError("a row may be moved once per call")
    groups: dict[tuple[Any, Any], list[Step]] = defaultdict(list)
    for step in steps:
        groups[step[1], step[3]].append(step)
    out: list[Any] = []
    for (state, target), members in groups.items():
        values = _columns(table, {i: extra for i, _, _, _, extra in members})
        values.update(
            status=target.value, status_version=table.c.status_version + 1, updated_at=now
        )
        rows = await conn.execute(
            update(table)
            .where(_still_at(table, state, ((i, v) for i, _, v, _, _ in members)))
            .values(values)
            .returning(*returning)
        )
        out.extend(rows.mappings())
    return out


def _columns(table: Table, extras: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """SET values for the optional columns of a group's moves (row id -> its columns): a
    value all of them set alike is a plain value, others ``CASE id WHEN ... ELSE column``."""
    out: dict[str, Any] = {}
    for name in sorted({c for e in extras.values() for c in e}):
        given = {i: e[name] for i, e in extras.items() if name in e}
        first = next(iter(given.values()))
        if len(given) == len(extras) and all(v == first for v in given.values()):
            out[name] = first
            continue
        column = table.c[name]
        whens = {i: literal(v, column.type) for i, v in sorted(given.items())}
        out[name] = case(whens, value=table.c.id, else_=column)
    return out


def _still_at(
    table: Table, state: TaskState | AttemptState, versions: Iterable[tuple[int, int]]
) -> ColumnElement[bool]:
    """The version CAS of a bulk move (tasks or attempts alike): each row still at its (id,
    status_version) pair, in `state`. Pairs sorted, so concurrent movers lock in one order."""
    return and_(
        tuple_(table.c.id, table.c.status_version).in_(sorted(versions)),
        table.c.status == state.value,
    )

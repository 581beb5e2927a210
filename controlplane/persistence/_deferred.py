"""A unit of work's deferred writes and held rows: how a batch shares one transaction (issue 22).

A unit applying many items (a poll round's observations) would send each item's writes one by
one: its attempt's and task's moves, its runtime row, its job row, its usage entry, its outbox
message, its event's outcome. So the unit keeps them (`Deferred`) and sends them set-based, one
statement per table and shape (a bulk CAS, a multi-row INSERT, an ``executemany``), when it
must:

* before any statement that does not provably leave those tables alone: the unit's connection
  is an `AutoFlush`, which sends them first (what an ORM calls autoflush). Every read, every
  other write, a savepoint: all see the database exactly as if each write had gone out when it
  was made, so a path reads and decides as it did;
* at the end of the unit (`SqlUnitOfWork.flush_events`, which `Database.unit` calls before the
  commit).

A move is kept only when its row is held (below): the row is locked by this transaction, so
the held record IS the row, the CAS's outcome is known now (won if the record is at the
expected state and version, else lost, as the database would answer), and the moved record is
computed (`moved_attempt`, `moved_task`). The kept CAS must then win when it goes out: one that
does not (or returns another state or version) raises `ConcurrentModification` and the unit
rolls back. A move of a row not held, a second move of one attempt, a terminal task move (its
settlement reads the ledger) and a move with a route decision go out at once, after the kept
writes. The statements that provably leave the kept writes' tables alone (the task events'
numbers) use the raw connection.

Merging follows the order the writes were made: a later value of a column wins, a counter's
increments add up; a value set for a counter with increments pending (or the reverse) sends
the pending writes first, so the order between the two holds.

`Held` is the unit's identity map: the rows `SqlUnitOfWork.hold` locked for the unit (attempts
with their tasks, jobs and runtime rows, and the attempts of those tasks), kept current by the
unit's own writes, so a held row is read once for the whole unit. Only rows this transaction
has locked are kept: no other writer can change them before it ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.states import TaskState
from controlplane.persistence import _bulk, _sql, ledger, transitions
from controlplane.persistence.errors import ConcurrentModification
from controlplane.persistence.models import attempt_runtime as R
from controlplane.persistence.models import outbox as O
from controlplane.persistence.models import provider_events as E
from controlplane.persistence.models import provider_jobs as J
from controlplane.persistence.records import (
    AttemptChanges,
    AttemptRecord,
    AttemptRuntime,
    Failure,
    NewOutboxMessage,
    ProviderJobRecord,
    TaskRecord,
)

__all__ = ["AutoFlush", "Deferred", "Held"]

_RUNTIME_FIELDS = frozenset(f.name for f in fields(AttemptRuntime))


class AutoFlush:
    """The unit's connection as its statements see it: the deferred writes go out before any
    statement; everything else is the connection's own (`__getattr__`)."""

    def __init__(self, conn: AsyncConnection, flush: Callable[[], Awaitable[None]]) -> None:
        self._conn = conn
        self._flush = flush

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        await self._flush()
        return await self._conn.execute(*args, **kwargs)

    async def scalar(self, *args: Any, **kwargs: Any) -> Any:
        await self._flush()
        return await self._conn.scalar(*args, **kwargs)

    async def scalars(self, *args: Any, **kwargs: Any) -> Any:
        await self._flush()
        return await self._conn.scalars(*args, **kwargs)

    async def stream(self, *args: Any, **kwargs: Any) -> Any:
        await self._flush()
        return await self._conn.stream(*args, **kwargs)

    async def exec_driver_sql(self, *args: Any, **kwargs: Any) -> Any:
        await self._flush()
        return await self._conn.exec_driver_sql(*args, **kwargs)

    async def run_sync(self, *args: Any, **kwargs: Any) -> Any:
        await self._flush()
        return await self._conn.run_sync(*args, **kwargs)


@dataclass
class Deferred:
    """Writes kept for one statement per table and column set (see the module)."""

    # attempt id -> (task id, columns to set): upserts of ``attempt_runtime``
    runtime: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    # attempt id -> column -> increments of a runtime counter
    bumps: dict[int, dict[str, int]] = field(default_factory=dict)
    # provider job row id -> columns to set
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    # provider event id -> outcome
    outcomes: dict[int, str] = field(default_factory=dict)
    # attempt id -> (its kept CAS, the record it moves to); task id -> the same
    attempt_moves: dict[int, tuple[transitions.AttemptMove, AttemptRecord]] = field(
        default_factory=dict
    )
    task_moves: dict[int, tuple[transitions.TaskCas, TaskRecord]] = field(default_factory=dict)
    outbox: list[NewOutboxMessage] = field(default_factory=list)
    usage: list[ledger.NewUsage] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.runtime
            or self.bumps
            or self.jobs
            or self.outcomes
            or self.attempt_moves
            or self.task_moves
            or self.outbox
            or self.usage
        )

    @property
    def moves(self) -> bool:
        return bool(self.attempt_moves or self.task_moves)

    def conflicts(self, attempt_id: int, columns: Iterable[str]) -> bool:
        """Whether setting `columns` must wait for pending increments of them (the increments
        go out after the values: a value set after them would be overtaken)."""
        bumped = self.bumps.get(attempt_id)
        return bumped is not None and any(c in bumped for c in columns)

    def set_runtime(self, attempt_id: int, task_id: int, values: dict[str, Any]) -> None:
        _, pending = self.runtime.setdefault(attempt_id, (task_id, {}))
        pending.update(values)

    def bump(self, attempt_id: int, task_id: int, column: str, now: Any) -> None:
        self.set_runtime(attempt_id, task_id, {"updated_at": now})
        counts = self.bumps.setdefault(attempt_id, {})
        counts[column] = counts.get(column, 0) + 1

    async def flush(self, conn: AsyncConnection, now: datetime) -> None:
        """Send every kept write (the moves, outbox messages and usage entries, then runtime
        upserts, counters, jobs, event outcomes), one statement per table and shape, and
        forget them. `ConcurrentModification` if a kept CAS does not win as computed."""
        attempt_moves, task_moves = self.attempt_moves, self.task_moves
        outbox, usage = self.outbox, self.usage
        runtime, bumps, jobs, outcomes = self.runtime, self.bumps, self.jobs, self.outcomes
        self.runtime, self.bumps, self.jobs, self.outcomes = {}, {}, {}, {}
        self.attempt_moves, self.task_moves, self.outbox, self.usage = {}, {}, [], []
        if attempt_moves:
            won = await transitions.cas_attempts(conn, [m for m, _ in attempt_moves.values()], now)
            for attempt_id, (_, computed) in attempt_moves.items():
                got = won.get(attempt_id)
                if got is None or (got.state, got.status_version) != (
                    computed.state,
                    computed.status_version,
                ):
                    raise ConcurrentModification(f"attempt {attempt_id}: a held row moved")
        if task_moves:
            versions = await transitions.cas_tasks(conn, [m for m, _ in task_moves.values()], now)
            for task_id, (_, task) in task_moves.items():
                if versions.get(task_id) != task.status_version:
                    raise ConcurrentModification(f"task {task_id}: a held row moved")
        if outbox:
            await _bulk.insert_rows(
                conn,
                O,
                [
                    {
                        "topic": str(m.topic),
                        "aggregate_id": m.aggregate_id,
                        "payload": dict(m.payload),
                        "created_at": now,
                        "available_at": m.available_at or now,
                        "attempts": 0,
                    }
                    for m in outbox
                ],
            )
        if usage:
            await ledger.record_usages(conn, usage, now)
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        for names, rows in _by_columns(
            {"attempt_id": a, "task_id": t, **v} for a, (t, v) in runtime.items()
        ):
            stmt = insert(R)
            set_ = {n: stmt.excluded[n] for n in names if n not in ("attempt_id", "task_id")}
            await conn.execute(
                stmt.on_conflict_do_update(index_elements=[R.c.attempt_id], set_=set_), rows
            )
        by_column: dict[str, list[dict[str, Any]]] = {}
        for attempt_id, counts in bumps.items():
            for column, n in counts.items():
                by_column.setdefault(column, []).append({"rt_attempt": attempt_id, "rt_n": n})
        for column, rows in sorted(by_column.items()):
            await conn.execute(
                update(R)
                .where(R.c.attempt_id == bindparam("rt_attempt"))
                .values({column: R.c[column] + bindparam("rt_n")}),
                rows,
            )
        for _, rows in _by_columns({"job_row": j, **v} for j, v in jobs.items()):
            await conn.execute(update(J).where(J.c.id == bindparam("job_row")), rows)
        if outcomes:
            await conn.execute(
                update(E).where(E.c.id == bindparam("event_row")),
                [{"event_row": e, "outcome": o} for e, o in outcomes.items()],
            )


def _by_columns(
    rows: Iterable[dict[str, Any]],
) -> list[tuple[tuple[str, ...], list[dict[str, Any]]]]:
    """`rows` grouped by their column names (an ``executemany`` needs one shape), in order."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(row)), []).append(row)
    return list(groups.items())


@dataclass
class Held:
    """The rows a unit holds locked (see the module); each map says what it knows."""

    attempts: dict[int, AttemptRecord] = field(default_factory=dict)
    tasks: dict[int, TaskRecord] = field(default_factory=dict)
    # attempt id -> its runtime row (None: it has none)
    runtimes: dict[int, AttemptRuntime | None] = field(default_factory=dict)
    # attempt id -> its job (None: it has none); by (account, job id) for the recorded ones
    jobs_of: dict[int, ProviderJobRecord | None] = field(default_factory=dict)
    jobs: dict[tuple[int, str], ProviderJobRecord] = field(default_factory=dict)
    # task id -> its attempts in attempt order
    siblings: dict[int, list[AttemptRecord]] = field(default_factory=dict)

    def moved_attempt(self, record: AttemptRecord) -> None:
        if record.id in self.attempts:
            self.attempts[record.id] = record
        family = self.siblings.get(record.task_id)
        if family is not None:
            self.siblings[record.task_id] = [record if a.id == record.id else a for a in family]

    def moved_task(self, record: TaskRecord) -> None:
        if record.id in self.tasks:
            self.tasks[record.id] = record

    def set_runtime(self, attempt_id: int, values: dict[str, Any]) -> None:
        """A runtime write: the held row takes the values; a row not there yet is forgotten (it
        is read, after the flush, with its defaults)."""
        if attempt_id not in self.runtimes:
            return
        current = self.runtimes[attempt_id]
        if current is None:
            del self.runtimes[attempt_id]
            return
        self.runtimes[attempt_id] = replace(
            current, **{k: v for k, v in values.items() if k in _RUNTIME_FIELDS}
        )

    def bump(self, attempt_id: int, column: str) -> None:
        current = self.runtimes.get(attempt_id)
        if current is None:
            self.runtimes.pop(attempt_id, None)
            return
        self.runtimes[attempt_id] = replace(current, **{column: getattr(current, column) + 1})

    def forget_job(self, job_row_id: int) -> None:
        """A job write: the held job is read again (after the flush) if asked for."""
        for key, job in list(self.jobs.items()):
            if job.id == job_row_id:
                del self.jobs[key]
                self.jobs_of.pop(job.attempt_id, None)


def moved_attempt(
    record: AttemptRecord,
    target: Any,
    changes: AttemptChanges | None,
    now: datetime,
) -> AttemptRecord:
    """The row a won CAS of `record` to `target` with `changes` leaves (`cas_attempts`)."""
    values: dict[str, Any] = {
        "state": target,
        "status_version": record.status_version + 1,
        "updated_at": now,
    }
    if changes is not None:
        if changes.failure is not None:
            values["failure"] = changes.failure
        for name, value in _sql.attempt_extra(changes).items():
            if name in _ATTEMPT_FIELDS:
                values[name] = value
    return replace(record, **values)


def moved_task(
    record: TaskRecord, target: TaskState, extra: Mapping[str, Any], now: datetime
) -> TaskRecord:
    """The row a won CAS of `record` to `target` setting `extra` (`_sql.task_extra`) leaves."""
    values: dict[str, Any] = {
        "state": target,
        "status_version": record.status_version + 1,
        "updated_at": now,
    }
    if "failure_class" in extra:
        values["failure"] = Failure(
            extra["failure_class"], extra["failure_code"], extra["failure_message"]
        )
    if "adopted_attempt_id" in extra:
        values["adopted_attempt_id"] = extra["adopted_attempt_id"]
    if "output_asset" in extra:
        values["output_asset"] = dict(extra["output_asset"])
    return replace(record, **values)


_ATTEMPT_FIELDS = frozenset(f.name for f in fields(AttemptRecord))

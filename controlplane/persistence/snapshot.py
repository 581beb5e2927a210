"""One consistent, read-only snapshot of the execution tables, for the audit's invariant rules.

Only columns of the initial schema (revision 0001) are read, with explicit column lists, so the
checker works at whatever migration head a database is at. Everything is read in one
transaction: REPEATABLE READ on PostgreSQL (one MVCC snapshot, no locks held against writers),
and on SQLite the read connection's ``BEGIN DEFERRED`` (`db.for_reads`), whose reads all see the
one WAL snapshot taken at its first read, without the write lock. The rows are held in
memory: the checker runs on test and soak databases and, for operators, at most on the
execution history of one database.

Raw values are kept as read (a status is a ``str``, a cost whatever the driver returned): the
rules must be able to see a value the schema should have made impossible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Integer, Numeric, Select, inspect, select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.models import (
    generation_tasks,
    outbox,
    provider_accounts,
    provider_jobs,
    route_decisions,
    task_attempts,
    task_events,
)

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = [
    "EVENT_KINDS",
    "AccountRow",
    "AttemptRow",
    "DecisionRow",
    "EventRow",
    "JobRow",
    "OutboxRow",
    "Snapshot",
    "TaskRow",
    "read_snapshot",
]

# The task_events kinds the rules read; every other kind is left in the database.
EVENT_KINDS = (
    "attempt.created",
    "attempt.state_changed",
    "provider_job.recorded",
    "task.state_changed",
)

# Tables holding money: none of their columns may be a float or decimal type (9.23.2).
MONEY_TABLES = ("generation_tasks", "task_attempts", "provider_jobs", "provider_price_versions")


@dataclass(frozen=True, slots=True)
class AccountRow:
    id: int
    provider: str
    account_name: str


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: int
    status: str
    adopted_attempt_id: int | None
    output_asset: Any


@dataclass(frozen=True, slots=True)
class AttemptRow:
    id: int
    task_id: int
    attempt_no: int
    provider_account_id: int | None
    provider_model: str | None
    compile_plan: Any
    route_decision_id: int | None
    status: str
    estimated_cost_micros: Any
    actual_cost_micros: Any
    currency: str | None
    client_request_key: str
    lease_token: str | None


@dataclass(frozen=True, slots=True)
class JobRow:
    id: int
    attempt_id: int
    provider_account_id: int
    provider_job_id: str
    normalized_status: str


@dataclass(frozen=True, slots=True)
class DecisionRow:
    id: int
    task_id: int
    decision_no: int
    policy_version: str | None
    candidate_snapshot: Any
    reason_code: str | None


@dataclass(frozen=True, slots=True)
class EventRow:
    task_id: int
    seq: int
    kind: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """An outbox message that is not done yet."""

    id: int
    topic: str
    aggregate_id: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The rows the rules read, each tuple in id (events: task, seq) order."""

    accounts: tuple[AccountRow, ...]
    tasks: tuple[TaskRow, ...]
    attempts: tuple[AttemptRow, ...]
    jobs: tuple[JobRow, ...]
    decisions: tuple[DecisionRow, ...]
    events: tuple[EventRow, ...]
    undone_outbox: tuple[OutboxRow, ...]
    # "table.column (TYPE)" of money columns that are not integers, found by reflection.
    non_integer_money_columns: tuple[str, ...] = ()


T, A, J, D, E, OB = (
    generation_tasks,
    task_attempts,
    provider_jobs,
    route_decisions,
    task_events,
    outbox,
)


async def _rows(conn: AsyncConnection, query: Select[Any]) -> list[Mapping[str, Any]]:
    return list((await conn.execute(query)).mappings().all())


async def read_snapshot(db: Database) -> Snapshot:
    """Read the snapshot in one transaction (see the module docstring for the isolation)."""
    async with db.reading() as raw:
        conn = raw
        if raw.dialect.name == "postgresql":
            conn = await raw.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            return await _read(conn)


async def _read(conn: AsyncConnection) -> Snapshot:
    pa = provider_accounts
    accounts = await _rows(
        conn, select(pa.c.id, pa.c.provider, pa.c.account_name).order_by(pa.c.id)
    )
    tasks = await _rows(
        conn,
        select(T.c.id, T.c.status, T.c.adopted_attempt_id, T.c.output_asset).order_by(T.c.id),
    )
    attempts = await _rows(
        conn,
        select(
            A.c.id,
            A.c.task_id,
            A.c.attempt_no,
            A.c.provider_account_id,
            A.c.provider_model,
            A.c.compile_plan,
            A.c.route_decision_id,
            A.c.status,
            A.c.estimated_cost_micros,
            A.c.actual_cost_micros,
            A.c.currency,
            A.c.client_request_key,
            A.c.lease_token,
        ).order_by(A.c.id),
    )
    jobs = await _rows(
        conn,
        select(
            J.c.id,
            J.c.attempt_id,
            J.c.provider_account_id,
            J.c.provider_job_id,
            J.c.normalized_status,
        ).order_by(J.c.id),
    )
    decisions = await _rows(
        conn,
        select(
            D.c.id,
            D.c.task_id,
            D.c.decision_no,
            D.c.policy_version,
            D.c.candidate_snapshot,
            D.c.reason_code,
        ).order_by(D.c.id),
    )
    events = await _rows(
        conn,
        select(E.c.task_id, E.c.seq, E.c.kind, E.c.payload)
        .where(E.c.kind.in_(EVENT_KINDS))
        .order_by(E.c.task_id, E.c.seq),
    )
    undone = await _rows(
        conn,
        select(OB.c.id, OB.c.topic, OB.c.aggregate_id, OB.c.payload)
        .where(OB.c.done_at.is_(None))
        .order_by(OB.c.id),
    )
    return Snapshot(
        accounts=tuple(AccountRow(**m) for m in accounts),
        tasks=tuple(TaskRow(**m) for m in tasks),
        attempts=tuple(AttemptRow(**m) for m in attempts),
        jobs=tuple(JobRow(**m) for m in jobs),
        decisions=tuple(DecisionRow(**m) for m in decisions),
        events=tuple(
            EventRow(m["task_id"], m["seq"], m["kind"], _mapping(m["payload"])) for m in events
        ),
        undone_outbox=tuple(
            OutboxRow(m["id"], m["topic"], m["aggregate_id"], _mapping(m["payload"]))
            for m in undone
        ),
        non_integer_money_columns=await conn.run_sync(_non_integer_money_columns),
    )


def _non_integer_money_columns(sync_conn: Connection) -> tuple[str, ...]:
    inspector = inspect(sync_conn)
    found: list[str] = []
    for table in MONEY_TABLES:
        if not inspector.has_table(table):
            continue
        for column in inspector.get_columns(table):
            kind = column["type"]
            # Float, REAL, DOUBLE and NUMERIC are all Numeric; a *_micros column must be Integer.
            micros = str(column["name"]).endswith("_micros")
            if isinstance(kind, Numeric) or (micros and not isinstance(kind, Integer)):
                found.append(f"{table}.{column['name']} ({kind})")
    return tuple(found)


def _mapping(value: Any) -> Mapping[str, Any]:
    # A payload that is not a JSON object (only possible by hand) reads as empty.
    return value if isinstance(value, Mapping) else {}

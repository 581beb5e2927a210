"""Persistence of the execution side: per-attempt runtime bookkeeping and raw provider events.

Two tables (revision ``0002_execution``), declared on their own `MetaData` so the 0001 model
comparison is untouched:

* ``attempt_runtime``: one row per attempt that reached the execution engine: when to poll next,
  how many recovery queries were made, since when the submit is unknown, cancel bookkeeping.
* ``provider_events``: every observation of a provider job (poll, callback, cancel, submit),
  raw payload included, deduplicated by ``UNIQUE (account, job id, raw status, payload hash)``.

`ExecutionStore.unit` opens ONE transaction in which the engine reads with row locks
(``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` serialises writers),
decides, and writes attempt + task transitions, the provider job, events and outbox messages
together, so a crash can never leave half of a decision behind. Locks are always taken attempt
first, then task, the order `Store.transition_attempt` uses, so the two never deadlock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.domain.states import ATTEMPT_MACHINE, TASK_MACHINE, AttemptState, TaskState
from controlplane.persistence import _rows, _sql
from controlplane.persistence.coltypes import BigIntPK, UtcDateTime
from controlplane.persistence.models import NAMING_CONVENTION, provider_accounts, provider_jobs
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import outbox as O
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.records import (
    AttemptChanges,
    AttemptRecord,
    Failure,
    NewOutboxMessage,
    NewProviderJob,
    ProviderJobRecord,
    TaskRecord,
)

__all__ = [
    "POLLABLE_STATES",
    "AccountInfo",
    "AttemptRuntime",
    "ExecUnit",
    "ExecutionStore",
    "ProviderEventRecord",
    "attempt_runtime",
    "execution_metadata",
    "provider_events",
]

execution_metadata = MetaData(naming_convention=NAMING_CONVENTION)

attempt_runtime = Table(
    "attempt_runtime",
    execution_metadata,
    Column("attempt_id", BigInteger, ForeignKey(A.c.id), primary_key=True),
    Column("task_id", BigInteger, ForeignKey(T.c.id), nullable=False),
    Column("submit_retries", Integer, nullable=False, server_default=text("0")),
    Column("supports_idempotency_key", Boolean, nullable=False, server_default=text("false")),
    Column("accepted_at", UtcDateTime, nullable=True),
    Column("next_poll_at", UtcDateTime, nullable=True),
    Column("poll_phase", Text, nullable=True),
    Column("polls_in_phase", Integer, nullable=False, server_default=text("0")),
    Column("poll_count", Integer, nullable=False, server_default=text("0")),
    Column("last_polled_at", UtcDateTime, nullable=True),
    Column("stuck_since", UtcDateTime, nullable=True),
    Column("unknown_since", UtcDateTime, nullable=True),
    Column("next_recovery_at", UtcDateTime, nullable=True),
    Column("recovery_queries", Integer, nullable=False, server_default=text("0")),
    Column("cancel_requested_at", UtcDateTime, nullable=True),
    Column("cancel_calls", Integer, nullable=False, server_default=text("0")),
    Column("unrecognized_count", Integer, nullable=False, server_default=text("0")),
    Column("last_unrecognized_status", Text, nullable=True),
    Column("fetch_attempts", Integer, nullable=False, server_default=text("0")),
    Column("output_refreshes", Integer, nullable=False, server_default=text("0")),
    # Revision 0003: a held job the provider stopped knowing, and late lookups of ABANDONED.
    Column("job_not_found_since", UtcDateTime, nullable=True),
    Column("late_found_job_id", Text, nullable=True),
    Column("late_found_method", Text, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    Index("ix_attempt_runtime_next_poll_at", "next_poll_at"),
    Index("ix_attempt_runtime_next_recovery_at", "next_recovery_at"),
)

provider_events = Table(
    "provider_events",
    execution_metadata,
    Column("id", BigIntPK, primary_key=True),
    Column("provider_account_id", BigInteger, nullable=False),
    Column("provider_job_id", Text, nullable=False),
    Column("attempt_id", BigInteger, nullable=True),
    Column("source", Text, nullable=False),
    Column("job_state", Text, nullable=False),
    Column("raw_status", Text, nullable=False),
    Column("payload_hash", Text, nullable=False),
    Column("raw_payload", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    UniqueConstraint(
        "provider_account_id",
        "provider_job_id",
        "raw_status",
        "payload_hash",
        name="uq_provider_events_dedup",
    ),
    Index("ix_provider_events_attempt_id", "attempt_id"),
)

R = attempt_runtime
E = provider_events

POLLABLE_STATES = frozenset(
    {
        AttemptState.ACCEPTED,
        AttemptState.PROVIDER_QUEUED,
        AttemptState.PROVIDER_THROTTLED,
        AttemptState.RUNNING,
        AttemptState.CANCEL_REQUESTED,
    }
)


@dataclass(frozen=True, slots=True)
class AttemptRuntime:
    """A row of ``attempt_runtime``."""

    attempt_id: int
    task_id: int
    submit_retries: int
    supports_idempotency_key: bool
    accepted_at: datetime | None
    next_poll_at: datetime | None
    poll_phase: str | None
    polls_in_phase: int
    poll_count: int
    last_polled_at: datetime | None
    stuck_since: datetime | None
    unknown_since: datetime | None
    next_recovery_at: datetime | None
    recovery_queries: int
    cancel_requested_at: datetime | None
    cancel_calls: int
    unrecognized_count: int
    last_unrecognized_status: str | None
    fetch_attempts: int
    output_refreshes: int
    job_not_found_since: datetime | None
    late_found_job_id: str | None
    late_found_method: str | None


@dataclass(frozen=True, slots=True)
class ProviderEventRecord:
    """A row of ``provider_events``."""

    id: int
    provider_account_id: int
    provider_job_id: str
    attempt_id: int | None
    source: str
    job_state: str
    raw_status: str
    payload_hash: str
    raw_payload: str
    outcome: str
    received_at: datetime


@dataclass(frozen=True, slots=True)
class AccountInfo:
    """The provider account an attempt runs on."""

    id: int
    provider: str
    account_name: str
    region: str = ""


def _runtime(m: RowMapping) -> AttemptRuntime:
    return AttemptRuntime(**{f: m[f] for f in AttemptRuntime.__dataclass_fields__})


def _event(m: RowMapping) -> ProviderEventRecord:
    return ProviderEventRecord(**{f: m[f] for f in ProviderEventRecord.__dataclass_fields__})


def _insert_for(conn: AsyncConnection, table: Table) -> Any:
    """The dialect's INSERT, which has ``on_conflict_do_*`` on both PostgreSQL and SQLite."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


class ExecUnit:
    """One open transaction of the execution engine (see the module docstring)."""

    def __init__(self, conn: AsyncConnection, now: datetime) -> None:
        self.conn = conn
        self.now = now

    async def attempt(self, attempt_id: int, *, lock: bool = True) -> AttemptRecord | None:
        query = select(A).where(A.c.id == attempt_id)
        row = (await self.conn.execute(query.with_for_update() if lock else query)).mappings()
        found = row.first()
        return None if found is None else _rows.attempt(found)

    async def task(self, task_id: int, *, lock: bool = True) -> TaskRecord | None:
        query = select(T).where(T.c.id == task_id)
        row = (await self.conn.execute(query.with_for_update() if lock else query)).mappings()
        found = row.first()
        return None if found is None else _rows.task(found)

    async def attempts_of(self, task_id: int) -> list[AttemptRecord]:
        rows = await self.conn.execute(
            select(A).where(A.c.task_id == task_id).order_by(A.c.attempt_no)
        )
        return [_rows.attempt(m) for m in rows.mappings()]

    async def job_of(self, attempt_id: int) -> ProviderJobRecord | None:
        rows = await self.conn.execute(
            select(provider_jobs).where(provider_jobs.c.attempt_id == attempt_id)
        )
        found = rows.mappings().first()
        return None if found is None else _rows.provider_job(found)

    async def job_by_ref(self, account_id: int, job_id: str) -> ProviderJobRecord | None:
        rows = await self.conn.execute(
            select(provider_jobs).where(
                provider_jobs.c.provider_account_id == account_id,
                provider_jobs.c.provider_job_id == job_id,
            )
        )
        found = rows.mappings().first()
        return None if found is None else _rows.provider_job(found)

    async def account(self, account_id: int) -> AccountInfo:
        row = (
            (
                await self.conn.execute(
                    select(provider_accounts).where(provider_accounts.c.id == account_id)
                )
            )
            .mappings()
            .one()
        )
        return AccountInfo(row["id"], row["provider"], row["account_name"], row["region"])

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None:
        rows = await self.conn.execute(select(R).where(R.c.attempt_id == attempt_id))
        found = rows.mappings().first()
        return None if found is None else _runtime(found)

    async def move_attempt(
        self,
        record: AttemptRecord,
        target: AttemptState,
        reason: str,
        changes: AttemptChanges | None = None,
    ) -> AttemptRecord | None:
        """CAS the attempt from `record`'s version; None when the table forbids it or it lost."""
        if not ATTEMPT_MACHINE.can(record.state, target):
            return None
        values: dict[str, Any] = _sql.attempt_extra(changes)
        values.update(
            status=target.value, status_version=A.c.status_version + 1, updated_at=self.now
        )
        row = (
            (
                await self.conn.execute(
                    update(A)
                    .where(
                        A.c.id == record.id,
                        A.c.status_version == record.status_version,
                        A.c.status == record.state.value,
                    )
                    .values(values)
                    .returning(A)
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            return None
        moved = _rows.attempt(row)
        seq = await _sql.next_seq(self.conn, moved.task_id)
        payload = {**_sql.attempt_payload(moved), "reason": reason}
        await _sql.append_event(
            self.conn, moved.task_id, seq, "attempt.state_changed", payload, now=self.now
        )
        return moved

    async def set_attempt_cost(self, attempt_id: int, actual_cost_micros: int) -> None:
        await self.conn.execute(
            update(A)
            .where(A.c.id == attempt_id)
            .values(actual_cost_micros=actual_cost_micros, updated_at=self.now)
        )

    async def move_task(
        self,
        record: TaskRecord,
        target: TaskState,
        reason: str,
        *,
        failure: Failure | None = None,
        adopted_attempt_id: int | None = None,
        output_asset: dict[str, Any] | None = None,
    ) -> TaskRecord | None:
        """CAS the task from `record`'s version; None when the table forbids it or it lost."""
        if not TASK_MACHINE.can(record.state, target):
            return None
        extra = _sql.task_extra(failure, adopted_attempt_id, output_asset)
        seq = await _sql.cas_task(
            self.conn, record.id, record.status_version, target, now=self.now, events=1, extra=extra
        )
        if seq is None:
            return None
        payload = _sql.state_payload(target, record.status_version + 1, reason, failure)
        await _sql.append_event(
            self.conn, record.id, seq, "task.state_changed", payload, now=self.now
        )
        return await self.task(record.id, lock=False)

    async def enqueue(self, message: NewOutboxMessage) -> int:
        return await _sql.enqueue(self.conn, message, self.now)

    async def complete_message(self, message_id: int, worker: str) -> bool:
        """Mark an outbox message done in this transaction (effect and ack commit together)."""
        result = await self.conn.execute(
            update(O)
            .where(O.c.id == message_id, O.c.claimed_by == worker, O.c.done_at.is_(None))
            .values(done_at=self.now, claimed_until=None)
        )
        return result.rowcount == 1

    async def insert_job(self, job: NewProviderJob) -> ProviderJobRecord:
        row = (
            (
                await self.conn.execute(
                    _insert_for(self.conn, provider_jobs)
                    .values(
                        attempt_id=job.attempt_id,
                        provider_account_id=job.provider_account_id,
                        provider_job_id=job.provider_job_id,
                        provider_request_id=job.provider_request_id,
                        raw_status=job.raw_status,
                        normalized_status=job.normalized_status.value,
                        output_locator=job.output_locator,
                        raw_failure=job.raw_failure,
                        submitted_at=job.submitted_at,
                        created_at=self.now,
                    )
                    .returning(provider_jobs)
                )
            )
            .mappings()
            .one()
        )
        record = _rows.provider_job(row)
        task_id = int(
            await self.conn.scalar(select(A.c.task_id).where(A.c.id == job.attempt_id)) or 0
        )
        seq = await _sql.next_seq(self.conn, task_id)
        payload = {
            "attempt_id": job.attempt_id,
            "provider_job_id": job.provider_job_id,
            "normalized_status": job.normalized_status.value,
        }
        await _sql.append_event(
            self.conn, task_id, seq, "provider_job.recorded", payload, now=self.now
        )
        return record

    async def update_job(self, job_row_id: int, **values: Any) -> None:
        await self.conn.execute(
            update(provider_jobs).where(provider_jobs.c.id == job_row_id).values(**values)
        )

    async def set_runtime(self, attempt_id: int, task_id: int, **values: Any) -> None:
        """Upsert the attempt's runtime row, setting only the named columns."""
        values["updated_at"] = self.now
        stmt = _insert_for(self.conn, R).values(attempt_id=attempt_id, task_id=task_id, **values)
        await self.conn.execute(
            stmt.on_conflict_do_update(index_elements=[R.c.attempt_id], set_=values)
        )

    async def bump_runtime(self, attempt_id: int, task_id: int, column: str) -> None:
        """Add one to a counter column of the runtime row (creating the row if needed)."""
        await self.set_runtime(attempt_id, task_id)
        await self.conn.execute(
            update(R).where(R.c.attempt_id == attempt_id).values({column: R.c[column] + 1})
        )

    async def insert_event(self, **values: Any) -> int | None:
        """Store an observation; None when the same (job, raw status, payload) is already there."""
        stmt = (
            _insert_for(self.conn, E)
            .values(**values)
            .on_conflict_do_nothing(
                index_elements=[
                    E.c.provider_account_id,
                    E.c.provider_job_id,
                    E.c.raw_status,
                    E.c.payload_hash,
                ]
            )
            .returning(E.c.id)
        )
        event_id = await self.conn.scalar(stmt)
        return None if event_id is None else int(event_id)

    async def set_event_outcome(self, event_id: int, outcome: str) -> None:
        await self.conn.execute(update(E).where(E.c.id == event_id).values(outcome=outcome))


class ExecutionStore:
    """Queries and transactions of the execution engine over the same engine as `Store`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @asynccontextmanager
    async def unit(self, now: datetime) -> AsyncIterator[ExecUnit]:
        """One transaction; commits when the block exits normally, rolls back otherwise."""
        async with self._engine.begin() as conn:
            yield ExecUnit(conn, now)

    async def _claim(
        self,
        column: Any,
        states: Iterable[AttemptState],
        *,
        worker: str,
        limit: int,
        lease_s: float,
        now: datetime,
    ) -> list[int]:
        due = (
            select(R.c.attempt_id)
            .join(A, A.c.id == R.c.attempt_id)
            .where(column <= now, A.c.status.in_(sorted(s.value for s in states)))
            .order_by(column)
            .limit(limit)
            .with_for_update(skip_locked=True, of=R)
            .cte("due")
        )
        # Claiming pushes the due time past the lease: a crashed worker's claim simply expires.
        stmt = (
            update(R)
            .where(R.c.attempt_id.in_(select(due.c.attempt_id)))
            .values({column.name: now + timedelta(seconds=lease_s), "updated_at": now})
            .returning(R.c.attempt_id)
        )
        async with self._engine.begin() as conn:
            return sorted(int(i) for i in (await conn.execute(stmt)).scalars())

    async def claim_polls(
        self, worker: str, *, limit: int, lease_s: float, now: datetime
    ) -> list[int]:
        """Attempts whose poll is due, claimed with SKIP LOCKED (PostgreSQL)."""
        return await self._claim(
            R.c.next_poll_at, POLLABLE_STATES, worker=worker, limit=limit, lease_s=lease_s, now=now
        )

    async def claim_recoveries(
        self, worker: str, *, limit: int, lease_s: float, now: datetime
    ) -> list[int]:
        """SUBMIT_UNKNOWN attempts whose recovery step is due, claimed like polls."""
        states = (AttemptState.SUBMIT_UNKNOWN,)
        return await self._claim(
            R.c.next_recovery_at, states, worker=worker, limit=limit, lease_s=lease_s, now=now
        )

    async def claim_late_lookups(
        self, worker: str, *, limit: int, lease_s: float, now: datetime
    ) -> list[int]:
        """ABANDONED attempts whose background lookup is due (same due column as recovery)."""
        states = (AttemptState.ABANDONED,)
        return await self._claim(
            R.c.next_recovery_at, states, worker=worker, limit=limit, lease_s=lease_s, now=now
        )

    async def stale_submitting(self, *, started_before: datetime, limit: int) -> list[int]:
        """SUBMITTING attempts whose request started before `started_before` (crashed submits)."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(A.c.id)
                .where(
                    A.c.status == AttemptState.SUBMITTING.value,
                    (A.c.request_started_at.is_(None)) | (A.c.request_started_at < started_before),
                )
                .order_by(A.c.id)
                .limit(limit)
            )
            return [int(i) for i in rows.scalars()]

    async def account(self, account_id: int) -> AccountInfo:
        async with self._engine.connect() as conn:
            return await ExecUnit(conn, datetime.min).account(account_id)

    async def accounts_of_provider(self, provider: str) -> list[AccountInfo]:
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(provider_accounts).where(provider_accounts.c.provider == provider)
            )
            return [
                AccountInfo(m["id"], m["provider"], m["account_name"], m["region"])
                for m in rows.mappings()
            ]

    async def snapshot(
        self, attempt_id: int
    ) -> tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None] | None:
        """The attempt, its job and runtime row, read without locks."""
        async with self._engine.connect() as conn:
            unit = ExecUnit(conn, datetime.min)
            attempt = await unit.attempt(attempt_id, lock=False)
            if attempt is None:
                return None
            return attempt, await unit.job_of(attempt_id), await unit.runtime(attempt_id)

    async def job_by_provider(self, provider: str, job_id: str) -> ProviderJobRecord | None:
        """The recorded job with this id on any account of `provider` (callbacks)."""
        async with self._engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(provider_jobs)
                        .join(
                            provider_accounts,
                            provider_accounts.c.id == provider_jobs.c.provider_account_id,
                        )
                        .where(
                            provider_accounts.c.provider == provider,
                            provider_jobs.c.provider_job_id == job_id,
                        )
                    )
                )
                .mappings()
                .first()
            )
            return None if row is None else _rows.provider_job(row)

    async def events(
        self,
        *,
        attempt_id: int | None = None,
        account_id: int | None = None,
        job_id: str | None = None,
    ) -> list[ProviderEventRecord]:
        """Stored observations for an attempt or for a job, oldest first."""
        query = select(E).order_by(E.c.id)
        if attempt_id is not None:
            query = query.where(E.c.attempt_id == attempt_id)
        if account_id is not None:
            query = query.where(E.c.provider_account_id == account_id)
        if job_id is not None:
            query = query.where(E.c.provider_job_id == job_id)
        async with self._engine.connect() as conn:
            return [_event(m) for m in (await conn.execute(query)).mappings()]

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None:
        async with self._engine.connect() as conn:
            return await ExecUnit(conn, datetime.min).runtime(attempt_id)

    async def known_job_ids(self, account_id: int, job_ids: Iterable[str]) -> set[str]:
        ids = sorted(set(job_ids))
        if not ids:
            return set()
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(provider_jobs.c.provider_job_id).where(
                    provider_jobs.c.provider_account_id == account_id,
                    provider_jobs.c.provider_job_id.in_(ids),
                )
            )
            return {str(i) for i in rows.scalars()}

    async def unknown_attempts_on(self, account_id: int) -> int:
        """How many attempts of the account are SUBMIT_UNKNOWN right now."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(A.c.id).where(
                    A.c.provider_account_id == account_id,
                    A.c.status == AttemptState.SUBMIT_UNKNOWN.value,
                )
            )
            return len(rows.all())

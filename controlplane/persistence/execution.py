"""Execution reads: an attempt's snapshot (attempt, job, runtime row), stored provider events,
accounts, jobs by provider id, crashed submits, and the states whose poll can be due.

A claimed batch reads its rows at once (`snapshots`, `tasks`: one connection, one statement per
table, whatever the batch size).

Read-only, without locks: the execution engine reads here to decide what to do, then does it in
a unit of work (`Database.unit`), which re-reads what it changes with row locks. The claims of due
polls and recoveries write (they push the due time past a lease), so they are unit methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, cast

from sqlalchemy import RowMapping, select

from controlplane.domain.states import AttemptState
from controlplane.persistence import _reads, _rows
from controlplane.persistence.models import attempt_runtime as R
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import provider_accounts, provider_jobs
from controlplane.persistence.models import provider_events as E
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.records import (
    AccountInfo,
    AttemptRecord,
    AttemptRuntime,
    ProviderEventRecord,
    ProviderJobRecord,
    TaskRecord,
)

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = ["ExecutionQueries", "Snapshot"]

Snapshot = tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None]


class ExecutionQueries:
    """Read-only execution queries over one `Database`; each call reads on its own connection."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def stale_submitting(self, *, started_before: datetime, limit: int) -> list[int]:
        """SUBMITTING attempts whose request started before `started_before` (crashed submits)."""
        async with self._db.reading() as conn:
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

    async def attempts(self, attempt_ids: Iterable[int]) -> dict[int, AttemptRecord]:
        """The attempts that exist of `attempt_ids`, in one statement (a claimed batch's)."""
        ids = sorted(set(attempt_ids))
        if not ids:
            return {}
        async with self._db.reading() as conn:
            rows = await conn.execute(select(A).where(A.c.id.in_(ids)))
            return {int(m["id"]): _rows.attempt(m) for m in rows.mappings()}

    async def waiting_to_submit(self, *, after_id: int, limit: int) -> list[AttemptRecord]:
        """READY_TO_SUBMIT attempts (leased, not sent yet) with an id above `after_id`, in id
        order: a page of the submit backlog whose leases `WaitingLeases` renews."""
        async with self._db.reading() as conn:
            rows = await conn.execute(
                select(A)
                .where(A.c.status == AttemptState.READY_TO_SUBMIT.value, A.c.id > after_id)
                .order_by(A.c.id)
                .limit(limit)
            )
            return [_rows.attempt(m) for m in rows.mappings()]

    async def account(self, account_id: int) -> AccountInfo:
        """The account's identity (the engine keeps what it read: `ExecutionDeps.account`)."""
        async with self._db.reading() as conn:
            return await _reads.account(conn, account_id)

    async def snapshot(self, attempt_id: int) -> Snapshot | None:
        """The attempt, its job and runtime row, read without locks: `snapshots` of one (ONE
        statement, where three reads in a row were)."""
        return (await self.snapshots([attempt_id])).get(attempt_id)

    async def snapshots(self, attempt_ids: Iterable[int]) -> dict[int, Snapshot]:
        """`snapshot` of each attempt that exists, in ONE statement for the whole batch."""
        return {i: snap for i, (snap, _) in (await self._joined(attempt_ids, False)).items()}

    async def snapshots_and_tasks(
        self, attempt_ids: Iterable[int]
    ) -> dict[int, tuple[Snapshot, TaskRecord]]:
        """`snapshot` of each attempt that exists with its task, in ONE statement."""
        joined = await self._joined(attempt_ids, True)
        return {i: (snap, task) for i, (snap, task) in joined.items() if task is not None}

    async def _joined(
        self, attempt_ids: Iterable[int], with_task: bool
    ) -> dict[int, tuple[Snapshot, TaskRecord | None]]:
        """The attempts of `attempt_ids` joined with their job and runtime row (each at most one
        per attempt: unique keys) and, `with_task`, their task; read without locks."""
        ids = sorted(set(attempt_ids))
        if not ids:
            return {}
        parts = [(A, "a__"), (provider_jobs, "j__"), (R, "r__")] + (
            [(T, "t__")] if with_task else []
        )
        query = (
            select(*(c.label(f"{prefix}{c.name}") for table, prefix in parts for c in table.c))
            .select_from(A)
            .outerjoin(provider_jobs, provider_jobs.c.attempt_id == A.c.id)
            .outerjoin(R, R.c.attempt_id == A.c.id)
            .where(A.c.id.in_(ids))
        )
        if with_task:
            query = query.outerjoin(T, T.c.id == A.c.task_id)
        async with self._db.reading() as conn:
            rows = (await conn.execute(query)).mappings().all()
        out: dict[int, tuple[Snapshot, TaskRecord | None]] = {}
        for m in rows:
            snap = _snapshot(m)
            task = _rows.task(_part(m, "t__")) if with_task and m["t__id"] is not None else None
            out[snap[0].id] = (snap, task)
        return out

    async def tasks(self, task_ids: Iterable[int]) -> dict[int, TaskRecord]:
        """The tasks that exist of `task_ids`, read without locks in one statement."""
        ids = sorted(set(task_ids))
        if not ids:
            return {}
        async with self._db.reading() as conn:
            rows = await conn.execute(select(T).where(T.c.id.in_(ids)))
            return {int(m["id"]): _rows.task(m) for m in rows.mappings()}

    async def snapshot_of_job(self, provider: str, job_id: str) -> Snapshot | None:
        """`snapshot` of the attempt that recorded the job `job_id` on an account of `provider`
        (a callback names the job, not the attempt), found by the job in ONE statement."""
        parts = [(A, "a__"), (provider_jobs, "j__"), (R, "r__")]
        query = (
            select(*(c.label(f"{prefix}{c.name}") for table, prefix in parts for c in table.c))
            .select_from(provider_jobs)
            .join(provider_accounts, provider_accounts.c.id == provider_jobs.c.provider_account_id)
            .join(A, A.c.id == provider_jobs.c.attempt_id)
            .outerjoin(R, R.c.attempt_id == A.c.id)
            .where(
                provider_accounts.c.provider == provider, provider_jobs.c.provider_job_id == job_id
            )
        )
        async with self._db.reading() as conn:
            found = (await conn.execute(query)).mappings().first()
        return None if found is None else _snapshot(found)

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
        async with self._db.reading() as conn:
            return [_rows.provider_event(m) for m in (await conn.execute(query)).mappings()]

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None:
        async with self._db.reading() as conn:
            return await _reads.runtime(conn, attempt_id)

    async def known_job_ids(self, account_id: int, job_ids: Iterable[str]) -> set[str]:
        ids = sorted(set(job_ids))
        if not ids:
            return set()
        async with self._db.reading() as conn:
            rows = await conn.execute(
                select(provider_jobs.c.provider_job_id).where(
                    provider_jobs.c.provider_account_id == account_id,
                    provider_jobs.c.provider_job_id.in_(ids),
                )
            )
            return {str(i) for i in rows.scalars()}


def _part(m: RowMapping, prefix: str) -> RowMapping:
    """The columns of one table of a joined row, by their own names."""
    return cast(RowMapping, {k[len(prefix) :]: v for k, v in m.items() if k.startswith(prefix)})


def _snapshot(m: RowMapping) -> Snapshot:
    """The attempt, job and runtime parts of a joined row (`_joined`, `snapshot_of_job`)."""
    attempt = _rows.attempt(_part(m, "a__"))
    job = _rows.provider_job(_part(m, "j__")) if m["j__id"] is not None else None
    runtime = _rows.runtime(_part(m, "r__")) if m["r__attempt_id"] is not None else None
    return attempt, job, runtime

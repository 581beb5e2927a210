"""The execution engine's writes of `SqlUnitOfWork`: provider jobs, runtime rows, provider
events, and the claims of due polls and recoveries (internal; see `unit`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.states import POLLABLE_ATTEMPT_STATES, AttemptState
from controlplane.persistence import _deferred, _rows
from controlplane.persistence.errors import DuplicateRecord
from controlplane.persistence.models import attempt_runtime as R
from controlplane.persistence.models import provider_events as E
from controlplane.persistence.models import provider_jobs
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.models import task_events as TE
from controlplane.persistence.records import NewProviderJob, ProviderJobRecord, TaskEventRecord
from vidroute_core.exceptions import NotFound

#: A provider event's dedup key (the unique index of ``provider_events``).
_EVENT_KEY = ("provider_account_id", "provider_job_id", "raw_status", "payload_hash")


def _insert_for(conn: AsyncConnection, table: Table) -> Any:
    """The dialect's INSERT, which has ``on_conflict_do_*`` on both PostgreSQL and SQLite."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


class ExecutionWrites:
    """Mixed into `SqlUnitOfWork`; uses its connection, clock and task events."""

    conn: AsyncConnection
    _direct: AsyncConnection
    now: datetime
    _writes: _deferred.Deferred
    _held: _deferred.Held

    async def _flush_writes(self) -> None:
        raise NotImplementedError  # `SqlUnitOfWork._flush_writes`

    def add_event(
        self,
        task_id: int,
        kind: str,
        payload: Mapping[str, Any],
        outputs: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        raise NotImplementedError  # `SqlUnitOfWork.add_event`

    async def flush_events(self) -> None:
        raise NotImplementedError  # `SqlUnitOfWork.flush_events`

    async def insert_job(
        self, job: NewProviderJob, *, task_id: int | None = None
    ) -> tuple[ProviderJobRecord, bool]:
        """Record the attempt's provider job; ``(job, created)``.

        Recording the same ``(attempt, account, provider_job_id)`` again returns the stored row
        with ``created=False``. A different job for the attempt, or a job id already bound to
        another attempt, raises `DuplicateRecord` (9.3.4: a job is never overwritten). Raises
        `NotFound` if the attempt does not exist. `task_id`: the attempt's task, from a caller
        that holds the attempt's row (it is not read again); else read here.
        """
        if task_id is None:
            task_id = await self.conn.scalar(select(A.c.task_id).where(A.c.id == job.attempt_id))
        if task_id is None:
            raise NotFound("attempt", str(job.attempt_id))
        # Kept writes to jobs go out first (a read of the table sees them); with none pending the
        # statements need not send the unit's other kept writes (`_deferred`).
        conn = self.conn if self._writes.jobs else self._direct
        # The INSERT first, ON CONFLICT DO NOTHING: a stored row under either unique key (a
        # replay, another job for the attempt, the job id on another attempt, or a concurrent
        # writer's) makes it insert nothing, and only then is the stored row read to tell a
        # replay from a conflict. A new job, the usual case, costs this one statement; the
        # transaction stays usable either way (no SAVEPOINT + RELEASE).
        row = (
            (
                await conn.execute(
                    _insert_for(conn, provider_jobs)
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
                    .on_conflict_do_nothing()
                    .returning(provider_jobs)
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            stored = await self._job_like(job, conn)
            if stored is not None:
                return stored, False
            raise DuplicateRecord(
                f"provider job {job.provider_job_id!r} conflicts with a recorded job"
            )
        record = _rows.provider_job(row)
        if job.attempt_id in self._held.jobs_of:  # a held attempt has its job now
            self._held.jobs_of[job.attempt_id] = record
            self._held.jobs[record.provider_account_id, record.provider_job_id] = record
        payload = {
            "attempt_id": job.attempt_id,
            "provider_job_id": job.provider_job_id,
            "normalized_status": job.normalized_status.value,
        }
        self.add_event(int(task_id), "provider_job.recorded", payload)
        return record, True

    async def _job_like(
        self, job: NewProviderJob, conn: AsyncConnection
    ) -> ProviderJobRecord | None:
        """The stored replay of `job`, None if nothing is stored, `DuplicateRecord` if another
        job is stored for the attempt or under the job id (both keys read in one statement)."""
        rows = await conn.execute(
            select(provider_jobs).where(
                (provider_jobs.c.attempt_id == job.attempt_id)
                | (
                    (provider_jobs.c.provider_account_id == job.provider_account_id)
                    & (provider_jobs.c.provider_job_id == job.provider_job_id)
                )
            )
        )
        found = [_rows.provider_job(m) for m in rows.mappings()]
        if not found:
            return None
        for stored in found:
            if (stored.attempt_id, stored.provider_account_id, stored.provider_job_id) == (
                job.attempt_id,
                job.provider_account_id,
                job.provider_job_id,
            ):
                return stored
        raise DuplicateRecord(f"provider job {job.provider_job_id!r} conflicts with a recorded job")

    async def update_job(self, job_row_id: int, **values: Any) -> None:
        """Set columns of a provider job row (deferred: `_deferred`)."""
        self._writes.jobs.setdefault(job_row_id, {}).update(values)
        self._held.forget_job(job_row_id)

    async def set_runtime(self, attempt_id: int, task_id: int, **values: Any) -> None:
        """Upsert the attempt's runtime row, setting only the named columns (deferred)."""
        values["updated_at"] = self.now
        if self._writes.conflicts(attempt_id, values):
            await self._flush_writes()  # the pending increments first, as they were made
        self._writes.set_runtime(attempt_id, task_id, values)
        self._held.set_runtime(attempt_id, values)

    async def bump_runtime(self, attempt_id: int, task_id: int, column: str) -> None:
        """Add one to a counter column of the runtime row, creating the row if needed
        (deferred)."""
        if column not in R.c:
            raise KeyError(f"attempt_runtime has no column {column!r}")
        self._writes.bump(attempt_id, task_id, column, self.now)
        self._held.bump(attempt_id, column)

    async def insert_events(self, rows: Sequence[Mapping[str, Any]]) -> list[int | None]:
        """Store observations in ONE statement; per row its id, or None when the same (job,
        raw status, payload hash) is stored already or earlier in `rows` (a duplicate)."""
        if not rows:
            return []
        stmt = (
            _insert_for(self.conn, E)
            .values([dict(r) for r in rows])
            .on_conflict_do_nothing(index_elements=[E.c[k] for k in _EVENT_KEY])
            .returning(E.c.id, *(E.c[k] for k in _EVENT_KEY))
        )
        stored = {tuple(r[1:]): int(r[0]) for r in await self.conn.execute(stmt)}
        out: list[int | None] = []
        for r in rows:
            out.append(stored.pop(tuple(r[k] for k in _EVENT_KEY), None))
        return out

    async def unmatched(self, refs: Sequence[tuple[int, str]]) -> set[tuple[int, str]]:
        """Of the (account, job id) pairs, those with an observation stored UNMATCHED (it beat
        the job's record), in ONE statement."""
        if not refs:
            return set()
        conn = self.conn if self._writes.outcomes else self._direct  # as `insert_job`
        rows = await conn.execute(
            select(E.c.provider_account_id, E.c.provider_job_id)
            .where(
                tuple_(E.c.provider_account_id, E.c.provider_job_id).in_(sorted(set(refs))),
                E.c.outcome == "UNMATCHED",
            )
            .distinct()
        )
        return {(int(a), str(j)) for a, j in rows}

    async def set_event_outcome(self, event_id: int, outcome: str) -> None:
        """Set a stored observation's outcome (deferred)."""
        self._writes.outcomes[event_id] = outcome

    async def last_task_event(self, task_id: int, kind: str) -> TaskEventRecord | None:
        """The task's newest event of `kind` (a backward walk of its ``(task_id, seq)`` key),
        this unit's own included."""
        await self.flush_events()
        row = (
            (
                await self.conn.execute(
                    select(TE)
                    .where(TE.c.task_id == task_id, TE.c.kind == kind)
                    .order_by(TE.c.seq.desc())
                    .limit(1)
                )
            )
            .mappings()
            .first()
        )
        return None if row is None else _rows.task_event(row)

    async def append_task_event(self, task_id: int, kind: str, payload: Mapping[str, Any]) -> None:
        """Append an event that is no state change (e.g. provider progress)."""
        self.add_event(task_id, kind, payload)

    # ---- claims: a claim pushes the due time past its lease, so it is a write -------------

    async def claim_polls(self, worker: str, *, limit: int, lease_s: float) -> list[int]:
        """Attempts whose poll is due, claimed with SKIP LOCKED (PostgreSQL)."""
        return await self._claim(
            R.c.next_poll_at, POLLABLE_ATTEMPT_STATES, limit=limit, lease_s=lease_s
        )

    async def claim_recoveries(self, worker: str, *, limit: int, lease_s: float) -> list[int]:
        """SUBMIT_UNKNOWN attempts whose recovery step is due, claimed like polls."""
        states = (AttemptState.SUBMIT_UNKNOWN,)
        return await self._claim(R.c.next_recovery_at, states, limit=limit, lease_s=lease_s)

    async def claim_late_lookups(self, worker: str, *, limit: int, lease_s: float) -> list[int]:
        """ABANDONED attempts whose background lookup is due (same due column as recovery)."""
        states = (AttemptState.ABANDONED,)
        return await self._claim(R.c.next_recovery_at, states, limit=limit, lease_s=lease_s)

    async def _claim(
        self, column: Any, states: Iterable[AttemptState], *, limit: int, lease_s: float
    ) -> list[int]:
        """Claim up to `limit` due rows in due order (earliest first, then attempt id).

        The due rows come off the front of the partial due-time index (``ix_attempt_runtime_
        poll_due`` / ``_recovery_due``, only rows whose time is set) in its order, locked with
        SKIP LOCKED so concurrent claimers take disjoint sets, and the claim pushes their due
        time past the lease in the same transaction (on PostgreSQL in the same statement): a
        crashed worker's claim simply expires.
        """
        now = self.now
        pushed = {column.name: now + timedelta(seconds=lease_s), "updated_at": now}
        due = (
            select(R.c.attempt_id.label("claimed_id"), column.label("due_at"))
            .join(A, A.c.id == R.c.attempt_id)
            .where(
                column.is_not(None),
                column <= now,
                A.c.status.in_(sorted(s.value for s in states)),
            )
            .order_by(column, R.c.attempt_id)
            .limit(limit)
            .with_for_update(skip_locked=True, of=R)
        )
        if self.conn.dialect.name == "postgresql":
            # ONE statement (UPDATE ... FROM the locked due rows ... RETURNING), atomic by
            # itself, so the claim needs no BEGIN/COMMIT (`Database.unit(one_statement=True)`).
            # SQLite cannot return the FROM side's due time, so it keeps the two statements.
            locked = due.subquery("due")
            claimed = await self.conn.execute(
                update(R)
                .where(R.c.attempt_id == locked.c.claimed_id)
                .values(pushed)
                .returning(R.c.attempt_id, locked.c.due_at)
            )
            return [int(i) for i, _ in sorted(claimed, key=lambda r: (r[1], r[0]))]
        ids = [int(i) for i, _ in await self.conn.execute(due)]
        if ids:
            # The rows stay locked until this transaction ends, so no one claims them meanwhile.
            await self.conn.execute(update(R).where(R.c.attempt_id.in_(ids)).values(pushed))
        return ids

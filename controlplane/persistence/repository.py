"""`Store`: the one seam between the control plane and its database (PostgreSQL or SQLite).

Every public method is one transaction. State changes are the compare-and-set of design 9.8.1::

    UPDATE ... SET status = :new, status_version = status_version + 1
     WHERE id = :id AND status_version = :expected AND status IN (:allowed_from)

where ``allowed_from`` comes from `TASK_MACHINE` / `ATTEMPT_MACHINE`; the store enforces the
transition tables but makes no decisions of its own. A change that wins its CAS appends a
`task_events` row (numbered by ``generation_tasks.last_event_seq``, which the same UPDATE bumps, so
the row lock orders concurrent writers) and any outbox messages in the same transaction.

Clocks are injected: every write takes ``now`` (an aware datetime) from the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, literal_column, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.domain.states import ATTEMPT_MACHINE, AttemptState, TaskState
from controlplane.persistence import _rows, _sql
from controlplane.persistence.errors import ConcurrentModification, DuplicateRecord
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import outbox as O
from controlplane.persistence.models import (
    provider_accounts,
    provider_jobs,
    route_decisions,
    task_attempts,
    task_events,
)
from controlplane.persistence.records import (
    AttemptChanges,
    AttemptRecord,
    Failure,
    NewAttempt,
    NewOutboxMessage,
    NewProviderJob,
    NewRouteDecision,
    OutboxRecord,
    ProviderJobRecord,
    RouteDecisionRecord,
    TaskDetail,
    TaskEventRecord,
    TaskRecord,
)
from vidroute_core.codec import spec_to_dict
from vidroute_core.exceptions import NotFound
from vidroute_core.spec import GenerationSpec

A = task_attempts
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
_INITIAL_ATTEMPT_STATES = frozenset(
    {AttemptState.CREATED, AttemptState.RESERVING, AttemptState.READY_TO_SUBMIT}
)


class Store:
    """Async unit of work over one engine; safe to share between tasks and coroutines."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def ping(self) -> None:
        """Round-trip ``SELECT 1``; raises whatever the driver raises when the database is down."""
        async with self._engine.connect() as conn:
            await conn.execute(select(literal_column("1")))

    # ---- reference data -------------------------------------------------------------------

    async def create_provider_account(
        self,
        *,
        provider: str,
        account_name: str,
        region: str,
        credential_ref: str,
        status: str = "ACTIVE",
        config: Mapping[str, Any] | None = None,
        now: datetime,
    ) -> int:
        """Insert a provider account (credential *reference* only) and return its id."""
        async with self._engine.begin() as conn:
            return int(
                await conn.scalar(
                    insert(provider_accounts)
                    .values(
                        provider=provider,
                        account_name=account_name,
                        region=region,
                        credential_ref=credential_ref,
                        status=status,
                        config=dict(config or {}),
                        created_at=now,
                        updated_at=now,
                    )
                    .returning(provider_accounts.c.id)
                )
            )

    # ---- tasks ----------------------------------------------------------------------------

    async def create_task(
        self,
        spec: GenerationSpec,
        *,
        idempotency_key: str,
        spec_hash: str,
        now: datetime,
        queue_deadline_at: datetime | None = None,
        deadline_at: datetime | None = None,
    ) -> tuple[TaskRecord, bool]:
        """Insert a QUEUED task with its first event and a ``task.queued`` outbox message.

        Returns ``(task, created)``. A replay of ``(tenant, idempotency_key)`` with the same
        `spec_hash` returns the stored task with ``created=False``; with another hash it raises
        `IdempotencyConflict`. Concurrent creators race on the UNIQUE constraint: the loser's
        insert fails and it returns the winner's row.
        """
        existing = await self._task_by_key(spec.tenant_id, idempotency_key)
        if existing is not None:
            return _sql.replay(existing, spec_hash), False
        try:
            async with self._engine.begin() as conn:
                row = (
                    (
                        await conn.execute(
                            insert(T)
                            .values(
                                tenant_id=spec.tenant_id,
                                user_id=spec.user_id,
                                project_id=spec.project_id,
                                idempotency_key=idempotency_key,
                                spec=spec_to_dict(spec),
                                normalized_spec_hash=spec_hash,
                                service_class=spec.service_class.value,
                                priority=spec.priority,
                                status=TaskState.QUEUED.value,
                                status_version=0,
                                last_event_seq=1,
                                queue_deadline_at=queue_deadline_at,
                                deadline_at=deadline_at,
                                created_at=now,
                                updated_at=now,
                            )
                            .returning(T)
                        )
                    )
                    .mappings()
                    .one()
                )
                record = _rows.task(row)
                queued = _sql.state_payload(TaskState.QUEUED, 0)
                await _sql.append_event(conn, record.id, 1, "task.queued", queued, now=now)
                await _sql.enqueue(
                    conn,
                    NewOutboxMessage(
                        topic="task.queued",
                        aggregate_id=str(record.id),
                        payload={
                            "task_id": record.id,
                            "tenant_id": record.tenant_id,
                            "service_class": record.service_class.value,
                            "priority": record.priority,
                        },
                    ),
                    now,
                )
                return record, True
        except IntegrityError:
            existing = await self._task_by_key(spec.tenant_id, idempotency_key)
            if existing is None:
                raise  # some other constraint; not an idempotent replay
            return _sql.replay(existing, spec_hash), False

    async def get_task(self, task_id: int) -> TaskDetail | None:
        """The task with its attempts, provider jobs and route decisions, or None."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(T).where(T.c.id == task_id))).mappings().first()
            if row is None:
                return None
            attempts = await conn.execute(
                select(A).where(A.c.task_id == task_id).order_by(A.c.attempt_no)
            )
            jobs = await conn.execute(
                select(provider_jobs)
                .join(A, A.c.id == provider_jobs.c.attempt_id)
                .where(A.c.task_id == task_id)
                .order_by(provider_jobs.c.id)
            )
            decisions = await conn.execute(
                select(route_decisions)
                .where(route_decisions.c.task_id == task_id)
                .order_by(route_decisions.c.decision_no)
            )
            return TaskDetail(
                task=_rows.task(row),
                attempts=tuple(_rows.attempt(m) for m in attempts.mappings()),
                provider_jobs=tuple(_rows.provider_job(m) for m in jobs.mappings()),
                route_decisions=tuple(_rows.route_decision(m) for m in decisions.mappings()),
            )

    async def list_tasks(
        self,
        *,
        tenant_id: str | None = None,
        state: TaskState | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str | None = None,
    ) -> tuple[list[TaskRecord], str | None]:
        """One page of tasks, newest first (descending id), and the token of the next page.

        Keyset pagination on ``id``: a page never repeats or skips a task because of inserts
        between calls. ``page_size <= 0`` means the default; it is capped at `MAX_PAGE_SIZE`.
        The token is opaque, bound to the filters it was issued for, and None on the last page.
        """
        size = DEFAULT_PAGE_SIZE if page_size <= 0 else min(page_size, MAX_PAGE_SIZE)
        filters = _sql.filter_fingerprint(tenant_id, state)
        query = select(T).order_by(T.c.id.desc()).limit(size + 1)
        if tenant_id is not None:
            query = query.where(T.c.tenant_id == tenant_id)
        if state is not None:
            query = query.where(T.c.status == state.value)
        if page_token:
            query = query.where(T.c.id < _sql.decode_token(page_token, filters))
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        records = [_rows.task(m) for m in rows[:size]]
        more = len(rows) > size
        return records, (_sql.encode_token(records[-1].id, filters) if more else None)

    async def task_events(
        self, task_id: int, *, after_seq: int = 0, limit: int = 100
    ) -> list[TaskEventRecord]:
        """The task's events with ``seq > after_seq`` in order (WatchTask replays from here)."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(task_events)
                .where(task_events.c.task_id == task_id, task_events.c.seq > after_seq)
                .order_by(task_events.c.seq)
                .limit(limit)
            )
            return [_rows.task_event(m) for m in rows.mappings()]

    async def transition_task(
        self,
        task_id: int,
        expected_version: int,
        target: TaskState,
        *,
        now: datetime,
        reason: str = "",
        failure: Failure | None = None,
        adopted_attempt_id: int | None = None,
        output_asset: Mapping[str, Any] | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> bool:
        """CAS the task to `target`; True if it applied. Optional columns are set only if given."""
        async with self._engine.begin() as conn:
            seq = await _sql.cas_task(
                conn,
                task_id,
                expected_version,
                target,
                now=now,
                events=1,
                extra=_sql.task_extra(failure, adopted_attempt_id, output_asset),
            )
            if seq is None:
                return False
            payload = _sql.state_payload(target, expected_version + 1, reason, failure)
            await _sql.append_event(conn, task_id, seq, "task.state_changed", payload, now=now)
            for message in outbox:
                await _sql.enqueue(conn, message, now)
            return True

    async def cancel_queued_task(
        self, task_id: int, *, now: datetime, reason: str = ""
    ) -> TaskRecord:
        """Cancel the task if it is still QUEUED; return its current record either way.

        The caller compares ``record.state`` with CANCELLED to learn whether it won. Raises
        `NotFound` if there is no such task.
        """
        async with self._engine.begin() as conn:
            current = (await conn.execute(select(T).where(T.c.id == task_id))).mappings().first()
            if current is None:
                raise NotFound("task", str(task_id))
            if current["status"] == TaskState.QUEUED.value:
                version = current["status_version"]
                seq = await _sql.cas_task(
                    conn, task_id, version, TaskState.CANCELLED, now=now, events=1
                )
                if seq is not None:
                    payload = _sql.state_payload(TaskState.CANCELLED, version + 1, reason)
                    await _sql.append_event(
                        conn, task_id, seq, "task.state_changed", payload, now=now
                    )
                current = (await conn.execute(select(T).where(T.c.id == task_id))).mappings().one()
            return _rows.task(current)

    # ---- attempts -------------------------------------------------------------------------

    async def create_attempt_with_decision(
        self,
        task_id: int,
        expected_task_version: int,
        attempt: NewAttempt,
        decision: NewRouteDecision,
        *,
        now: datetime,
        outbox_topic: str = "attempt.submit",
        outbox_payload: Mapping[str, Any] | None = None,
    ) -> tuple[AttemptRecord, RouteDecisionRecord]:
        """Persist the scheduler's choice atomically (design 9.10 / 9.10.1).

        In one transaction: task SCHEDULING -> SUBMITTING (CAS on `expected_task_version`), the
        next RouteDecision, the next Attempt pointing at it, an outbox message on `outbox_topic`
        whose payload is `outbox_payload` plus ``task_id`` and ``attempt_id``, and two events.
        Raises `ConcurrentModification` if the task CAS loses and `DuplicateRecord` if the
        ``(account, client_request_key)`` is taken; either way nothing is written.
        """
        if attempt.initial_state not in _INITIAL_ATTEMPT_STATES:
            raise ValueError(f"an attempt cannot start in {attempt.initial_state.value}")
        try:
            async with self._engine.begin() as conn:
                seq = await _sql.cas_task(
                    conn, task_id, expected_task_version, TaskState.SUBMITTING, now=now, events=2
                )
                if seq is None:
                    raise ConcurrentModification(
                        f"task {task_id} is not SCHEDULING at version {expected_task_version}"
                    )
                decision_row = await _sql.insert_decision(conn, task_id, decision, now)
                attempt_row = await _sql.insert_attempt(
                    conn, task_id, attempt, decision_row.id, now
                )
                payload = _sql.state_payload(TaskState.SUBMITTING, expected_task_version + 1)
                await _sql.append_event(
                    conn, task_id, seq - 1, "task.state_changed", payload, now=now
                )
                created = _sql.attempt_payload(attempt_row)
                await _sql.append_event(conn, task_id, seq, "attempt.created", created, now=now)
                body = {**(outbox_payload or {}), "task_id": task_id, "attempt_id": attempt_row.id}
                await _sql.enqueue(
                    conn, NewOutboxMessage(outbox_topic, str(attempt_row.id), body), now
                )
                return attempt_row, decision_row
        except IntegrityError as exc:
            raise DuplicateRecord(
                f"attempt for task {task_id} violates a UNIQUE constraint"
            ) from exc

    async def get_attempt(self, attempt_id: int) -> AttemptRecord | None:
        """The attempt, or None."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(A).where(A.c.id == attempt_id))).mappings().first()
            return None if row is None else _rows.attempt(row)

    async def transition_attempt(
        self,
        attempt_id: int,
        expected_version: int,
        target: AttemptState,
        *,
        now: datetime,
        reason: str = "",
        changes: AttemptChanges | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> bool:
        """CAS the attempt to `target`; True if it applied. `changes` fields set when not None."""
        allowed = ATTEMPT_MACHINE.allowed_from(target)
        if not allowed:
            return False
        values: dict[str, Any] = _sql.attempt_extra(changes)
        values.update(status=target.value, status_version=A.c.status_version + 1, updated_at=now)
        async with self._engine.begin() as conn:
            row = (
                (
                    await conn.execute(
                        update(A)
                        .where(
                            A.c.id == attempt_id,
                            A.c.status_version == expected_version,
                            A.c.status.in_(sorted(s.value for s in allowed)),
                        )
                        .values(values)
                        .returning(A)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                return False
            record = _rows.attempt(row)
            seq = await _sql.next_seq(conn, record.task_id)
            payload = {**_sql.attempt_payload(record), "reason": reason}
            await _sql.append_event(
                conn, record.task_id, seq, "attempt.state_changed", payload, now=now
            )
            for message in outbox:
                await _sql.enqueue(conn, message, now)
            return True

    async def record_provider_job(
        self, job: NewProviderJob, *, now: datetime
    ) -> tuple[ProviderJobRecord, bool]:
        """Insert the attempt's provider job; ``(job, created)``.

        Recording the same ``(attempt, account, provider_job_id)`` again returns the stored row
        with ``created=False``. A different job for the attempt, or a job id already bound to
        another attempt, raises `DuplicateRecord` (9.3.4: a job is never overwritten).
        Raises `NotFound` if the attempt does not exist.
        """
        try:
            async with self._engine.begin() as conn:
                task_id = await conn.scalar(select(A.c.task_id).where(A.c.id == job.attempt_id))
                if task_id is None:
                    raise NotFound("attempt", str(job.attempt_id))
                row = (
                    (
                        await conn.execute(
                            insert(provider_jobs)
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
                                created_at=now,
                            )
                            .returning(provider_jobs)
                        )
                    )
                    .mappings()
                    .one()
                )
                record = _rows.provider_job(row)
                seq = await _sql.next_seq(conn, task_id)
                payload = {
                    "attempt_id": job.attempt_id,
                    "provider_job_id": job.provider_job_id,
                    "normalized_status": job.normalized_status.value,
                }
                await _sql.append_event(
                    conn, task_id, seq, "provider_job.recorded", payload, now=now
                )
                return record, True
        except IntegrityError as exc:
            existing = await self._job_for(job)
            if existing is not None and (
                existing.attempt_id,
                existing.provider_account_id,
                existing.provider_job_id,
            ) == (job.attempt_id, job.provider_account_id, job.provider_job_id):
                return existing, False
            raise DuplicateRecord(
                f"provider job {job.provider_job_id!r} conflicts with a recorded job"
            ) from exc

    # ---- outbox ---------------------------------------------------------------------------

    async def enqueue(self, message: NewOutboxMessage, *, now: datetime) -> int:
        """Add a message on its own (prefer the `outbox=` argument of a state change)."""
        async with self._engine.begin() as conn:
            return await _sql.enqueue(conn, message, now)

    async def claim(
        self, topic: str, worker: str, *, limit: int, lease_seconds: float, now: datetime
    ) -> list[OutboxRecord]:
        """Claim up to `limit` due messages of `topic` for `lease_seconds`, oldest first.

        A message is due when not done, ``available_at <= now`` and unclaimed or its claim has
        expired. On PostgreSQL the candidate rows are picked with ``FOR UPDATE SKIP LOCKED``, so
        concurrent claimers never get the same row; on SQLite the clause is not rendered and the
        single writer lock (``BEGIN IMMEDIATE``) serialises claimers instead.
        """
        due = (
            select(O.c.id)
            .where(
                O.c.topic == topic,
                O.c.done_at.is_(None),
                O.c.available_at <= now,
                (O.c.claimed_until.is_(None)) | (O.c.claimed_until < now),
            )
            .order_by(O.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        stmt = (
            update(O)
            .where(O.c.id.in_(select(due.c.id)))
            .values(
                claimed_by=worker,
                claimed_until=now + timedelta(seconds=lease_seconds),
                attempts=O.c.attempts + 1,
            )
            .returning(O)
        )
        async with self._engine.begin() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return sorted((_rows.outbox_message(m) for m in rows), key=lambda r: r.id)

    async def complete(self, message_id: int, worker: str, *, now: datetime) -> bool:
        """Mark a message done; False if `worker` no longer holds it or it is already done."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(O)
                .where(O.c.id == message_id, O.c.claimed_by == worker, O.c.done_at.is_(None))
                .values(done_at=now, claimed_until=None)
            )
            return result.rowcount == 1

    async def retry_later(self, message_id: int, worker: str, *, available_at: datetime) -> bool:
        """Release `worker`'s claim so the message becomes due again at `available_at`."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(O)
                .where(O.c.id == message_id, O.c.claimed_by == worker, O.c.done_at.is_(None))
                .values(claimed_by=None, claimed_until=None, available_at=available_at)
            )
            return result.rowcount == 1

    # ---- internals ------------------------------------------------------------------------

    async def _task_by_key(self, tenant_id: str, idempotency_key: str) -> TaskRecord | None:
        async with self._engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(T).where(
                            T.c.tenant_id == tenant_id, T.c.idempotency_key == idempotency_key
                        )
                    )
                )
                .mappings()
                .first()
            )
            return None if row is None else _rows.task(row)

    async def _job_for(self, job: NewProviderJob) -> ProviderJobRecord | None:
        async with self._engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(provider_jobs)
                        .where(
                            (provider_jobs.c.attempt_id == job.attempt_id)
                            | (
                                (provider_jobs.c.provider_account_id == job.provider_account_id)
                                & (provider_jobs.c.provider_job_id == job.provider_job_id)
                            )
                        )
                        .order_by(provider_jobs.c.id)
                    )
                )
                .mappings()
                .first()
            )
            return None if row is None else _rows.provider_job(row)

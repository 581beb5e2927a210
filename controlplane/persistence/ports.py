"""The persistence seam as the execution engine sees it: Protocols, no SQL.

`UnitOfWork` is one open transaction with the moves a worker makes and the locked reads it
makes them from; `UnitSource.unit(now)` opens one; `ExecutionReads` and `TaskReads` are the
lock-free reads a worker decides from. Two implementations: `unit.SqlUnitOfWork` from
`database.Database` (with `execution.ExecutionQueries` and `tasks.TaskQueries`) for PostgreSQL
and SQLite, and `memory.MemoryDatabase`, an in-memory fake with the same compare-and-set
semantics, for unit tests of execution rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

from controlplane.domain.requeue import RequeueRequest
from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence.ledger import NewUsage, UnitRate
from controlplane.persistence.quality import NewCheck
from controlplane.persistence.records import (
    AccountInfo,
    AttemptChanges,
    AttemptRecord,
    AttemptRuntime,
    Failure,
    NewOutboxMessage,
    NewProviderJob,
    OutboxRecord,
    ProviderEventRecord,
    ProviderJobRecord,
    TaskDetail,
    TaskEnd,
    TaskEventRecord,
    TaskRecord,
)
from controlplane.persistence.transitions import AttemptMove

__all__ = ["ExecutionReads", "TaskReads", "UnitOfWork", "UnitSource"]


class UnitOfWork(Protocol):
    """One transaction: everything in it commits together or not at all."""

    now: datetime

    # ---- reads (locked where they take `lock`) ----------------------------------------------

    async def hold(self, attempt_ids: Sequence[int]) -> None:
        """Lock the attempts and their tasks, and keep them with their jobs, runtime rows and
        their tasks' attempts for this unit's reads (a batch's rows, read once)."""
        ...

    async def attempt(self, attempt_id: int, *, lock: bool = True) -> AttemptRecord | None: ...

    async def task(self, task_id: int, *, lock: bool = True) -> TaskRecord | None: ...

    async def attempts_and_tasks(
        self, attempt_ids: Sequence[int]
    ) -> dict[int, tuple[AttemptRecord, TaskRecord]]:
        """The attempts and each one's task, locked, in one read (a batch's `attempt` + `task`)."""
        ...

    async def attempts_of(self, task_id: int) -> list[AttemptRecord]: ...

    async def job_of(self, attempt_id: int) -> ProviderJobRecord | None: ...

    async def job_by_ref(self, account_id: int, job_id: str) -> ProviderJobRecord | None: ...

    async def jobs_by_refs(
        self, refs: Sequence[tuple[int, str]]
    ) -> dict[tuple[int, str], ProviderJobRecord]:
        """`job_by_ref` of many in one read: the recorded jobs by (account, job id)."""
        ...

    async def account(self, account_id: int) -> AccountInfo: ...

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None: ...

    # ---- moves ------------------------------------------------------------------------------

    async def move_task(
        self,
        record: TaskRecord,
        target: TaskState,
        reason: str = "",
        *,
        failure: Failure | None = None,
        adopted_attempt_id: int | None = None,
        output_asset: Mapping[str, Any] | None = None,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> TaskRecord | None:
        """CAS from `record`'s state and version; None when forbidden or lost."""
        ...

    async def end_tasks(self, ends: Sequence[TaskEnd]) -> dict[int, TaskRecord]:
        """`move_task` into a terminal state for many, settled together; the moved by id."""
        ...

    async def move_attempt(
        self,
        record: AttemptRecord,
        target: AttemptState,
        reason: str = "",
        changes: AttemptChanges | None = None,
        *,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> AttemptRecord | None:
        """CAS from `record`'s state and version; None when forbidden or lost."""
        ...

    async def move_attempts(self, moves: Sequence[AttemptMove]) -> dict[int, AttemptRecord]:
        """`move_attempt` for many (`transitions.cas_attempts`): `IllegalTransition` before
        any write if one is forbidden; the moved attempts by id (a lost CAS is left out)."""
        ...

    async def insert_job(
        self, job: NewProviderJob, *, task_id: int | None = None
    ) -> tuple[ProviderJobRecord, bool]: ...

    async def unmatched(self, refs: Sequence[tuple[int, str]]) -> set[tuple[int, str]]:
        """Of the (account, job id) pairs, those with an observation stored UNMATCHED."""
        ...

    async def update_job(self, job_row_id: int, **values: Any) -> None: ...

    async def set_runtime(self, attempt_id: int, task_id: int, **values: Any) -> None: ...

    async def bump_runtime(self, attempt_id: int, task_id: int, column: str) -> None: ...

    async def insert_events(self, rows: Sequence[Mapping[str, Any]]) -> list[int | None]:
        """Store observations; per row its id, or None for a duplicate (stored already, or
        earlier in `rows`)."""
        ...

    async def set_event_outcome(self, event_id: int, outcome: str) -> None: ...

    async def last_task_event(self, task_id: int, kind: str) -> TaskEventRecord | None: ...

    async def append_task_event(
        self, task_id: int, kind: str, payload: Mapping[str, Any]
    ) -> None: ...

    async def record_requeue(self, request: RequeueRequest) -> None: ...

    async def record_usage(self, usage: NewUsage) -> None:
        """A provider usage entry, written once per its idempotency key (9.23.1)."""
        ...

    async def record_quality_checks(self, checks: Sequence[NewCheck]) -> int:
        """The probe's technical checks, once per (attempt, sample), counted (9.14)."""
        ...

    async def unit_rate(self, provider: str, rate_version: str) -> UnitRate | None: ...

    # ---- outbox and claims ------------------------------------------------------------------

    async def enqueue(self, message: NewOutboxMessage) -> int: ...

    async def claim_messages(
        self, topic: str, worker: str, *, limit: int, lease_seconds: float
    ) -> list[OutboxRecord]: ...

    async def complete_message(self, message_id: int, worker: str) -> bool: ...

    async def complete_messages(self, message_ids: Sequence[int], worker: str) -> set[int]:
        """`complete_message` for many at once: the ids marked done."""
        ...

    async def retry_message(
        self, message_id: int, worker: str, *, available_at: datetime
    ) -> bool: ...

    async def claim_polls(self, worker: str, *, limit: int, lease_s: float) -> list[int]: ...

    async def claim_recoveries(self, worker: str, *, limit: int, lease_s: float) -> list[int]: ...

    async def claim_late_lookups(self, worker: str, *, limit: int, lease_s: float) -> list[int]: ...


class UnitSource(Protocol):
    """What opens units of work (`Database`, `MemoryDatabase`)."""

    def unit(
        self, now: datetime, *, one_statement: bool = False
    ) -> AbstractAsyncContextManager[UnitOfWork]: ...


class ExecutionReads(Protocol):
    """The lock-free reads the execution engine decides from (`ExecutionQueries`)."""

    async def account(self, account_id: int) -> AccountInfo: ...

    async def snapshot(
        self, attempt_id: int
    ) -> tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None] | None: ...

    async def snapshots(
        self, attempt_ids: Iterable[int]
    ) -> dict[int, tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None]]: ...

    async def snapshots_and_tasks(
        self, attempt_ids: Iterable[int]
    ) -> dict[
        int,
        tuple[tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None], TaskRecord],
    ]: ...

    async def tasks(self, task_ids: Iterable[int]) -> dict[int, TaskRecord]: ...

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None: ...

    async def events(
        self,
        *,
        attempt_id: int | None = None,
        account_id: int | None = None,
        job_id: str | None = None,
    ) -> list[ProviderEventRecord]: ...

    async def snapshot_of_job(
        self, provider: str, job_id: str
    ) -> tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None] | None: ...

    async def known_job_ids(self, account_id: int, job_ids: Iterable[str]) -> set[str]: ...

    async def stale_submitting(self, *, started_before: datetime, limit: int) -> list[int]: ...

    async def attempts(self, attempt_ids: Iterable[int]) -> dict[int, AttemptRecord]: ...

    async def waiting_to_submit(self, *, after_id: int, limit: int) -> list[AttemptRecord]: ...


class TaskReads(Protocol):
    """A task with its history, read without locks (`tasks.TaskQueries`)."""

    async def get_task(self, task_id: int) -> TaskDetail | None: ...

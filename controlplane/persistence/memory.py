"""`MemoryDatabase`: an in-memory fake of the persistence ports, for unit tests of execution rules.

It implements `ports.UnitSource`, `ports.ExecutionReads` and `ports.TaskReads`, and its units
implement `ports.UnitOfWork`, with the semantics the SQL units have where a rule can tell:

* one unit at a time (an `asyncio.Lock`, like SQLite's ``BEGIN IMMEDIATE``), working on a copy
  of the state that replaces it only when the block exits normally: an exception rolls back;
* the compare-and-set of design 9.8.1: a move from a stale record (other state or version), or
  one the transition table forbids, returns None and writes nothing;
* a winning move bumps ``status_version``, appends the task event numbered like the database's
  ``last_event_seq``, and enqueues its outbox messages in the same unit;
* provider events are deduplicated by (account, job id, raw status, payload hash), provider jobs
  are never overwritten (`DuplicateRecord`), outbox claims respect ``available_at`` and expiry.

Rows are seeded with `add_account`, `add_task` and `add_attempt`; what a unit wrote is read back
with the ports' reads or the plain attributes (`outbox`, `task_events`, `requeues`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.domain.requeue import RequeueRequest
from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    POLLABLE_ATTEMPT_STATES,
    TASK_MACHINE,
    AttemptState,
    TaskState,
)
from controlplane.persistence import _sql
from controlplane.persistence.endings import Ending, log_endings
from controlplane.persistence.errors import DuplicateRecord
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
from vidroute_core.exceptions import NotFound
from vidroute_core.spec import GenerationSpec

__all__ = ["MemoryDatabase", "MemoryUnitOfWork"]

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_RUNTIME_DEFAULTS: dict[str, Any] = {
    f.name: (0 if f.type == "int" else False if f.type == "bool" else None)
    for f in fields(AttemptRuntime)
}


@dataclass
class _State:
    """Everything the fake stores; copied at the start of every unit."""

    ids: int = 0
    accounts: dict[int, AccountInfo] = field(default_factory=dict)
    tasks: dict[int, TaskRecord] = field(default_factory=dict)
    last_seq: dict[int, int] = field(default_factory=dict)
    attempts: dict[int, AttemptRecord] = field(default_factory=dict)
    jobs: dict[int, ProviderJobRecord] = field(default_factory=dict)
    runtimes: dict[int, AttemptRuntime] = field(default_factory=dict)
    events: dict[int, ProviderEventRecord] = field(default_factory=dict)
    outbox: dict[int, OutboxRecord] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    task_events: list[TaskEventRecord] = field(default_factory=list)
    requeues: list[RequeueRequest] = field(default_factory=list)
    # Provider usage entries by idempotency key (the fake has no credit ledger: its tasks are
    # created without a reservation, so they settle nothing, as in `ledger.settle_task`).
    usage: dict[str, NewUsage] = field(default_factory=dict)
    unit_rates: dict[tuple[str, str], UnitRate] = field(default_factory=dict)  # (provider, version)
    # Technical quality checks by (attempt, sample).
    quality_checks: dict[tuple[int, int], NewCheck] = field(default_factory=dict)

    def next_id(self) -> int:
        self.ids += 1
        return self.ids


class MemoryUnitOfWork:
    """One unit over a private copy of the state (see the module docstring)."""

    def __init__(self, state: _State, now: datetime) -> None:
        self._s = state
        self.now = now
        self.endings: list[Ending] = []  # logged once the unit committed (`endings`)

    # ---- reads ------------------------------------------------------------------------------

    async def hold(self, attempt_ids: Sequence[int]) -> None:
        return None  # one writer at a time: every row is this unit's already

    async def attempt(self, attempt_id: int, *, lock: bool = True) -> AttemptRecord | None:
        return self._s.attempts.get(attempt_id)

    async def task(self, task_id: int, *, lock: bool = True) -> TaskRecord | None:
        return self._s.tasks.get(task_id)

    async def attempts_and_tasks(
        self, attempt_ids: Sequence[int]
    ) -> dict[int, tuple[AttemptRecord, TaskRecord]]:
        out = {}
        for i in sorted(set(attempt_ids)):
            attempt = self._s.attempts.get(i)
            task = None if attempt is None else self._s.tasks.get(attempt.task_id)
            if attempt is not None and task is not None:
                out[i] = (attempt, task)
        return out

    async def attempts_of(self, task_id: int) -> list[AttemptRecord]:
        found = [a for a in self._s.attempts.values() if a.task_id == task_id]
        return sorted(found, key=lambda a: a.attempt_no)

    async def job_of(self, attempt_id: int) -> ProviderJobRecord | None:
        return next((j for j in self._s.jobs.values() if j.attempt_id == attempt_id), None)

    async def job_by_ref(self, account_id: int, job_id: str) -> ProviderJobRecord | None:
        return next(
            (
                j
                for j in self._s.jobs.values()
                if (j.provider_account_id, j.provider_job_id) == (account_id, job_id)
            ),
            None,
        )

    async def jobs_by_refs(
        self, refs: Sequence[tuple[int, str]]
    ) -> dict[tuple[int, str], ProviderJobRecord]:
        wanted = set(refs)
        return {
            (j.provider_account_id, j.provider_job_id): j
            for j in self._s.jobs.values()
            if (j.provider_account_id, j.provider_job_id) in wanted
        }

    async def account(self, account_id: int) -> AccountInfo:
        return self._s.accounts[account_id]

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None:
        return self._s.runtimes.get(attempt_id)

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
        stored = self._s.tasks.get(record.id)
        if (
            stored is None
            or not TASK_MACHINE.can(record.state, target)
            or (stored.state, stored.status_version) != (record.state, record.status_version)
        ):
            return None
        changes: dict[str, Any] = {}
        if failure is not None:
            changes["failure"] = failure
        if adopted_attempt_id is not None:
            changes["adopted_attempt_id"] = adopted_attempt_id
        if output_asset is not None:
            changes["output_asset"] = dict(output_asset)
        moved = replace(
            stored,
            state=target,
            status_version=stored.status_version + 1,
            updated_at=self.now,
            **changes,
        )
        self._s.tasks[moved.id] = moved
        if TASK_MACHINE.is_terminal(target):
            self.endings.append(Ending(moved.id, target.value, reason, failure))
        payload = _sql.state_payload(target, moved.status_version, reason, failure)
        self._event(moved.id, "task.state_changed", payload)
        for message in outbox:
            await self.enqueue(message)
        return moved

    async def end_tasks(self, ends: Sequence[TaskEnd]) -> dict[int, TaskRecord]:
        if len({e.record.id for e in ends}) != len(ends):
            raise ValueError("a task may be ended once per call")
        moved = {}
        for e in ends:
            if not TASK_MACHINE.is_terminal(e.target):
                raise ValueError(f"{e.target.value} is not a terminal task state")
            won = await self.move_task(
                e.record, e.target, e.reason, failure=e.failure, output_asset=e.output_asset
            )
            if won is not None:
                moved[won.id] = won
        return moved

    async def move_attempt(
        self,
        record: AttemptRecord,
        target: AttemptState,
        reason: str = "",
        changes: AttemptChanges | None = None,
        *,
        outbox: Sequence[NewOutboxMessage] = (),
    ) -> AttemptRecord | None:
        stored = self._s.attempts.get(record.id)
        if (
            stored is None
            or not ATTEMPT_MACHINE.can(record.state, target)
            or (stored.state, stored.status_version) != (record.state, record.status_version)
        ):
            return None
        values = {
            k: v
            for k, v in _sql.attempt_extra(changes).items()
            if k in AttemptRecord.__dataclass_fields__
        }
        if changes is not None and changes.failure is not None:
            values["failure"] = changes.failure
        moved = replace(
            stored,
            state=target,
            status_version=stored.status_version + 1,
            updated_at=self.now,
            **values,
        )
        self._s.attempts[moved.id] = moved
        if target is AttemptState.ABANDONED:
            failure = None if changes is None else changes.failure
            self.endings.append(Ending(moved.task_id, target.value, reason, failure, moved.id))
        self._event(
            moved.task_id,
            "attempt.state_changed",
            _sql.attempt_moved_payload(moved, reason, changes),
        )
        for message in outbox:
            await self.enqueue(message)
        return moved

    async def move_attempts(self, moves: Sequence[AttemptMove]) -> dict[int, AttemptRecord]:
        for m in moves:  # every edge asked before any write, as `transitions.cas_attempts`
            ATTEMPT_MACHINE.check(m.state, m.target)
        if len({m.attempt_id for m in moves}) != len(moves):
            raise ValueError("an attempt may be moved once per call")
        moved = {}
        for m in moves:
            stored = self._s.attempts.get(m.attempt_id)
            if stored is None or (stored.state, stored.status_version) != (
                m.state,
                m.expected_version,
            ):
                continue
            record = await self.move_attempt(stored, m.target, m.reason, m.changes)
            if record is not None:
                moved[record.id] = record
        return moved

    async def unmatched(self, refs: Sequence[tuple[int, str]]) -> set[tuple[int, str]]:
        wanted = set(refs)
        return {
            (e.provider_account_id, e.provider_job_id)
            for e in self._s.events.values()
            if e.outcome == "UNMATCHED" and (e.provider_account_id, e.provider_job_id) in wanted
        }

    async def insert_job(
        self, job: NewProviderJob, *, task_id: int | None = None
    ) -> tuple[ProviderJobRecord, bool]:
        attempt = self._s.attempts.get(job.attempt_id)
        if attempt is None:
            raise NotFound("attempt", str(job.attempt_id))
        found = await self.job_of(job.attempt_id) or await self.job_by_ref(
            job.provider_account_id, job.provider_job_id
        )
        if found is not None:
            same = (found.attempt_id, found.provider_account_id, found.provider_job_id) == (
                job.attempt_id,
                job.provider_account_id,
                job.provider_job_id,
            )
            if same:
                return found, False
            raise DuplicateRecord(
                f"provider job {job.provider_job_id!r} conflicts with a recorded job"
            )
        record = ProviderJobRecord(
            id=self._s.next_id(),
            attempt_id=job.attempt_id,
            provider_account_id=job.provider_account_id,
            provider_job_id=job.provider_job_id,
            provider_request_id=job.provider_request_id,
            raw_status=job.raw_status,
            normalized_status=job.normalized_status,
            output_locator=job.output_locator,
            raw_failure=job.raw_failure,
            submitted_at=job.submitted_at,
            last_polled_at=None,
            completed_at=None,
            created_at=self.now,
        )
        self._s.jobs[record.id] = record
        self._event(
            attempt.task_id,
            "provider_job.recorded",
            {
                "attempt_id": job.attempt_id,
                "provider_job_id": job.provider_job_id,
                "normalized_status": job.normalized_status.value,
            },
        )
        return record, True

    async def update_job(self, job_row_id: int, **values: Any) -> None:
        job = self._s.jobs[job_row_id]
        if isinstance(values.get("normalized_status"), str):
            values["normalized_status"] = AttemptState(values["normalized_status"])
        self._s.jobs[job_row_id] = replace(job, **values)

    async def set_runtime(self, attempt_id: int, task_id: int, **values: Any) -> None:
        current = self._s.runtimes.get(attempt_id) or AttemptRuntime(
            **{**_RUNTIME_DEFAULTS, "attempt_id": attempt_id, "task_id": task_id}
        )
        self._s.runtimes[attempt_id] = replace(current, **values)

    async def bump_runtime(self, attempt_id: int, task_id: int, column: str) -> None:
        await self.set_runtime(attempt_id, task_id)
        current = self._s.runtimes[attempt_id]
        self._s.runtimes[attempt_id] = replace(current, **{column: getattr(current, column) + 1})

    async def insert_events(self, rows: Sequence[Mapping[str, Any]]) -> list[int | None]:
        out: list[int | None] = []
        for values in rows:
            key = (
                values["provider_account_id"],
                values["provider_job_id"],
                values["raw_status"],
                values["payload_hash"],
            )
            stored = self._s.events.values()
            if any(
                (e.provider_account_id, e.provider_job_id, e.raw_status, e.payload_hash) == key
                for e in stored
            ):
                out.append(None)
                continue
            event = ProviderEventRecord(id=self._s.next_id(), **values)
            self._s.events[event.id] = event
            out.append(event.id)
        return out

    async def set_event_outcome(self, event_id: int, outcome: str) -> None:
        self._s.events[event_id] = replace(self._s.events[event_id], outcome=outcome)

    async def last_task_event(self, task_id: int, kind: str) -> TaskEventRecord | None:
        found = [e for e in self._s.task_events if e.task_id == task_id and e.kind == kind]
        return found[-1] if found else None

    async def append_task_event(self, task_id: int, kind: str, payload: Mapping[str, Any]) -> None:
        self._event(task_id, kind, payload)

    async def record_requeue(self, request: RequeueRequest) -> None:
        self._s.requeues.append(request)

    async def record_usage(self, usage: NewUsage) -> None:
        self._s.usage.setdefault(usage.idempotency_key, usage)

    async def unit_rate(self, provider: str, rate_version: str) -> UnitRate | None:
        return self._s.unit_rates.get((provider, rate_version))

    async def record_quality_checks(self, checks: Sequence[NewCheck]) -> int:
        new = [c for c in checks if (c.attempt_id, c.sample_index) not in self._s.quality_checks]
        for c in new:
            self._s.quality_checks[(c.attempt_id, c.sample_index)] = c
        return len(new)

    # ---- outbox and claims ------------------------------------------------------------------

    async def enqueue(self, message: NewOutboxMessage) -> int:
        record = OutboxRecord(
            id=self._s.next_id(),
            topic=message.topic,
            aggregate_id=message.aggregate_id,
            payload=dict(message.payload),
            created_at=self.now,
            available_at=message.available_at or self.now,
            claimed_by=None,
            claimed_until=None,
            attempts=0,
        )
        self._s.outbox[record.id] = record
        return record.id

    async def claim_messages(
        self, topic: str, worker: str, *, limit: int, lease_seconds: float
    ) -> list[OutboxRecord]:
        due = [
            m
            for m in sorted(self._s.outbox.values(), key=lambda m: m.id)
            if m.topic == topic
            and m.id not in self._s.done
            and m.available_at <= self.now
            and (m.claimed_until is None or m.claimed_until < self.now)
        ][:limit]
        claimed = []
        for m in due:
            until = self.now + timedelta(seconds=lease_seconds)
            updated = replace(m, claimed_by=worker, claimed_until=until, attempts=m.attempts + 1)
            self._s.outbox[m.id] = updated
            claimed.append(updated)
        return claimed

    async def complete_message(self, message_id: int, worker: str) -> bool:
        m = self._s.outbox.get(message_id)
        if m is None or m.claimed_by != worker or message_id in self._s.done:
            return False
        self._s.done.add(message_id)
        self._s.outbox[message_id] = replace(m, claimed_until=None)
        return True

    async def complete_messages(self, message_ids: Sequence[int], worker: str) -> set[int]:
        return {i for i in message_ids if await self.complete_message(i, worker)}

    async def retry_message(self, message_id: int, worker: str, *, available_at: datetime) -> bool:
        m = self._s.outbox.get(message_id)
        if m is None or m.claimed_by != worker or message_id in self._s.done:
            return False
        self._s.outbox[message_id] = replace(
            m, claimed_by=None, claimed_until=None, available_at=available_at
        )
        return True

    async def claim_polls(self, worker: str, *, limit: int, lease_s: float) -> list[int]:
        return self._claim("next_poll_at", POLLABLE_ATTEMPT_STATES, limit, lease_s)

    async def claim_recoveries(self, worker: str, *, limit: int, lease_s: float) -> list[int]:
        return self._claim("next_recovery_at", {AttemptState.SUBMIT_UNKNOWN}, limit, lease_s)

    async def claim_late_lookups(self, worker: str, *, limit: int, lease_s: float) -> list[int]:
        return self._claim("next_recovery_at", {AttemptState.ABANDONED}, limit, lease_s)

    # ---- internals --------------------------------------------------------------------------

    def _claim(
        self, column: str, states: Iterable[AttemptState], limit: int, lease_s: float
    ) -> list[int]:
        wanted = set(states)
        due = sorted(
            (
                r
                for r in self._s.runtimes.values()
                if getattr(r, column) is not None
                and getattr(r, column) <= self.now
                and self._s.attempts[r.attempt_id].state in wanted
            ),
            key=lambda r: (getattr(r, column), r.attempt_id),
        )[:limit]
        pushed: dict[str, Any] = {column: self.now + timedelta(seconds=lease_s)}
        for r in due:
            self._s.runtimes[r.attempt_id] = replace(r, **pushed)
        return [r.attempt_id for r in due]  # in due order, like the SQL claim

    def _event(self, task_id: int, kind: str, payload: Mapping[str, Any]) -> None:
        seq = self._s.last_seq.get(task_id, 0) + 1
        self._s.last_seq[task_id] = seq
        self._s.task_events.append(TaskEventRecord(task_id, seq, kind, dict(payload), self.now))


class MemoryDatabase:
    """The fake database: opens `MemoryUnitOfWork`s and answers the ports' reads."""

    def __init__(self) -> None:
        self._state = _State()
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def unit(
        self, now: datetime, *, one_statement: bool = False
    ) -> AsyncIterator[MemoryUnitOfWork]:
        """One unit at a time; its copy of the state replaces the state only on success
        (`one_statement` changes nothing here)."""
        async with self._lock:
            work = copy.deepcopy(self._state)
            unit = MemoryUnitOfWork(work, now)
            yield unit
            self._state = work
        log_endings(unit.endings)

    # ---- seeding ----------------------------------------------------------------------------

    def add_account(self, provider: str, account_name: str = "prod", region: str = "us") -> int:
        account = AccountInfo(self._state.next_id(), provider, account_name, region)
        self._state.accounts[account.id] = account
        return account.id

    def add_task(
        self, spec: GenerationSpec, state: TaskState = TaskState.SUBMITTING, *, version: int = 0
    ) -> TaskRecord:
        task = TaskRecord(
            id=self._state.next_id(),
            tenant_id=spec.tenant_id,
            user_id=spec.user_id,
            project_id=spec.project_id,
            idempotency_key=f"key-{self._state.ids}",
            spec=spec,
            spec_hash=f"hash-{self._state.ids}",
            service_class=spec.service_class,
            priority=spec.priority,
            state=state,
            status_version=version,
            failure=None,
            adopted_attempt_id=None,
            output_asset=None,
            queue_deadline_at=None,
            deadline_at=None,
            created_at=EPOCH,
            updated_at=EPOCH,
        )
        self._state.tasks[task.id] = task
        return task

    def add_attempt(
        self,
        task: TaskRecord,
        account_id: int,
        state: AttemptState = AttemptState.READY_TO_SUBMIT,
        *,
        model: str = "gen4.5",
        job_id: str | None = None,
    ) -> AttemptRecord:
        """An attempt of `task` in `state` (with its provider job when `job_id` is given)."""
        number = len([a for a in self._state.attempts.values() if a.task_id == task.id]) + 1
        attempt = AttemptRecord(
            id=self._state.next_id(),
            task_id=task.id,
            attempt_no=number,
            provider_account_id=account_id,
            provider_model=model,
            provider_model_version="v1",
            capability_version="cap-1",
            price_version="p-1",
            routing_policy_version="r-1",
            client_request_key=f"crk-{task.id}-{number}",
            normalized_spec_hash=task.spec_hash,
            request_hash=None,
            compile_plan={},
            route_decision_id=None,
            state=state,
            status_version=0,
            estimated_cost_micros=250_000,
            actual_cost_micros=None,
            currency="USD",
            lease_token=None,
            fencing_token=None,
            request_started_at=None,
            request_body_sent_at=None,
            transport_error_stage=None,
            failure=None,
            created_at=EPOCH,
            updated_at=EPOCH,
        )
        self._state.attempts[attempt.id] = attempt
        if job_id is not None:
            job = ProviderJobRecord(
                id=self._state.next_id(),
                attempt_id=attempt.id,
                provider_account_id=account_id,
                provider_job_id=job_id,
                provider_request_id=None,
                raw_status=None,
                normalized_status=state,
                output_locator=None,
                raw_failure=None,
                submitted_at=EPOCH,
                last_polled_at=None,
                completed_at=None,
                created_at=EPOCH,
            )
            self._state.jobs[job.id] = job
        return attempt

    # ---- what units wrote -------------------------------------------------------------------

    @property
    def outbox(self) -> list[OutboxRecord]:
        """Every message ever enqueued, oldest first."""
        return sorted(self._state.outbox.values(), key=lambda m: m.id)

    @property
    def task_events(self) -> list[TaskEventRecord]:
        return list(self._state.task_events)

    @property
    def requeues(self) -> list[RequeueRequest]:
        return list(self._state.requeues)

    @property
    def usage(self) -> list[NewUsage]:
        """Provider usage entries written so far, in writing order."""
        return list(self._state.usage.values())

    @property
    def quality_checks(self) -> list[NewCheck]:
        """Technical quality checks written so far, in writing order."""
        return list(self._state.quality_checks.values())

    # ---- ports.TaskReads and ports.ExecutionReads -------------------------------------------

    async def get_task(self, task_id: int) -> TaskDetail | None:
        s = self._state
        task = s.tasks.get(task_id)
        if task is None:
            return None
        attempts = sorted(
            (a for a in s.attempts.values() if a.task_id == task_id), key=lambda a: a.attempt_no
        )
        ids = {a.id for a in attempts}
        jobs = sorted((j for j in s.jobs.values() if j.attempt_id in ids), key=lambda j: j.id)
        return TaskDetail(task, tuple(attempts), tuple(jobs), ())

    async def account(self, account_id: int) -> AccountInfo:
        return self._state.accounts[account_id]

    async def snapshot(
        self, attempt_id: int
    ) -> tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None] | None:
        s = self._state
        attempt = s.attempts.get(attempt_id)
        if attempt is None:
            return None
        job = next((j for j in s.jobs.values() if j.attempt_id == attempt_id), None)
        return attempt, job, s.runtimes.get(attempt_id)

    async def snapshots(
        self, attempt_ids: Iterable[int]
    ) -> dict[int, tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None]]:
        found = {i: await self.snapshot(i) for i in set(attempt_ids)}
        return {i: snap for i, snap in found.items() if snap is not None}

    async def snapshots_and_tasks(
        self, attempt_ids: Iterable[int]
    ) -> dict[
        int,
        tuple[tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None], TaskRecord],
    ]:
        snaps = await self.snapshots(attempt_ids)
        tasks = self._state.tasks
        return {
            i: (snap, tasks[snap[0].task_id])
            for i, snap in snaps.items()
            if snap[0].task_id in tasks
        }

    async def tasks(self, task_ids: Iterable[int]) -> dict[int, TaskRecord]:
        s = self._state
        return {i: s.tasks[i] for i in set(task_ids) if i in s.tasks}

    async def runtime(self, attempt_id: int) -> AttemptRuntime | None:
        return self._state.runtimes.get(attempt_id)

    async def events(
        self,
        *,
        attempt_id: int | None = None,
        account_id: int | None = None,
        job_id: str | None = None,
    ) -> list[ProviderEventRecord]:
        return [
            e
            for e in sorted(self._state.events.values(), key=lambda e: e.id)
            if (attempt_id is None or e.attempt_id == attempt_id)
            and (account_id is None or e.provider_account_id == account_id)
            and (job_id is None or e.provider_job_id == job_id)
        ]

    async def snapshot_of_job(
        self, provider: str, job_id: str
    ) -> tuple[AttemptRecord, ProviderJobRecord | None, AttemptRuntime | None] | None:
        s = self._state
        job = next(
            (
                j
                for j in s.jobs.values()
                if j.provider_job_id == job_id
                and s.accounts[j.provider_account_id].provider == provider
            ),
            None,
        )
        return None if job is None else await self.snapshot(job.attempt_id)

    async def known_job_ids(self, account_id: int, job_ids: Iterable[str]) -> set[str]:
        wanted = set(job_ids)
        return {
            j.provider_job_id
            for j in self._state.jobs.values()
            if j.provider_account_id == account_id and j.provider_job_id in wanted
        }

    async def attempts(self, attempt_ids: Iterable[int]) -> dict[int, AttemptRecord]:
        wanted = set(attempt_ids)
        return {i: a for i, a in self._state.attempts.items() if i in wanted}

    async def waiting_to_submit(self, *, after_id: int, limit: int) -> list[AttemptRecord]:
        found = [
            a
            for i, a in sorted(self._state.attempts.items())
            if a.state is AttemptState.READY_TO_SUBMIT and i > after_id
        ]
        return found[:limit]

    async def stale_submitting(self, *, started_before: datetime, limit: int) -> list[int]:
        found = [
            a.id
            for a in self._state.attempts.values()
            if a.state is AttemptState.SUBMITTING
            and (a.request_started_at is None or a.request_started_at < started_before)
        ]
        return sorted(found)[:limit]

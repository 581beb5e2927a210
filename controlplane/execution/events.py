"""The one provider event normalizer (design 9.18.1): polls, callbacks and cancel replies.

Every observation of a provider job goes through `EventNormalizer.ingest` in one transaction:

1. the raw observation is stored in ``provider_events``; the same (account, job id, raw status,
   payload hash) seen again is a DUPLICATE and changes nothing;
2. a job we have no row for (a callback that beat the submit response) is stored as UNMATCHED,
   with the attempt named by the callback URL; the submit worker replays it once the job is
   recorded and recovery treats it as evidence (9.17.4 step 5);
3. UNRECOGNIZED statuses are stored raw and flagged on the attempt, never a transition;
4. the attempt only moves forward: a lower phase (9.8.1) is STALE, a terminal attempt only
   stores (LATE_STORED), and the move itself is a CAS on the locked row;
5. SUCCEEDED adopts the attempt (task -> OUTPUT_FETCHING + ``output.fetch``) only if the task
   still waits on it; a task that adopted another attempt keeps it (9.3.4);
   FAILED goes through the failover decision; CANCELLED cancels the task when a cancel was asked.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.domain.failover import FailureStage
from controlplane.domain.outbox import Topic
from controlplane.domain.polling import PollPhase
from controlplane.domain.states import ATTEMPT_MACHINE, ATTEMPT_PHASE, AttemptState, TaskState
from controlplane.execution.outcomes import (
    AfterCommit,
    ExecutionDeps,
    accept,
    fail_attempt,
    is_current,
)
from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import (
    AttemptChanges,
    AttemptRecord,
    Failure,
    NewOutboxMessage,
    ProviderJobRecord,
    TaskRecord,
)
from vidroute_core.adapter import JobRef, JobSnapshot, JobState
from vidroute_core.errors import ErrorClass, make_error

__all__ = [
    "EventNormalizer",
    "EventSource",
    "IngestOutcome",
    "Observation",
    "outputs_locator",
    "payload_hash",
]

log = logging.getLogger(__name__)

_TARGET = {
    JobState.QUEUED: AttemptState.PROVIDER_QUEUED,
    JobState.THROTTLED: AttemptState.PROVIDER_THROTTLED,
    JobState.RUNNING: AttemptState.RUNNING,
    JobState.SUCCEEDED: AttemptState.SUCCEEDED,
    JobState.FAILED: AttemptState.FAILED,
    JobState.CANCELLED: AttemptState.CANCELLED,
}
_PHASE = {
    AttemptState.ACCEPTED: PollPhase.SUBMITTED,
    AttemptState.PROVIDER_QUEUED: PollPhase.QUEUED,
    AttemptState.PROVIDER_THROTTLED: PollPhase.QUEUED,
    AttemptState.RUNNING: PollPhase.RUNNING,
    AttemptState.CANCEL_REQUESTED: PollPhase.CANCELLING,
}


class EventSource(enum.Enum):
    POLL = "poll"
    CALLBACK = "callback"
    CANCEL = "cancel"


class IngestOutcome(enum.Enum):
    APPLIED = "APPLIED"
    ADOPTED = "ADOPTED"
    NOT_ADOPTED = "NOT_ADOPTED"
    DUPLICATE = "DUPLICATE"
    NO_CHANGE = "NO_CHANGE"
    STALE = "STALE"
    LATE_STORED = "LATE_STORED"
    UNRECOGNIZED = "UNRECOGNIZED"
    UNMATCHED = "UNMATCHED"


@dataclass(frozen=True, slots=True)
class Observation:
    """One snapshot of a provider job and where it came from."""

    provider_account_id: int
    provider_job_id: str
    snapshot: JobSnapshot
    source: EventSource
    received_at: datetime
    attempt_hint: int | None = None


def payload_hash(snapshot: JobSnapshot) -> str:
    """The dedup hash: the raw payload when there is one, else the normalized fields."""
    raw = snapshot.raw_payload_json or repr(
        (snapshot.state.value, snapshot.raw_status, snapshot.progress, snapshot.outputs)
    )
    return hashlib.sha256(raw.encode()).hexdigest()


def phase_of(state: AttemptState) -> PollPhase | None:
    return _PHASE.get(state)


def outputs_locator(snapshot: JobSnapshot) -> dict[str, Any]:
    """The ``provider_jobs.output_locator`` of a snapshot: what the output step fetches, with
    ``fetch_through_adapter`` kept (such a URI is downloaded through the adapter sidecar)."""
    return {
        "outputs": [
            {
                "uri": o.uri,
                "mime_type": o.mime_type,
                "expires_at": o.expires_at.isoformat() if o.expires_at else None,
                "size_bytes": o.size_bytes,
                "checksum": o.checksum,
                "fetch_through_adapter": o.fetch_through_adapter,
            }
            for o in snapshot.outputs
        ]
    }


class EventNormalizer:
    """Applies observations; safe to call concurrently (rows are locked per attempt)."""

    def __init__(self, deps: ExecutionDeps) -> None:
        self._deps = deps
        self.counts: dict[IngestOutcome, int] = dict.fromkeys(IngestOutcome, 0)

    async def ingest(self, obs: Observation) -> IngestOutcome:
        after = AfterCommit()
        async with self._deps.db.unit(self._deps.clock()) as u:
            outcome = await self._ingest(u, obs, after)
        await after.run(self._deps.leases)
        await self._report_ended(after)
        self.counts[outcome] += 1
        return outcome

    async def _report_ended(self, after: AfterCommit) -> None:
        observer = self._deps.on_attempt_end
        if observer is None:
            return
        for attempt, snapshot in after.ended:
            try:
                account = await self._deps.reads.account(attempt.provider_account_id)
                await observer(account, attempt, snapshot)
            except Exception:
                log.exception("attempt-end observer failed for attempt %s", attempt.id)

    async def replay_unmatched(self, account_id: int, job_id: str) -> None:
        """Re-apply early observations of a job that has just been recorded."""
        for event in await self._deps.reads.events(account_id=account_id, job_id=job_id):
            if event.outcome != IngestOutcome.UNMATCHED.value:
                continue
            after = AfterCommit()
            async with self._deps.db.unit(self._deps.clock()) as u:
                job = await u.job_by_ref(account_id, job_id)
                if job is None:
                    return
                snap = JobSnapshot(JobState(event.job_state), event.raw_status, event.raw_payload)
                outcome = await self._apply(u, job, snap, EventSource(event.source), after)
                await u.set_event_outcome(event.id, f"REPLAYED_{outcome.value}")
            await after.run(self._deps.leases)
            await self._report_ended(after)

    async def _ingest(self, u: UnitOfWork, obs: Observation, after: AfterCommit) -> IngestOutcome:
        snap = obs.snapshot
        job = await u.job_by_ref(obs.provider_account_id, obs.provider_job_id)
        event_id = await u.insert_event(
            provider_account_id=obs.provider_account_id,
            provider_job_id=obs.provider_job_id,
            attempt_id=job.attempt_id if job else obs.attempt_hint,
            source=obs.source.value,
            job_state=snap.state.value,
            raw_status=snap.raw_status,
            payload_hash=payload_hash(snap),
            raw_payload=snap.raw_payload_json,
            outcome="PENDING",
            received_at=obs.received_at,
        )
        if event_id is None:
            return IngestOutcome.DUPLICATE
        if job is None:
            outcome = IngestOutcome.UNMATCHED
        else:
            outcome = await self._apply(u, job, snap, obs.source, after)
        await u.set_event_outcome(event_id, outcome.value)
        return outcome

    async def _apply(
        self,
        u: UnitOfWork,
        job: ProviderJobRecord,
        snap: JobSnapshot,
        source: EventSource,
        after: AfterCommit,
    ) -> IngestOutcome:
        attempt = await u.attempt(job.attempt_id)
        assert attempt is not None  # provider_jobs.attempt_id is a foreign key
        task = await u.task(attempt.task_id)
        assert task is not None
        job_values: dict[str, Any] = {"raw_status": snap.raw_status}
        if source is EventSource.POLL:
            job_values["last_polled_at"] = u.now
        if snap.state is JobState.UNRECOGNIZED:
            await u.update_job(job.id, **job_values)
            await u.bump_runtime(attempt.id, attempt.task_id, "unrecognized_count")
            await u.set_runtime(
                attempt.id, attempt.task_id, last_unrecognized_status=snap.raw_status
            )
            log.warning("attempt %s: unrecognized provider status %r", attempt.id, snap.raw_status)
            return IngestOutcome.UNRECOGNIZED
        if snap.state.terminal:
            job_values["output_locator"] = (
                outputs_locator(snap) if snap.outputs else job.output_locator
            )
            if snap.failure is not None:
                job_values["raw_failure"] = {
                    "class": snap.failure.error_class.value,
                    "code": snap.failure.code,
                    "message": snap.failure.message,
                }
        if attempt.state in (AttemptState.SUBMITTING, AttemptState.SUBMIT_UNKNOWN):
            # The job is recorded, so the provider has it: settle the submit first.
            attempt = await accept(
                u,
                self._deps,
                attempt,
                task,
                _ref(job),
                raw_status=snap.raw_status,
                reason="job observed",
                after=after,
            )
            task = await u.task(attempt.task_id) or task
        target = _TARGET[snap.state]
        if ATTEMPT_MACHINE.is_terminal(attempt.state):
            if snap.state.terminal and attempt.state is not target:
                await u.update_job(job.id, **job_values)
            return IngestOutcome.NO_CHANGE if attempt.state is target else IngestOutcome.LATE_STORED
        if attempt.state is target:
            await u.update_job(job.id, **job_values)
            return IngestOutcome.NO_CHANGE
        if ATTEMPT_PHASE[target] < ATTEMPT_PHASE[attempt.state] or not ATTEMPT_MACHINE.can(
            attempt.state, target
        ):
            return IngestOutcome.STALE
        failure = None
        if snap.state is JobState.FAILED:
            # The job's own failure replaces any earlier transport error of a recovered submit.
            cause = snap.failure or make_error(
                ErrorClass.INTERNAL_PERMANENT, "PROVIDER_FAILED", snap.raw_status
            )
            failure = Failure(cause.error_class.value, cause.code, cause.message)
        changes = AttemptChanges(actual_cost_micros=snap.actual_cost_micros, failure=failure)
        moved = await u.move_attempt(attempt, target, f"{source.value}: {snap.raw_status}", changes)
        if moved is None:
            return IngestOutcome.STALE
        job_values["normalized_status"] = target.value
        if snap.state.terminal:
            job_values["completed_at"] = u.now
        await u.update_job(job.id, **job_values)
        if not snap.state.terminal:
            phase = phase_of(target)
            await u.set_runtime(
                moved.id,
                moved.task_id,
                poll_phase=phase.value if phase else None,
                polls_in_phase=0,
            )
            return IngestOutcome.APPLIED
        await u.set_runtime(moved.id, moved.task_id, next_poll_at=None)
        after.release.append(moved)
        after.ended.append((moved, snap))
        if snap.state is JobState.SUCCEEDED:
            return await self._succeeded(u, moved, task, job)
        if snap.state is JobState.FAILED:
            error = snap.failure or make_error(
                ErrorClass.INTERNAL_PERMANENT, "PROVIDER_FAILED", snap.raw_status
            )
            await fail_attempt(
                u, self._deps, moved, task, error, stage=FailureStage.EXECUTION, after=after
            )
            return IngestOutcome.APPLIED
        return await self._cancelled(u, moved, task, was=attempt.state, after=after)

    async def _succeeded(
        self, u: UnitOfWork, attempt: AttemptRecord, task: TaskRecord, job: ProviderJobRecord
    ) -> IngestOutcome:
        if not await is_current(u, task, attempt):
            return IngestOutcome.NOT_ADOPTED
        runtime = await u.runtime(attempt.id)
        cancelled = runtime is not None and runtime.cancel_requested_at is not None
        if cancelled and not self._deps.config.deliver_if_succeeded_during_cancel:
            await u.move_task(
                task, TaskState.CANCELLED, "cancel requested; provider succeeded first (discard)"
            )
            return IngestOutcome.NOT_ADOPTED
        moved = await u.move_task(
            task,
            TaskState.OUTPUT_FETCHING,
            f"attempt {attempt.attempt_no} succeeded",
            adopted_attempt_id=attempt.id,
        )
        if moved is None:
            return IngestOutcome.NOT_ADOPTED
        await u.enqueue(
            NewOutboxMessage(
                Topic.OUTPUT_FETCH,
                str(attempt.id),
                {
                    "task_id": task.id,
                    "attempt_id": attempt.id,
                    "provider_job_id": job.provider_job_id,
                },
            )
        )
        return IngestOutcome.ADOPTED

    async def _cancelled(
        self,
        u: UnitOfWork,
        attempt: AttemptRecord,
        task: TaskRecord,
        *,
        was: AttemptState,
        after: AfterCommit,
    ) -> IngestOutcome:
        runtime = await u.runtime(attempt.id)
        asked = was is AttemptState.CANCEL_REQUESTED or (
            runtime is not None and runtime.cancel_requested_at is not None
        )
        if not await is_current(u, task, attempt):
            return IngestOutcome.APPLIED
        if asked:
            await u.move_task(task, TaskState.CANCELLED, "provider confirmed the cancel")
            return IngestOutcome.APPLIED
        # Cancelled by the provider on its own: a definite end of this attempt, not ours to hide.
        error = make_error(
            ErrorClass.INTERNAL_PERMANENT, "PROVIDER_CANCELLED", "the provider cancelled the job"
        )
        await fail_attempt(
            u, self._deps, attempt, task, error, stage=FailureStage.EXECUTION, after=after
        )
        return IngestOutcome.APPLIED


def _ref(job: ProviderJobRecord) -> JobRef:
    return JobRef(job.provider_job_id, "", provider_request_id=job.provider_request_id or "")

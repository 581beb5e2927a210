"""The one provider event normalizer (design 9.18.1): polls, callbacks and cancel replies.

Every observation of a provider job goes through `EventNormalizer.ingest_many` (`ingest`: the
batch of one), a batch in one transaction:

1. the raw observation is stored in ``provider_events``; the same (account, job id, raw status,
   payload hash) seen again is a DUPLICATE and changes nothing;
2. a job we have no row for (a callback that beat the submit response) is stored as UNMATCHED,
   with the attempt named by the callback URL; the submit worker replays it once the job is
   recorded and recovery treats it as evidence (9.17.4 step 5);
3. a recorded job's observation is judged by the domain's rule (`controlplane.domain.observation`:
   which provider state moves which attempt state, what is stale, late or adopted) on the rows
   loaded here, and the verdict is applied: UNRECOGNIZED statuses stored raw and flagged on the
   attempt, the attempt's move as a CAS on the locked row (a lost CAS is STALE), the task's move
   (a lost adopting CAS is NOT_ADOPTED), the ``output.fetch``, or the failover decision;
4. a live attempt's progress or queue position becomes a ``provider.progress`` task event when
   the domain's throttle keeps it (`progress_events`); it never moves a state.

A batch (a poll round's observations, design 9.20, issue 22) holds the attempts they name
(locked, with their tasks, jobs and runtime rows: `UnitOfWork.hold`) in one statement, which
answers their jobs too (the jobs no named attempt holds are read in one more), stores its raw
observations in one, then applies each observation by the same steps in order; the unit sends
the bookkeeping writes (runtime rows, jobs, outcomes) set-based at its end. A batch whose unit
raises committed nothing: each observation is then applied alone, as one at a time would be.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.domain.failover import FailureStage
from controlplane.domain.money import actual_cost
from controlplane.domain.observation import (
    IngestOutcome,
    ObservationFacts,
    ObservationVerdict,
    judge,
    poll_phase_of,
    settles_submit,
)
from controlplane.domain.outbox import Topic
from controlplane.execution.batching import each_alone
from controlplane.execution.outcomes import (
    AfterCommit,
    ExecutionDeps,
    accept,
    fail_attempt,
)
from controlplane.execution.progress_events import record_progress
from controlplane.execution.usage_entries import record_actual
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
from vidroute_core.logs import add_ids, bind_ids, ids_of

__all__ = [
    "EventNormalizer",
    "EventSource",
    "Observation",
    "Then",
    "outputs_locator",
    "payload_hash",
]

log = logging.getLogger(__name__)


# More writes in an observation's transaction: (unit, ids of the attempts that ended in it).
Then = Callable[[UnitOfWork, set[int]], Awaitable[None]]


class EventSource(enum.Enum):
    POLL = "poll"
    CALLBACK = "callback"
    CANCEL = "cancel"


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
        self.progress_marks = 0  # provider.progress events written

    async def ingest(self, obs: Observation, *, then: Then | None = None) -> IngestOutcome:
        """Apply `obs` in one transaction; `then(u, ended)` writes more in that same
        transaction after the observation was applied (the poller's next due time), told the
        ids of the attempts that ended in it. The batch of one of `ingest_many`."""
        [outcome] = await self.ingest_many([(obs, then)])
        return outcome

    async def ingest_many(
        self, items: Sequence[tuple[Observation, Then | None]]
    ) -> list[IngestOutcome]:
        """Apply the observations in ONE transaction, each as `ingest` would, in order (see the
        module); if that transaction raises, each alone. The first error is raised after all."""
        results = await self.ingest_each(items)
        outcomes = [r for r in results if isinstance(r, IngestOutcome)]
        if len(outcomes) < len(results):
            raise next(r for r in results if not isinstance(r, IngestOutcome))
        return outcomes

    async def ingest_each(
        self, items: Sequence[tuple[Observation, Then | None]]
    ) -> list[IngestOutcome | Exception]:
        """`ingest_many`, telling each observation's outcome or the error that refused it."""
        if not items:
            return []
        afters = [AfterCommit() for _ in items]
        try:
            async with self._deps.db.unit(self._deps.clock()) as u:
                outcomes = await self._ingest_all(u, items, afters)
        except Exception as exc:
            return await each_alone(exc, items, self.ingest_each, "observations")
        for after in afters:
            await after.run(self._deps.leases)
            await self._report_ended(after)
        for outcome in outcomes:
            self.counts[outcome] += 1
        return list(outcomes)

    async def _ingest_all(
        self,
        u: UnitOfWork,
        items: Sequence[tuple[Observation, Then | None]],
        afters: Sequence[AfterCommit],
    ) -> list[IngestOutcome]:
        # The attempts the observations name (a poll's, a callback's found by its job), locked
        # first: their jobs come with them, so the refs they answer need no read of their own.
        await u.hold(sorted({obs.attempt_hint for obs, _ in items if obs.attempt_hint}))
        refs = [(obs.provider_account_id, obs.provider_job_id) for obs, _ in items]
        recorded = await u.jobs_by_refs(refs)
        jobs = [recorded.get(ref) for ref in refs]
        event_ids = await u.insert_events(
            [_event_row(obs, job) for (obs, _), job in zip(items, jobs, strict=True)]
        )
        # The attempts an item applies to or writes more for (`then`), locked: those not named
        # by their observation (held above) read now.
        held = {
            job.attempt_id
            for (_, then), job, event_id in zip(items, jobs, event_ids, strict=True)
            if job is not None and (event_id is not None or then is not None)
        }
        await u.hold(sorted(held))
        outcomes = []
        for (obs, then), job, event_id, after in zip(items, jobs, event_ids, afters, strict=True):
            with bind_ids(attempt_id=obs.attempt_hint, provider_job_id=obs.provider_job_id):
                if event_id is None:
                    outcome = IngestOutcome.DUPLICATE
                elif job is None:
                    outcome = IngestOutcome.UNMATCHED
                else:
                    # Read again through the unit: an earlier item may have written the job.
                    current = await u.job_by_ref(job.provider_account_id, job.provider_job_id)
                    outcome = await self._apply(u, current or job, obs.snapshot, obs.source, after)
                if event_id is not None:
                    await u.set_event_outcome(event_id, outcome.value)
                if then is not None:
                    await then(u, {a.id for a in after.release})
            outcomes.append(outcome)
        return outcomes

    async def _report_ended(self, after: AfterCommit) -> None:
        observer = self._deps.on_attempt_end
        if observer is None:
            return
        for attempt, snapshot in after.ended:
            try:
                account = await self._deps.account(attempt.provider_account_id)
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
        add_ids(**ids_of(attempt, job))
        task = await u.task(attempt.task_id)
        assert task is not None
        if settles_submit(attempt.state, snap.state):
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
        verdict = judge(await self._facts(u, attempt, task, snap))
        job_values = _job_values(job, snap, polled_at=u.now if source is EventSource.POLL else None)
        if verdict.outcome is IngestOutcome.UNRECOGNIZED:
            await u.update_job(job.id, **job_values)
            await u.bump_runtime(attempt.id, attempt.task_id, "unrecognized_count")
            await u.set_runtime(
                attempt.id, attempt.task_id, last_unrecognized_status=snap.raw_status
            )
            log.warning("attempt %s: unrecognized provider status %r", attempt.id, snap.raw_status)
            return verdict.outcome
        target = verdict.move_to
        if target is None:
            if verdict.record:
                await u.update_job(job.id, **job_values)
            if verdict.outcome is IngestOutcome.NO_CHANGE:
                await self._progress(u, attempt, task, snap)
            return verdict.outcome
        cause = verdict.failure
        failure = Failure(cause.error_class.value, cause.code, cause.message) if cause else None
        cost, provider = snap.actual_cost_micros, ""
        if snap.state.terminal:
            # 9.23.1: a provider whose API reports no cost gets it from its billing rule.
            provider = (await self._deps.account(attempt.provider_account_id, u)).provider
            cost = actual_cost(
                provider,
                reported_micros=snap.actual_cost_micros,
                succeeded=snap.state is JobState.SUCCEEDED,
                estimated_micros=attempt.estimated_cost_micros,
            )
        changes = AttemptChanges(actual_cost_micros=cost, failure=failure)
        moved = await u.move_attempt(attempt, target, f"{source.value}: {snap.raw_status}", changes)
        if moved is None:
            return IngestOutcome.STALE
        job_values["normalized_status"] = target.value
        if snap.state.terminal:
            job_values["completed_at"] = u.now
        await u.update_job(job.id, **job_values)
        if not snap.state.terminal:
            phase = poll_phase_of(target)
            await u.set_runtime(
                moved.id,
                moved.task_id,
                poll_phase=phase.value if phase else None,
                polls_in_phase=0,
            )
            await self._progress(u, moved, task, snap)
            return verdict.outcome
        await u.set_runtime(moved.id, moved.task_id, next_poll_at=None)
        if cost is not None:
            await record_actual(
                u, moved, job.provider_job_id, provider, cost, raw_status=snap.raw_status
            )
        after.release.append(moved)
        after.ended.append((moved, snap))
        return await self._follow(u, moved, task, job, verdict=verdict, after=after)

    async def _progress(
        self, u: UnitOfWork, attempt: AttemptRecord, task: TaskRecord, snap: JobSnapshot
    ) -> None:
        """A live attempt's progress reading as a task event, when the throttle keeps it."""
        if await record_progress(u, self._deps.config.progress, attempt, task, snap) is not None:
            self.progress_marks += 1

    async def _facts(
        self, u: UnitOfWork, attempt: AttemptRecord, task: TaskRecord, snap: JobSnapshot
    ) -> ObservationFacts:
        """The rows' facts `judge` needs; whom the task waits on matters only at a job's end."""
        latest: int | None = None
        cancel_requested = False
        if snap.state.terminal:
            attempts = await u.attempts_of(task.id)
            latest = attempts[-1].id if attempts else None
            runtime = await u.runtime(attempt.id)
            cancel_requested = runtime is not None and runtime.cancel_requested_at is not None
        return ObservationFacts(
            job_state=snap.state,
            raw_status=snap.raw_status,
            attempt_id=attempt.id,
            attempt_no=attempt.attempt_no,
            attempt_state=attempt.state,
            task_state=task.state,
            adopted_attempt_id=task.adopted_attempt_id,
            latest_attempt_id=latest,
            failure=snap.failure,
            cancel_requested=cancel_requested,
            deliver_if_succeeded_during_cancel=self._deps.config.deliver_if_succeeded_during_cancel,
        )

    async def _follow(
        self,
        u: UnitOfWork,
        attempt: AttemptRecord,
        task: TaskRecord,
        job: ProviderJobRecord,
        *,
        verdict: ObservationVerdict,
        after: AfterCommit,
    ) -> IngestOutcome:
        """The task's side of an attempt's end: the failover decision, a task move, the fetch."""
        if verdict.fail_over is not None:
            await fail_attempt(
                u,
                self._deps,
                attempt,
                task,
                verdict.fail_over,
                stage=FailureStage.EXECUTION,
                after=after,
            )
            return verdict.outcome
        move = verdict.task_move
        if move is None:
            return verdict.outcome
        if not move.adopt:
            await u.move_task(task, move.to, move.reason)
            return verdict.outcome
        fetch = NewOutboxMessage(
            Topic.OUTPUT_FETCH,
            str(attempt.id),
            {"task_id": task.id, "attempt_id": attempt.id, "provider_job_id": job.provider_job_id},
        )
        moved = await u.move_task(
            task,
            move.to,
            move.reason,
            adopted_attempt_id=attempt.id,
            outbox=[fetch] if verdict.fetch_output else (),  # written only if the move won
        )
        if moved is None:
            return IngestOutcome.NOT_ADOPTED
        return verdict.outcome


def _event_row(obs: Observation, job: ProviderJobRecord | None) -> dict[str, Any]:
    """The ``provider_events`` row of an observation, its outcome still PENDING."""
    snap = obs.snapshot
    return {
        "provider_account_id": obs.provider_account_id,
        "provider_job_id": obs.provider_job_id,
        "attempt_id": job.attempt_id if job else obs.attempt_hint,
        "source": obs.source.value,
        "job_state": snap.state.value,
        "raw_status": snap.raw_status,
        "payload_hash": payload_hash(snap),
        "raw_payload": snap.raw_payload_json,
        "outcome": "PENDING",
        "received_at": obs.received_at,
    }


def _job_values(
    job: ProviderJobRecord, snap: JobSnapshot, *, polled_at: datetime | None
) -> dict[str, Any]:
    """What the provider job row takes of an observation: its raw view, and at the job's end its
    outputs (else the ones already known) and failure."""
    values: dict[str, Any] = {"raw_status": snap.raw_status}
    if polled_at is not None:
        values["last_polled_at"] = polled_at
    if snap.state.terminal:
        values["output_locator"] = outputs_locator(snap) if snap.outputs else job.output_locator
        if snap.failure is not None:
            values["raw_failure"] = {
                "class": snap.failure.error_class.value,
                "code": snap.failure.code,
                "message": snap.failure.message,
            }
    return values


def _ref(job: ProviderJobRecord) -> JobRef:
    return JobRef(job.provider_job_id, "", provider_request_id=job.provider_request_id or "")

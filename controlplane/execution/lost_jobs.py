"""A poll of a job we hold answered NOT_FOUND (adapter error code JOB_NOT_FOUND).

NOT_FOUND is never read as "cancelled by the provider" and never fails over by itself: the
provider may have lost the job, be answering from a replica that has not seen it yet, or have
deleted it. So:

* a cancel we sent (attempt CANCEL_REQUESTED, at least one cancel call made) that now reads
  NOT_FOUND is confirmed: Runway deletes a task on DELETE. The normalizer gets a CANCELLED
  observation and cancels the task as for any confirmed cancel;
* otherwise the attempt is kept and polled on (the poll schedule backs off); the first
  NOT_FOUND of a streak sets ``job_not_found_since`` and is stored as evidence, any real status
  clears it. Once the streak is `job_not_found_abandon_after_s` old the job is treated the way a
  lost submit is: the attempt goes ABANDONED (its lease left to reconciliation, no new submit)
  and the task follows `allow_new_attempt_after_abandon`, exactly as recovery's abandon.
"""

from __future__ import annotations

import logging

from controlplane.domain.states import AttemptState
from controlplane.execution.events import EventNormalizer, EventSource, Observation
from controlplane.execution.evidence import EvidenceKind, record_evidence
from controlplane.execution.outcomes import ExecutionDeps
from controlplane.execution.recovery import settle_task
from controlplane.persistence.records import (
    AttemptChanges,
    AttemptRecord,
    AttemptRuntime,
    Failure,
    ProviderJobRecord,
)
from vidroute_core.adapter import JobSnapshot, JobState
from vidroute_core.errors import ErrorClass, ProviderError

__all__ = ["JOB_NOT_FOUND", "is_job_not_found", "on_job_not_found", "on_job_seen"]

log = logging.getLogger(__name__)
#: The adapter contract's error code for a 404 of a job we hold.
JOB_NOT_FOUND = "JOB_NOT_FOUND"


def is_job_not_found(error: ProviderError | None) -> bool:
    return error is not None and error.code == JOB_NOT_FOUND


async def on_job_seen(
    deps: ExecutionDeps, attempt: AttemptRecord, runtime: AttemptRuntime | None
) -> None:
    """A real status arrived: a NOT_FOUND streak, if any, is over."""
    if runtime is None or runtime.job_not_found_since is None:
        return
    async with deps.db.unit(deps.clock()) as u:
        await u.set_runtime(attempt.id, attempt.task_id, job_not_found_since=None)


async def on_job_not_found(
    deps: ExecutionDeps,
    normalizer: EventNormalizer,
    attempt: AttemptRecord,
    job: ProviderJobRecord,
    runtime: AttemptRuntime | None,
) -> bool:
    """Apply one NOT_FOUND poll (module docstring); True when the attempt ended."""
    now = deps.clock()
    if attempt.state is AttemptState.CANCEL_REQUESTED and runtime and runtime.cancel_calls > 0:
        gone = JobSnapshot(JobState.CANCELLED, "NOT_FOUND", '{"not_found_after_cancel":true}')
        obs = Observation(
            attempt.provider_account_id,
            job.provider_job_id,
            gone,
            EventSource.POLL,
            now,
            attempt.id,
        )
        await normalizer.ingest(obs)
        return True
    cfg = deps.config
    async with deps.db.unit(now) as u:
        current = await u.attempt(attempt.id)
        task = None if current is None else await u.task(current.task_id)
        if current is None or task is None or current.state is not attempt.state:
            return False
        fresh = await u.runtime(attempt.id)
        since = (fresh.job_not_found_since if fresh else None) or now
        if fresh is None or fresh.job_not_found_since is None:
            await u.set_runtime(attempt.id, attempt.task_id, job_not_found_since=since)
            await record_evidence(
                u,
                current,
                EvidenceKind.JOB_NOT_FOUND,
                {"since": since.isoformat(), "state": current.state.value},
                job_id=job.provider_job_id,
            )
            log.warning(
                "attempt %s: the provider does not know job %s", attempt.id, job.provider_job_id
            )
        lost_for = (now - since).total_seconds()
        if lost_for < cfg.job_not_found_abandon_after_s:
            return False
        policy = cfg.allow_new_attempt_after_abandon
        failure = Failure(
            ErrorClass.INTERNAL_RETRYABLE.value,
            JOB_NOT_FOUND,
            f"the provider has not known job {job.provider_job_id} for {lost_for:.0f} s; "
            f"allow_new_attempt_after_abandon={policy}",
        )
        moved = await u.move_attempt(
            current,
            AttemptState.ABANDONED,
            "ABANDONED: job_not_found",
            AttemptChanges(failure=failure),
        )
        if moved is None:
            return False
        # Like recovery's abandon: the lease stays for reconciliation (the job may still run).
        await u.set_runtime(moved.id, moved.task_id, next_poll_at=None)
        reason = "ABANDONED_NEW_ATTEMPT" if policy else "ABANDONED_TASK_FAILED"
        await settle_task(u, deps, moved, task, reason=reason, failure=failure, requeue_ok=policy)
    return True

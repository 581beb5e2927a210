"""Cancellation (design 9.18.3): a cancel is a request, not a fact.

`CancelService.cancel(task_id)` is transport-neutral (``controlplane/service/tasks.py`` calls it):

    task terminal                      -> unchanged
    task QUEUED / SCHEDULING           -> CANCELLED at once (CAS; if the scheduler won the race
                                          the live-attempt rules below apply)
    attempt not sent (READY_TO_SUBMIT) -> attempt and task CANCELLED, lease released
    attempt SUBMITTING / SUBMIT_UNKNOWN-> cancel remembered (``cancel_requested_at``); when the
                                          job is found it goes CANCEL_REQUESTED, when it is proven
                                          absent or abandoned the task is CANCELLED
    attempt at the provider            -> attempt CANCEL_REQUESTED + ``attempt.cancel`` message;
                                          `CancelWorker` calls `cancel_job`

Only the provider's cancelled terminal status (from the cancel reply, a poll or a callback)
makes the attempt CANCELLED; an acknowledgement without it triggers a prompt poll. If the job
succeeds before the cancel lands, the provider's real state is kept and
`ExecutionConfig.deliver_if_succeeded_during_cancel` decides whether the user gets the output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from controlplane.domain.breaker import Operation
from controlplane.domain.outbox import Topic
from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    NOT_SENT_ATTEMPT_STATES,
    SENDING_ATTEMPT_STATES,
    TASK_MACHINE,
    AttemptState,
    TaskState,
)
from controlplane.execution.batching import run_batch
from controlplane.execution.breakers import TRANSPORT_FAILURE
from controlplane.execution.events import EventNormalizer, EventSource, Observation
from controlplane.execution.outcomes import (
    AfterCommit,
    ExecutionDeps,
    claim_batch,
    complete,
    job_ref,
    retry_later,
)
from controlplane.persistence.records import NewOutboxMessage, OutboxRecord, TaskRecord
from vidroute_core.exceptions import NotFound

__all__ = ["CancelOutcome", "CancelService", "CancelWorker"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What `cancel` did: `requested` is True when the provider still has to confirm."""

    task: TaskRecord
    attempt_id: int | None
    requested: bool
    detail: str


class CancelService:
    """Starts cancellations; idempotent (a second cancel changes nothing)."""

    def __init__(self, deps: ExecutionDeps) -> None:
        self._deps = deps

    async def cancel(self, task_id: int, reason: str = "") -> CancelOutcome:
        for _ in range(3):  # a lost race with the scheduler or submit worker is re-evaluated
            outcome = await self._try(task_id, reason or "cancel requested")
            if outcome is not None:
                return outcome
        detail = await self._deps.tasks.get_task(task_id)
        assert detail is not None
        return CancelOutcome(detail.task, None, True, "contended; retry the cancel")

    async def _try(self, task_id: int, reason: str) -> CancelOutcome | None:
        detail = await self._deps.tasks.get_task(task_id)
        if detail is None:
            raise NotFound("task", str(task_id))
        live = [a for a in detail.attempts if not ATTEMPT_MACHINE.is_terminal(a.state)]
        after = AfterCommit()
        unsent = None
        async with self._deps.db.unit(self._deps.clock()) as u:
            attempt = await u.attempt(live[-1].id) if live else None
            task = await u.task(task_id)
            assert task is not None
            if TASK_MACHINE.is_terminal(task.state):
                return CancelOutcome(task, None, False, f"task already {task.state.value}")
            if attempt is None or ATTEMPT_MACHINE.is_terminal(attempt.state):
                if task.state in (TaskState.SUBMITTING, TaskState.RUNNING) and live:
                    return None  # the attempt moved on under us: look again
                moved = await u.move_task(task, TaskState.CANCELLED, reason)
                return None if moved is None else CancelOutcome(moved, None, False, "cancelled")
            if attempt.state in NOT_SENT_ATTEMPT_STATES:
                gone = await u.move_attempt(attempt, AttemptState.CANCELLED, reason)
                if gone is None:
                    return None
                after.release.append(gone)
                unsent = gone
                moved = await u.move_task(task, TaskState.CANCELLED, reason)
                if moved is None:
                    return None
                result = CancelOutcome(moved, attempt.id, False, "cancelled before submit")
            elif attempt.state in SENDING_ATTEMPT_STATES:
                await u.set_runtime(attempt.id, attempt.task_id, cancel_requested_at=u.now)
                result = CancelOutcome(
                    task, attempt.id, True, "cancel waits for the submit outcome"
                )
            elif attempt.state is AttemptState.CANCEL_REQUESTED:
                result = CancelOutcome(task, attempt.id, True, "cancel already requested")
            else:
                asked = await u.move_attempt(attempt, AttemptState.CANCEL_REQUESTED, reason)
                if asked is None:
                    return None
                await u.set_runtime(asked.id, asked.task_id, cancel_requested_at=u.now)
                await u.enqueue(
                    NewOutboxMessage(
                        Topic.CANCEL,
                        str(asked.id),
                        {"task_id": asked.task_id, "attempt_id": asked.id},
                    )
                )
                result = CancelOutcome(task, asked.id, True, "cancel requested at the provider")
        await after.run(self._deps.leases)
        if unsent is not None:
            account = await self._deps.account(unsent.provider_account_id)
            await self._deps.gate.release_unsent(account, unsent)
        return result


class CancelWorker:
    """Consumes ``attempt.cancel``: calls `cancel_job` and feeds any status to the normalizer."""

    def __init__(self, deps: ExecutionDeps, normalizer: EventNormalizer) -> None:
        self._deps = deps
        self._normalizer = normalizer

    async def run_once(self) -> int:
        messages = await claim_batch(self._deps, Topic.CANCEL)
        await run_batch(
            messages,
            self.handle,
            key=lambda m: m.payload.get("attempt_id"),
            limit=self._deps.config.concurrency,
        )
        return len(messages)

    async def handle(self, message: OutboxRecord) -> None:
        cfg = self._deps.config
        snap = await self._deps.reads.snapshot(int(message.payload["attempt_id"]))
        attempt, job, runtime = snap if snap is not None else (None, None, None)
        if attempt is None or attempt.state is not AttemptState.CANCEL_REQUESTED or job is None:
            # Not at the provider (yet): acceptance re-sends the cancel once the job is known.
            await complete(self._deps, message.id, cfg.worker_id)
            return
        account = await self._deps.account(attempt.provider_account_id)
        ref = job_ref(attempt, account, job.provider_job_id, job.provider_request_id or "")
        call = await self._deps.gate.begin(account, attempt.provider_model, Operation.CANCEL)
        if call is None:  # the CANCEL breaker refuses: ask again later, not counted as a call
            await retry_later(
                self._deps,
                message.id,
                cfg.worker_id,
                available_at=self._deps.clock() + timedelta(seconds=cfg.breaker_retry_s),
            )
            return
        try:
            result = await self._deps.adapter(account).cancel_job(ref)
        except Exception as exc:
            log.info("attempt %s: cancel_job raised %r", attempt.id, exc)
            result = None
        await self._deps.gate.end(call, TRANSPORT_FAILURE if result is None else result.error)
        if result is not None and result.snapshot is not None:
            await self._normalizer.ingest(
                Observation(
                    attempt.provider_account_id,
                    job.provider_job_id,
                    result.snapshot,
                    EventSource.CANCEL,
                    self._deps.clock(),
                    attempt.id,
                )
            )
        now = self._deps.clock()
        calls = (runtime.cancel_calls if runtime else 0) + 1
        async with self._deps.db.unit(now) as u:
            # Confirm by polling soon: an acknowledgement is not yet the cancelled state.
            await u.set_runtime(attempt.id, attempt.task_id, cancel_calls=calls, next_poll_at=now)
            done = result is not None and (result.acknowledged or result.snapshot is not None)
            if done or calls >= cfg.max_cancel_calls:
                await u.complete_message(message.id, cfg.worker_id)
        if not done and calls < cfg.max_cancel_calls:
            await retry_later(
                self._deps,
                message.id,
                cfg.worker_id,
                available_at=now + timedelta(seconds=cfg.cancel_retry_s),
            )

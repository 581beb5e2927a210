"""The submit worker (design 9.20.1): the only place a provider job is created.

For each claimed ``attempt.submit`` message::

    attempt missing / not READY_TO_SUBMIT   -> no-op, message done (duplicate or already handled)
    attempt SUBMITTING                      -> a previous submit was interrupted: `settle`
    READY_TO_SUBMIT                         -> CAS to SUBMITTING with request_started_at, COMMIT,
                                               then call the adapter once with the attempt's
                                               stable client_request_key, then apply the outcome
                                               and mark the message done in ONE transaction

Right before the adapter call the worker renews the attempt's lease and checks that the store still
holds it under the attempt's fencing token (9.11.1). If not (the lease expired and was reclaimed,
or Redis lost it and the scheduler has not rebuilt it), the worker does NOT submit: nothing left,
so the attempt fails as ``PROVEN_ABSENT`` ("never sent") and the task is requeued without
excluding the candidate, exactly like a recovery that proved the job absent. The dispatcher then
admits it again under a fresh lease, within capacity. A slot held by no lease is never used.

An exception from the adapter call is an UNKNOWN outcome (the request may have left). If the
database fails after the adapter answered, nothing is written: the attempt stays SUBMITTING, and
`settle` (from the re-delivered message or the engine's sweep) moves it to SUBMIT_UNKNOWN once
`submitting_grace_s` has passed, or completes it if a provider job row exists. It never sends the
submit again: only recovery may, and only with the same key to a provider that honours it.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from controlplane.domain.failover import FailureStage
from controlplane.domain.outbox import Topic
from controlplane.domain.states import TASK_MACHINE, AttemptState, TaskState
from controlplane.execution.batching import run_batch
from controlplane.execution.events import EventNormalizer
from controlplane.execution.outcomes import (
    PROVEN_ABSENT,
    AfterCommit,
    ExecutionDeps,
    accept,
    claim_batch,
    fail_attempt,
    is_current,
    job_ref,
    plan_of,
    requeue,
    retry_later,
    to_unknown,
)
from controlplane.persistence.records import (
    AccountInfo,
    AttemptChanges,
    AttemptRecord,
    Failure,
    OutboxRecord,
)
from vidroute_core import tracing
from vidroute_core.adapter import CallFailure, SubmitKind, SubmitOutcome
from vidroute_core.errors import ErrorClass, make_error
from vidroute_core.logs import add_ids, bind_ids, ids_of
from vidroute_core.spec import RoutingMode

__all__ = ["SubmitWorker"]

log = logging.getLogger(__name__)


class SubmitWorker:
    """Consumes ``attempt.submit``; `submits` counts adapter submit calls made by this worker."""

    def __init__(self, deps: ExecutionDeps, normalizer: EventNormalizer) -> None:
        self._deps = deps
        self._normalizer = normalizer
        self.submits = 0

    async def run_once(self) -> int:
        """Claim and handle one batch; returns how many messages were claimed."""
        messages = await claim_batch(self._deps, Topic.SUBMIT)
        await run_batch(
            messages,
            self.handle,
            key=lambda m: m.payload.get("attempt_id"),
            limit=self._deps.config.concurrency,
        )
        return len(messages)

    async def handle(self, message: OutboxRecord) -> None:
        """Handle one ``attempt.submit`` message, every line logged carrying its ids, in a span
        that continues the dispatcher's (the payload's ``traceparent``, `vidroute_core.tracing`)."""
        payload = message.payload
        with (
            bind_ids(task_id=payload.get("task_id"), attempt_id=payload.get("attempt_id")),
            tracing.continue_trace("submit", payload.get("traceparent")),
        ):
            await self._handle(message)

    async def _handle(self, message: OutboxRecord) -> None:
        worker = self._deps.config.worker_id
        attempt_id = int(message.payload["attempt_id"])
        now = self._deps.clock()
        after = AfterCommit()
        started = None
        account: AccountInfo | None = None
        interrupted = False
        unsent = None
        async with self._deps.db.unit(now) as u:
            attempt = await u.attempt(attempt_id)
            task = None if attempt is None else await u.task(attempt.task_id)
            if attempt is None or task is None:
                await u.complete_message(message.id, worker)
            elif attempt.state is AttemptState.SUBMITTING:
                interrupted = True
            elif attempt.state is not AttemptState.READY_TO_SUBMIT:
                await u.complete_message(message.id, worker)  # duplicate or already handled
            elif TASK_MACHINE.is_terminal(task.state) or task.state is TaskState.QUEUED:
                # The task ended (e.g. cancelled) before anything was sent: nothing to submit.
                moved = await u.move_attempt(attempt, AttemptState.CANCELLED, "task ended")
                if moved is not None:
                    after.release.append(moved)
                    unsent = moved
                await u.complete_message(message.id, worker)
            else:
                account = await self._deps.account(attempt.provider_account_id, u)
                supports = bool(
                    message.payload.get(
                        "supports_idempotency_key",
                        account.provider in self._deps.config.idempotent_providers,
                    )
                )
                started = await u.move_attempt(
                    attempt,
                    AttemptState.SUBMITTING,
                    "submit started",
                    AttemptChanges(request_started_at=now),
                )
                if started is None:
                    await u.complete_message(message.id, worker)
                else:
                    await u.set_runtime(
                        started.id, started.task_id, supports_idempotency_key=supports
                    )
        await after.run(self._deps.leases)
        if unsent is not None:
            account = await self._deps.account(unsent.provider_account_id)
            await self._deps.gate.release_unsent(account, unsent)
        if interrupted:
            await self.settle(attempt_id, message)
        if started is None or account is None:
            return
        # The account read in the transaction above: not read again on another connection.
        adapter = self._deps.adapter(account)
        if not await self._deps.leases.still_held(started):
            await self._not_sent(started, message)
            return
        self.submits += 1
        began = time.monotonic()
        try:
            result = await adapter.submit(
                plan_of(started, account),
                started.client_request_key,
                self._deps.callback_url(account, started),
            )
        except Exception as exc:
            log.warning("attempt %s: submit call raised %r; outcome unknown", started.id, exc)
            result = SubmitOutcome(
                SubmitKind.UNKNOWN,
                error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "CLIENT_EXCEPTION", repr(exc)),
                call_failure=CallFailure.CLIENT_EXCEPTION,
            )
        await self.apply(started.id, result, message)
        await self._observe(account, started, result, time.monotonic() - began)

    async def _not_sent(self, attempt: AttemptRecord, message: OutboxRecord) -> None:
        """The lease is not this attempt's any more: fail it unsent and requeue (module doc)."""
        log.warning(
            "attempt %s: lease not held under fence %s; not submitted",
            attempt.id,
            attempt.fencing_token,
        )
        failure = Failure(
            ErrorClass.INTERNAL_RETRYABLE.value,
            PROVEN_ABSENT,
            f"never sent: lease not held under fencing token {attempt.fencing_token}",
        )
        after = AfterCommit()
        async with self._deps.db.unit(self._deps.clock()) as u:
            current = await u.attempt(attempt.id)
            task = None if current is None else await u.task(attempt.task_id)
            moved = None
            if current is not None and current.state is AttemptState.SUBMITTING:
                moved = await u.move_attempt(
                    current, AttemptState.FAILED, PROVEN_ABSENT, AttemptChanges(failure=failure)
                )
            if moved is not None:
                after.release.append(moved)
            if moved is not None and task is not None and await is_current(u, task, moved):
                runtime = await u.runtime(moved.id)
                attempts = await u.attempts_of(task.id)
                if runtime is not None and runtime.cancel_requested_at is not None:
                    await u.move_task(task, TaskState.CANCELLED, "cancel requested; not sent")
                elif len(attempts) >= self._deps.config.limits.max_total_attempts:
                    await u.move_task(task, TaskState.FAILED, "MAX_TOTAL_ATTEMPTS", failure=failure)
                else:
                    strict = task.spec.routing.mode is RoutingMode.STRICT_MODEL
                    await requeue(
                        u,
                        task,
                        moved,
                        attempts,
                        reason=PROVEN_ABSENT,
                        error_class=failure.failure_class,
                        same_model_only=strict,
                        limits=self._deps.config.limits,
                    )
            await u.complete_message(message.id, self._deps.config.worker_id)
        await after.run(self._deps.leases)
        account = await self._deps.account(attempt.provider_account_id)
        await self._deps.gate.release_unsent(account, attempt)

    async def _observe(
        self, account: AccountInfo, attempt: AttemptRecord, result: SubmitOutcome, took_s: float
    ) -> None:
        if self._deps.on_submit is None:
            return
        try:
            await self._deps.on_submit(account, attempt, result, took_s)
        except Exception:
            log.exception("submit observer failed for attempt %s", attempt.id)

    async def apply(
        self, attempt_id: int, result: SubmitOutcome, message: OutboxRecord | None = None
    ) -> None:
        """Apply a submit outcome to a SUBMITTING (or SUBMIT_UNKNOWN) attempt, atomically."""
        kind = result.kind
        error = result.error
        if kind is SubmitKind.ACCEPTED and result.job is None:
            kind = SubmitKind.UNKNOWN  # 2xx without a usable job id: 9.17.3 says UNKNOWN
        if kind is SubmitKind.REJECTED and (error is None or error.provider_may_have_accepted):
            kind = SubmitKind.UNKNOWN
        after = AfterCommit()
        accepted_job = None
        account_id = 0
        async with self._deps.db.unit(self._deps.clock()) as u:
            attempt = await u.attempt(attempt_id)
            assert attempt is not None
            account_id = attempt.provider_account_id
            add_ids(**ids_of(attempt, result.job))
            task = await u.task(attempt.task_id)
            assert task is not None
            if kind is SubmitKind.ACCEPTED and result.job is not None:
                await accept(
                    u,
                    self._deps,
                    attempt,
                    task,
                    result.job,
                    raw_status=result.raw_status,
                    reason="provider accepted the submit",
                    after=after,
                )
                accepted_job = result.job.provider_job_id
            elif kind is SubmitKind.REJECTED and error is not None:
                if attempt.state in (AttemptState.SUBMITTING, AttemptState.SUBMIT_UNKNOWN):
                    await fail_attempt(
                        u, self._deps, attempt, task, error, stage=FailureStage.SUBMIT, after=after
                    )
            elif attempt.state is AttemptState.SUBMITTING:
                await to_unknown(u, self._deps, attempt, result.uncertain_at, error, after=after)
            if message is not None:
                await u.complete_message(message.id, self._deps.config.worker_id)
        await after.run(self._deps.leases)
        if accepted_job is not None:
            # The account of the attempt just written (never re-read for it).
            await self._normalizer.replay_unmatched(account_id, accepted_job)

    async def settle(self, attempt_id: int, message: OutboxRecord | None = None) -> bool:
        """Resolve an interrupted submit: complete it if its job is recorded, else UNKNOWN.

        Returns True if the attempt left SUBMITTING. Within `submitting_grace_s` of the request
        start the submit may still be in flight in another worker: the message (if any) is
        postponed to the end of the grace period instead.
        """
        now = self._deps.clock()
        grace = timedelta(seconds=self._deps.config.submitting_grace_s)
        worker = self._deps.config.worker_id
        after = AfterCommit()
        postpone_to = None
        async with self._deps.db.unit(now) as u:
            attempt = await u.attempt(attempt_id)
            if attempt is None or attempt.state is not AttemptState.SUBMITTING:
                if message is not None:
                    await u.complete_message(message.id, worker)
                return False
            task = await u.task(attempt.task_id)
            assert task is not None
            job = await u.job_of(attempt.id)
            started = attempt.request_started_at
            if job is not None:
                account = await u.account(attempt.provider_account_id)
                ref = job_ref(attempt, account, job.provider_job_id, job.provider_request_id or "")
                await accept(
                    u,
                    self._deps,
                    attempt,
                    task,
                    ref,
                    raw_status=job.raw_status or "",
                    reason="settled",
                    after=after,
                )
            elif started is None or now - started >= grace:
                await to_unknown(u, self._deps, attempt, "SUBMIT_INTERRUPTED", None, after=after)
            else:
                postpone_to = started + grace
            if message is not None and postpone_to is None:
                await u.complete_message(message.id, worker)
        await after.run(self._deps.leases)
        if postpone_to is not None:
            if message is not None:
                await retry_later(self._deps, message.id, worker, available_at=postpone_to)
            return False
        return True

"""The submit worker (design 9.20.1): the only place a provider job is created.

For each claimed ``attempt.submit`` message::

    attempt missing / not READY_TO_SUBMIT   -> no-op, message done (duplicate or already handled)
    attempt SUBMITTING                      -> a previous submit was interrupted: `settle`
    READY_TO_SUBMIT                         -> CAS to SUBMITTING with request_started_at, COMMIT,
                                               then call the adapter once with the attempt's
                                               stable client_request_key, then apply the outcome
                                               and mark the message done in ONE transaction

Before the CAS to SUBMITTING, every send is cleared twice, the first send of an attempt and each
retry on the same candidate alike (a RETRY_SAME puts the attempt back to READY_TO_SUBMIT with a
new message):

* the SUBMIT breaker (9.15.2, `OperationGate.admit_submit`, under the attempt's client request
  key): OPEN refuses, HALF_OPEN admits at most the configured probes across replicas. A refused
  submit is PARKED, not failed: the attempt stays READY_TO_SUBMIT with its lease (kept alive by
  `WaitingLeases`) and its message is due again when the cooldown ends (at most
  `breaker_retry_s` later). So a probe that fails and reopens the breaker stops the retries
  queued behind it, and attempts dispatched just before the breaker opened are not sent into it.
* the lease (9.11.1, `LeaseKeeper.secure`): renewed, and held under the attempt's fencing token.
  If the store lost it (expired and reclaimed, Redis lost its data) the attempt takes a new one
  through the dispatcher's `LeaseSource`, recorded with the move to SUBMITTING; with no capacity
  left it waits unsent (`lease_wait_retry_s`). A slot held by no lease is never used, and a lease
  lost before the send is never a failed attempt. Only an engine built without a lease source
  fails such an attempt as ``PROVEN_ABSENT`` ("never sent") and requeues the task, as before.

The start steps of messages cleared side by side, and the outcomes of sends answered side by
side, are each written in groups as they come
(`batching.GroupWrites` over `start_each` and `apply_each`, at most `write_units` transactions
at once each): an item that finds a unit free is written at once, those arriving meanwhile
share the next unit, their attempts held in one read and their writes sent set-based
(`UnitOfWork.hold`). Each send still starts only after its own move to SUBMITTING committed,
and never waits for another's send. A group whose unit raises is written item by item.

An exception from the adapter call is an UNKNOWN outcome (the request may have left). If the
database fails after the adapter answered, nothing is written: the attempt stays SUBMITTING, and
`settle` (from the re-delivered message or the engine's sweep) moves it to SUBMIT_UNKNOWN once
`submitting_grace_s` has passed, or completes it if a provider job row exists. It never sends the
submit again: only recovery may, and only with the same key to a provider that honours it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controlplane.domain.failover import FailureStage
from controlplane.domain.outbox import Topic
from controlplane.domain.states import TASK_MACHINE, AttemptState, TaskState
from controlplane.execution.batching import GroupWrites, each_alone, run_batch
from controlplane.execution.events import EventNormalizer
from controlplane.execution.leasing import Secured
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
from controlplane.persistence.ports import UnitOfWork
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

_UNSENT = frozenset({AttemptState.READY_TO_SUBMIT, AttemptState.SUBMITTING})
# What `_clear` answers for an attempt whose task ended while its send was refused: not
# cleared, and not parked either (the transaction cancels the attempt).
_TASK_ENDED = Secured(False)
# What `_clearance` answers when the message needs nothing more (parked, or failed unsent).
_HANDLED = Secured(False)


# A send's outcome to write: the attempt, what the provider answered, the message it acks.
Outcome = tuple[int, SubmitOutcome, OutboxRecord | None]


@dataclass
class _Start:
    """A cleared message's start step (`SubmitWorker.start_each`) and what it decided."""

    message: OutboxRecord
    known: AttemptRecord | None
    cleared: Secured | None
    after: AfterCommit = field(default_factory=AfterCommit)
    started: AttemptRecord | None = None  # moved to SUBMITTING: to be sent
    account: AccountInfo | None = None
    interrupted: bool = False  # found SUBMITTING: an earlier send was cut off (`settle`)
    unsent: AttemptRecord | None = None  # cancelled unsent: its task ended


def _attempt_id(message: OutboxRecord) -> int:
    return int(message.payload["attempt_id"])


def _same_lease(attempt: AttemptRecord, known: AttemptRecord | None) -> bool:
    """Whether `attempt` still holds the lease it was cleared with (read as `known`)."""
    return (
        known is not None
        and attempt.lease_token == known.lease_token
        and attempt.fencing_token == known.fencing_token
    )


class SubmitWorker:
    """Consumes ``attempt.submit``; `submits` counts adapter submit calls made by this worker."""

    def __init__(self, deps: ExecutionDeps, normalizer: EventNormalizer) -> None:
        self._deps = deps
        self._normalizer = normalizer
        self.submits = 0
        self.parked = 0  # sends held back: the breaker refused, or no lease to be had
        self._starts: GroupWrites[_Start, _Start] = GroupWrites(
            self.start_each, units=deps.config.write_units
        )
        self._outcomes: GroupWrites[Outcome, None] = GroupWrites(
            self.apply_each, units=deps.config.write_units
        )

    async def run_once(self) -> int:
        """Claim and handle one batch; returns how many messages were claimed."""
        messages = await claim_batch(self._deps, Topic.SUBMIT)
        if not messages:
            return 0
        # The batch's attempts in one read: which ones are to be cleared for sending.
        known = await self._deps.reads.attempts(_attempt_id(m) for m in messages)
        await run_batch(
            messages,
            lambda m: self.handle(m, known.get(_attempt_id(m))),
            key=lambda m: m.payload.get("attempt_id"),
            limit=self._deps.config.concurrency,
        )
        return len(messages)

    async def handle(self, message: OutboxRecord, known: AttemptRecord | None = None) -> None:
        """Handle one ``attempt.submit`` message, every line logged carrying its ids, in a span
        that continues the dispatcher's (the payload's ``traceparent``, `vidroute_core.tracing`).
        `known` is the attempt as read for the batch (else it is read here)."""
        payload = message.payload
        with (
            bind_ids(task_id=payload.get("task_id"), attempt_id=payload.get("attempt_id")),
            tracing.continue_trace("submit", payload.get("traceparent")),
        ):
            await self._handle(message, known)

    async def _clear(self, attempt: AttemptRecord, message: OutboxRecord) -> Secured | None:
        """The breaker's admission and a lease for sending `attempt` now, or None: parked (the
        message is due again later; the attempt stays READY_TO_SUBMIT, nothing is failed)."""
        deps = self._deps
        cfg = deps.config
        account = await deps.account(attempt.provider_account_id)
        now = deps.clock()
        if not await deps.gate.admit_submit(account, attempt):
            if await self._task_ended(attempt):
                return _TASK_ENDED  # nothing will be sent: the transaction cancels it
            cooling = deps.gate.submit_reopens_in(account, attempt)
            wait = cfg.breaker_retry_s if cooling is None else min(cooling, cfg.breaker_retry_s)
            log.info(
                "attempt %s: submit breaker refuses the send; parked, asking again in %.1fs",
                attempt.id,
                wait,
            )
            await self._park(message, now + timedelta(seconds=wait))
            return None
        secured = await deps.leases.secure(attempt)
        if secured.ok:
            if secured.new is not None:
                log.warning(
                    "attempt %s: lease not held under fence %s before the send; sending under"
                    " a new lease (fence %s)",
                    attempt.id,
                    attempt.fencing_token,
                    secured.new.fencing_token,
                )
            return secured
        await deps.gate.release_unsent(account, attempt)
        if not deps.leases.can_relet:
            return Secured(False)  # `_not_sent`: fail it unsent, as without a lease source
        log.warning(
            "attempt %s: lease not held under fence %s and no new one free; waiting unsent",
            attempt.id,
            attempt.fencing_token,
        )
        await self._park(message, now + timedelta(seconds=cfg.lease_wait_retry_s))
        return None

    async def _clearance(
        self, known: AttemptRecord | None, message: OutboxRecord
    ) -> Secured | None:
        """`_clear` for an attempt read READY_TO_SUBMIT (None for any other: nothing to send);
        `_HANDLED` when the message is dealt with (parked, or failed unsent without a lease
        source, `_not_sent`)."""
        if known is None or known.state is not AttemptState.READY_TO_SUBMIT:
            return None
        cleared = await self._clear(known, message)
        if cleared is None:
            return _HANDLED
        if cleared is _TASK_ENDED:
            return None
        if not cleared.ok:
            await self._not_sent(known, message)
            return _HANDLED
        return cleared

    async def _task_ended(self, attempt: AttemptRecord) -> bool:
        task = (await self._deps.reads.tasks([attempt.task_id])).get(attempt.task_id)
        return (
            task is None or TASK_MACHINE.is_terminal(task.state) or task.state is TaskState.QUEUED
        )

    async def _park(self, message: OutboxRecord, until: datetime) -> None:
        self.parked += 1
        await retry_later(self._deps, message.id, self._deps.config.worker_id, available_at=until)

    async def _handle(self, message: OutboxRecord, known: AttemptRecord | None) -> None:
        attempt_id = int(message.payload["attempt_id"])
        if known is None or known.id != attempt_id:
            known = (await self._deps.reads.attempts([attempt_id])).get(attempt_id)
        cleared = await self._clearance(known, message)
        if cleared is _HANDLED:
            return
        start = await self._starts.submit(_Start(message, known, cleared))
        await start.after.run(self._deps.leases)
        if start.unsent is not None:
            account = await self._deps.account(start.unsent.provider_account_id)
            await self._deps.gate.release_unsent(account, start.unsent)
        unstarted = start.started is None and not start.interrupted
        if unstarted and cleared is not None and known is not None:
            await self._unclear(known, cleared, start.unsent is not None)
        if start.interrupted:
            await self.settle(attempt_id, message)
        if start.started is None or start.account is None:
            return
        await self._send(start.started, start.account, message)

    async def start_each(self, starts: Sequence[_Start]) -> list[_Start | Exception]:
        """The start steps of messages cleared side by side, in ONE transaction (their attempts
        held in one read, the moves to SUBMITTING and runtime rows sent set-based at its end,
        committed before any of them is sent); if it raises, each in its own. Per message its
        decided `_Start`, or the error that refused it."""
        if not starts:
            return []
        try:
            async with self._deps.db.unit(self._deps.clock()) as u:
                await u.hold(sorted({_attempt_id(s.message) for s in starts}))
                for start in starts:
                    with bind_ids(attempt_id=_attempt_id(start.message)):
                        await self._start(u, start)
        except Exception as exc:
            fresh = [_Start(s.message, s.known, s.cleared) for s in starts]  # undecided again
            return await each_alone(exc, fresh, self.start_each, "submit starts")
        return list(starts)

    async def _start(self, u: UnitOfWork, start: _Start) -> None:
        """One message's start step in unit `u` (see the module): what it decided, in `start`."""
        worker = self._deps.config.worker_id
        message, known, cleared, now = start.message, start.known, start.cleared, u.now
        attempt = await u.attempt(_attempt_id(message))
        task = None if attempt is None else await u.task(attempt.task_id)
        if attempt is None or task is None:
            await u.complete_message(message.id, worker)
        elif attempt.state is AttemptState.SUBMITTING:
            start.interrupted = True
        elif attempt.state is not AttemptState.READY_TO_SUBMIT:
            await u.complete_message(message.id, worker)  # duplicate or already handled
        elif TASK_MACHINE.is_terminal(task.state) or task.state is TaskState.QUEUED:
            # The task ended (e.g. cancelled) before anything was sent: nothing to submit.
            moved = await u.move_attempt(attempt, AttemptState.CANCELLED, "task ended")
            if moved is not None:
                start.after.release.append(moved)
                start.unsent = moved
            await u.complete_message(message.id, worker)
        elif cleared is None or not _same_lease(attempt, known):
            # Not cleared for this version of the attempt (it moved since it was read):
            # the message comes back and is cleared then.
            await u.retry_message(message.id, worker, available_at=now)
        else:
            account = await self._deps.account(attempt.provider_account_id, u)
            supports = bool(
                message.payload.get(
                    "supports_idempotency_key",
                    account.provider in self._deps.config.idempotent_providers,
                )
            )
            new = cleared.new
            started = await u.move_attempt(
                attempt,
                AttemptState.SUBMITTING,
                "submit started" if new is None else "submit started under a new lease",
                AttemptChanges(
                    request_started_at=now,
                    lease_token=None if new is None else new.token,
                    fencing_token=None if new is None else new.fencing_token,
                ),
            )
            if started is None:
                await u.complete_message(message.id, worker)
            else:
                await u.set_runtime(started.id, started.task_id, supports_idempotency_key=supports)
                start.started, start.account = started, account

    async def _send(
        self, started: AttemptRecord, account: AccountInfo, message: OutboxRecord
    ) -> None:
        """The one provider call of a SUBMITTING attempt, and its outcome applied."""
        # The account read in the transaction that started it: not read again.
        adapter = self._deps.adapter(account)
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
        await self._outcomes.submit((started.id, result, message))
        await self._observe(account, started, result, time.monotonic() - began)

    async def _unclear(self, attempt: AttemptRecord, cleared: Secured, released: bool) -> None:
        """`attempt` was cleared to send but not started (ended, moved meanwhile): give back
        its breaker admission (unless done) and the new lease it did not record."""
        if not released:
            account = await self._deps.account(attempt.provider_account_id)
            await self._deps.gate.release_unsent(account, attempt)
        if cleared.new is not None:
            await self._deps.leases.release_lease(cleared.new)

    async def _not_sent(self, attempt: AttemptRecord, message: OutboxRecord) -> None:
        """The lease is not this attempt's any more and no lease source can replace it: fail
        it unsent and requeue (module doc)."""
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
            if current is not None and current.state in _UNSENT:
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
        """Apply a submit outcome to a SUBMITTING (or SUBMIT_UNKNOWN) attempt, atomically: the
        batch of one of `apply_each`."""
        [error] = await self.apply_each([(attempt_id, result, message)])
        if error is not None:
            raise error

    async def apply_each(self, outcomes: Sequence[Outcome]) -> list[Exception | None]:
        """Apply submit outcomes in ONE transaction, each as alone, in order (their attempts
        held in one read); if it raises, each in its own. Per outcome the error that refused
        it, or None."""
        if not outcomes:
            return []
        afters = [AfterCommit() for _ in outcomes]
        try:
            async with self._deps.db.unit(self._deps.clock()) as u:
                await u.hold(sorted({attempt_id for attempt_id, _, _ in outcomes}))
                jobs = [
                    await self._apply(u, attempt_id, result, after=after)
                    for (attempt_id, result, _), after in zip(outcomes, afters, strict=True)
                ]
                done = [m.id for _, _, m in outcomes if m is not None]
                await u.complete_messages(done, self._deps.config.worker_id)
                # Early observations of accepted jobs (a callback that beat the answer) are
                # replayed after the commit; asked last, in one read for the group.
                early = await u.unmatched([j for j in jobs if j is not None])
        except Exception as exc:
            return await each_alone(exc, outcomes, self.apply_each, "submit outcomes")
        for after in afters:
            await after.run(self._deps.leases)
        for job in jobs:
            if job is not None and job in early:
                # The account of the attempt just written (never re-read for it).
                await self._normalizer.replay_unmatched(*job)
        return [None] * len(outcomes)

    async def _apply(
        self,
        u: UnitOfWork,
        attempt_id: int,
        result: SubmitOutcome,
        *,
        after: AfterCommit,
    ) -> tuple[int, str] | None:
        """One outcome in unit `u` (its message is acked by the caller); the (account, job id)
        of an accepted job."""
        kind = result.kind
        error = result.error
        if kind is SubmitKind.ACCEPTED and result.job is None:
            kind = SubmitKind.UNKNOWN  # 2xx without a usable job id: 9.17.3 says UNKNOWN
        if kind is SubmitKind.REJECTED and (error is None or error.provider_may_have_accepted):
            kind = SubmitKind.UNKNOWN
        accepted_job = None
        with bind_ids(attempt_id=attempt_id):
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
        return None if accepted_job is None else (account_id, accepted_job)

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

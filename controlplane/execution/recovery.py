"""Recovery of SUBMIT_UNKNOWN attempts (design 9.17.4, 9.17.5). Never a blind re-submit.

Each due attempt gets one step per turn, cheapest evidence first:

1. an early callback stored for this attempt (UNMATCHED event naming it): FOUND;
2. the provider honours idempotency keys (`supports_idempotency_key` on the runtime row, from
   the submit message or `ExecutionConfig.idempotent_providers`): re-send the SAME plan with
   the SAME client_request_key; ACCEPTED = FOUND, a definite REJECTED proves it was not created;
3. otherwise `AdapterClient.recover` (key, request id, account task search in the adapter);
4. after `usage_lookup_after_queries` inconclusive steps: usage records, FOUND only when they
   identify one job of THIS attempt (a job id plus its client key or recorded provider request
   id, `controlplane.execution.usage_match`). Aggregates (Runway's daily totals) and ambiguous
   matches are stored as evidence for reconciliation (`evidence`) and stay INCONCLUSIVE.

A job with an empty id is never adopted, whatever the source claims.

FOUND records the job and continues as ACCEPTED. NOT_FOUND (conclusive) fails the attempt with
``PROVEN_ABSENT`` and requeues the task WITHOUT excluding the candidate (chosen over "back to
READY_TO_SUBMIT": a fresh attempt gets a fresh lease and routing look, and the old attempt keeps
its honest history); a cancel asked meanwhile cancels the task instead. INCONCLUSIVE retries
with exponential backoff. Past `unknown_recovery_deadline_s`, `max_recovery_queries` or
`max_unknown_age_s` the attempt is ABANDONED (lease left to reconciliation) and the task FAILS
with SUBMISSION_UNKNOWN unless `allow_new_attempt_after_abandon` requeues it; the reason records
which policy applied. An ABANDONED attempt then gets a background lookup (`LateLookup`) whose
result is recorded and never revives the task.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from controlplane.domain.breaker import Operation
from controlplane.domain.failover import FailureStage, backoff_delay_s
from controlplane.domain.observation import IngestOutcome
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.breakers import TRANSPORT_FAILURE
from controlplane.execution.evidence import record_evidence
from controlplane.execution.late_lookup import LateLookup
from controlplane.execution.outcomes import (
    PROVEN_ABSENT,
    AfterCommit,
    ExecutionDeps,
    accept,
    fail_attempt,
    is_current,
    job_ref,
    plan_of,
    requeue,
)
from controlplane.execution.usage_match import match_usage
from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import (
    AccountInfo,
    AttemptChanges,
    AttemptRecord,
    AttemptRuntime,
    Failure,
    TaskRecord,
)
from vidroute_core.adapter import (
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
)
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.logs import add_ids, bind_ids, ids_of
from vidroute_core.spec import RoutingMode

__all__ = ["RecoveryWorker", "settle_task"]

log = logging.getLogger(__name__)
_WINDOW_SLACK = timedelta(minutes=5)


class RecoveryWorker:
    """Runs recovery steps for due SUBMIT_UNKNOWN attempts; `resubmits` counts same-key sends."""

    def __init__(self, deps: ExecutionDeps) -> None:
        self._deps = deps
        self.resubmits = 0
        self.abandoned = 0
        self.late = LateLookup(deps, self)

    async def run_once(self) -> int:
        cfg = self._deps.config
        async with self._deps.db.unit(self._deps.clock(), one_statement=True) as u:
            ids = await u.claim_recoveries(
                cfg.worker_id, limit=cfg.batch_size, lease_s=cfg.claim_lease_s
            )
        for attempt_id in ids:
            with bind_ids(attempt_id=attempt_id):
                await self.step(attempt_id)
        async with self._deps.db.unit(self._deps.clock(), one_statement=True) as u:
            late = await u.claim_late_lookups(
                cfg.worker_id, limit=cfg.batch_size, lease_s=cfg.claim_lease_s
            )
        for attempt_id in late:
            with bind_ids(attempt_id=attempt_id):
                await self.late.step(attempt_id)
        return len(ids) + len(late)

    async def step(self, attempt_id: int) -> RecoveryVerdict | None:
        """One recovery step; returns the verdict reached (None if nothing was done)."""
        snap = await self._deps.reads.snapshot(attempt_id)
        if snap is None or snap[0].state is not AttemptState.SUBMIT_UNKNOWN:
            return None
        attempt, job, runtime = snap
        add_ids(**ids_of(attempt, job))
        now = self._deps.clock()
        unknown_since = (runtime.unknown_since if runtime else None) or attempt.updated_at
        started = attempt.request_started_at or unknown_since
        cfg = self._deps.config
        queries = runtime.recovery_queries if runtime else 0
        why = None
        if (now - unknown_since).total_seconds() > cfg.unknown_recovery_deadline_s:
            why = "unknown_recovery_deadline"
        elif queries >= cfg.max_recovery_queries:
            why = "max_recovery_queries"
        elif (now - started).total_seconds() > cfg.max_unknown_age_s:
            why = "max_unknown_age"
        if why is not None:
            await self.abandon(attempt_id, why)
            return None
        account = await self._deps.account(attempt.provider_account_id)
        await self._deps.leases.renew(attempt)
        result = await self._query(attempt, account, runtime, started, unknown_since)
        if result is None:
            return None  # the idempotent re-send was applied as a submit outcome
        if (
            result.verdict is RecoveryVerdict.INCONCLUSIVE
            and queries + 1 >= cfg.usage_lookup_after_queries
        ):
            result = await self.usage_lookup(attempt, account, started) or result
        await self._apply(attempt_id, result)
        return result.verdict

    async def _query(
        self,
        attempt: AttemptRecord,
        account: AccountInfo,
        runtime: AttemptRuntime | None,
        started: datetime,
        unknown_since: datetime,
    ) -> RecoverResult | None:
        for event in reversed(await self._deps.reads.events(attempt_id=attempt.id)):
            if event.outcome == IngestOutcome.UNMATCHED.value:
                ref = job_ref(attempt, account, event.provider_job_id)
                return RecoverResult(RecoveryVerdict.FOUND, job=ref, method="early_callback")
        adapter = self._deps.adapter(account)
        # The re-send is a submit: its breaker admits it like any other (9.15.2); refused, the
        # step asks with a lookup instead, which sends nothing.
        if (
            runtime is not None
            and runtime.supports_idempotency_key
            and await self._deps.gate.admit_submit(account, attempt)
        ):
            self.resubmits += 1
            began = time.monotonic()
            try:
                sent = await adapter.submit(
                    plan_of(attempt, account),
                    attempt.client_request_key,
                    self._deps.callback_url(account, attempt),
                )
            except Exception as exc:
                log.info("attempt %s: idempotent re-send raised %r", attempt.id, exc)
                sent = SubmitOutcome(
                    SubmitKind.UNKNOWN,
                    error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "CLIENT_EXCEPTION", repr(exc)),
                )
            await self._observe(account, attempt, sent, time.monotonic() - began)
            if sent.kind is SubmitKind.ACCEPTED and sent.job is not None:
                return RecoverResult(
                    RecoveryVerdict.FOUND, job=sent.job, method="idempotent_resubmit"
                )
            if (
                sent.kind is SubmitKind.REJECTED
                and sent.error is not None
                and not sent.error.provider_may_have_accepted
            ):
                await self._rejected(attempt.id, sent.error)
                return None
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method="idempotent_resubmit")
        try:
            return await adapter.recover(
                RecoverQuery(
                    account=str(attempt.compile_plan.get("account", account.account_name)),
                    model=attempt.provider_model,
                    client_request_key=attempt.client_request_key,
                    request_hash=attempt.request_hash or "",
                    plan=plan_of(attempt, account),
                    submitted_after=started - _WINDOW_SLACK,
                    # The submit call had ended (or its worker died) when the attempt became
                    # unknown, so no request of it can start later. "Now" would be true too, but
                    # adapters wait submit_read + settle past this bound before a NOT_FOUND is
                    # conclusive, and with "now" that moment never comes.
                    submitted_before=unknown_since,
                    request_started_at=attempt.request_started_at,
                )
            )
        except Exception as exc:
            log.info("attempt %s: recover raised %r", attempt.id, exc)
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method="recover_error")

    async def _observe(
        self, account: AccountInfo, attempt: AttemptRecord, sent: SubmitOutcome, took_s: float
    ) -> None:
        """A re-send's outcome to the submit observer: the breaker hears it under the attempt's
        key (a HALF_OPEN probe slot it took is freed or counted), the metrics count it."""
        if self._deps.on_submit is None:
            return
        try:
            await self._deps.on_submit(account, attempt, sent, took_s)
        except Exception:
            log.exception("submit observer failed for attempt %s", attempt.id)

    async def usage_lookup(
        self, attempt: AttemptRecord, account: AccountInfo, started: datetime
    ) -> RecoverResult | None:
        """FOUND when usage identifies this attempt's job; otherwise evidence is stored. None
        (nothing asked) where the capability declares no usage records (Veo: its spend is in
        the Cloud Billing export, not behind an API)."""
        if not await self._deps.lists_usage(attempt):
            return None
        call = await self._deps.gate.begin(account, attempt.provider_model, Operation.USAGE_QUERY)
        if call is None:
            return None  # the USAGE_QUERY breaker refuses: this step stays inconclusive
        try:
            records = await self._deps.adapter(account).list_usage(
                str(attempt.compile_plan.get("account", account.account_name)),
                started - _WINDOW_SLACK,
                self._deps.clock(),
            )
        except Exception as exc:
            log.info("attempt %s: list_usage raised %r", attempt.id, exc)
            await self._deps.gate.end(call, TRANSPORT_FAILURE)
            return None
        await self._deps.gate.end(call, None)
        found = match_usage(
            records,
            model=attempt.provider_model,
            # An unknown submit has no provider job row yet, so no provider request id was
            # recorded for it: the client request key is its only identity.
            client_request_key=attempt.client_request_key,
        )
        if found.job_id:
            known = await self._deps.reads.known_job_ids(
                attempt.provider_account_id, [found.job_id]
            )
            if not known:
                ref = job_ref(attempt, account, found.job_id)
                return RecoverResult(RecoveryVerdict.FOUND, job=ref, method="usage_records")
            log.warning(
                "attempt %s: usage names job %s, which another attempt holds",
                attempt.id,
                found.job_id,
            )
        if found.evidence:
            async with self._deps.db.unit(self._deps.clock()) as u:
                for kind, details in found.evidence:
                    await record_evidence(u, attempt, kind, details)
        return None

    async def _rejected(self, attempt_id: int, error: ProviderError) -> None:
        after = AfterCommit()
        async with self._deps.db.unit(self._deps.clock()) as u:
            attempt = await u.attempt(attempt_id)
            task = None if attempt is None else await u.task(attempt.task_id)
            if attempt is None or task is None or attempt.state is not AttemptState.SUBMIT_UNKNOWN:
                return
            await fail_attempt(
                u, self._deps, attempt, task, error, stage=FailureStage.SUBMIT, after=after
            )
        await after.run(self._deps.leases)

    async def _apply(self, attempt_id: int, result: RecoverResult) -> None:
        cfg = self._deps.config
        after = AfterCommit()
        async with self._deps.db.unit(self._deps.clock()) as u:
            attempt = await u.attempt(attempt_id)
            task = None if attempt is None else await u.task(attempt.task_id)
            if attempt is None or task is None or attempt.state is not AttemptState.SUBMIT_UNKNOWN:
                return
            if result.verdict is RecoveryVerdict.FOUND and not (
                result.job is not None and result.job.provider_job_id
            ):
                # A FOUND without a job id names nothing: adopting it would poll an empty id.
                log.warning("attempt %s: %s found no job id; inconclusive", attempt.id, result)
                result = RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=result.method)
            if result.verdict is RecoveryVerdict.FOUND and result.job is not None:
                await accept(
                    u,
                    self._deps,
                    attempt,
                    task,
                    result.job,
                    raw_status="",
                    reason=f"recovered by {result.method or 'recover'}",
                    after=after,
                )
            elif result.verdict is RecoveryVerdict.NOT_FOUND:
                failure = Failure(
                    ErrorClass.SUBMISSION_UNKNOWN.value,
                    PROVEN_ABSENT,
                    f"provider has no job for the key (method={result.method or 'recover'})",
                )
                moved = await u.move_attempt(
                    attempt, AttemptState.FAILED, PROVEN_ABSENT, AttemptChanges(failure=failure)
                )
                if moved is None:
                    return
                after.release.append(moved)
                await u.set_runtime(moved.id, moved.task_id, next_recovery_at=None)
                await self._after_attempt_end(u, moved, task, PROVEN_ABSENT, failure)
            else:
                runtime = await u.runtime(attempt.id)
                queries = (runtime.recovery_queries if runtime else 0) + 1
                delay = backoff_delay_s(
                    queries,
                    base_s=cfg.recovery_base_s,
                    cap_s=cfg.recovery_cap_s,
                    unit_random=self._deps.rng.random(),
                )
                await u.set_runtime(
                    attempt.id,
                    attempt.task_id,
                    recovery_queries=queries,
                    next_recovery_at=u.now + timedelta(seconds=delay),
                )
        await after.run(self._deps.leases)

    async def abandon(self, attempt_id: int, why: str) -> bool:
        """SUBMIT_UNKNOWN -> ABANDONED; the task follows `allow_new_attempt_after_abandon`."""
        policy = self._deps.config.allow_new_attempt_after_abandon
        async with self._deps.db.unit(self._deps.clock()) as u:
            attempt = await u.attempt(attempt_id)
            task = None if attempt is None else await u.task(attempt.task_id)
            if attempt is None or task is None or attempt.state is not AttemptState.SUBMIT_UNKNOWN:
                return False
            failure = Failure(
                ErrorClass.SUBMISSION_UNKNOWN.value,
                "ABANDONED",
                f"recovery gave up ({why}); allow_new_attempt_after_abandon={policy}",
            )
            moved = await u.move_attempt(
                attempt,
                AttemptState.ABANDONED,
                f"ABANDONED: {why}",
                AttemptChanges(failure=failure),
            )
            if moved is None:
                return False
            # The lease is NOT released: the job may be running; reconciliation settles it.
            # The background lookup (`LateLookup`) keeps looking, recording what it finds.
            await u.set_runtime(moved.id, moved.task_id, next_recovery_at=self.late.first_at(u.now))
            reason = "ABANDONED_NEW_ATTEMPT" if policy else "ABANDONED_TASK_FAILED"
            await self._after_attempt_end(u, moved, task, reason, failure, requeue_ok=policy)
        self.abandoned += 1
        return True

    async def _after_attempt_end(
        self,
        u: UnitOfWork,
        attempt: AttemptRecord,
        task: TaskRecord,
        reason: str,
        failure: Failure,
        *,
        requeue_ok: bool = True,
    ) -> None:
        await settle_task(
            u, self._deps, attempt, task, reason=reason, failure=failure, requeue_ok=requeue_ok
        )


async def settle_task(
    u: UnitOfWork,
    deps: ExecutionDeps,
    attempt: AttemptRecord,
    task: TaskRecord,
    *,
    reason: str,
    failure: Failure,
    requeue_ok: bool = True,
) -> None:
    """The task once its current attempt ended with no job outcome (proven absent, abandoned,
    lost): cancelled if a cancel was asked, FAILED when `requeue_ok` is False (the abandon
    policy), otherwise requeued within the deadline and attempt limits."""
    if not await is_current(u, task, attempt):
        return
    runtime = await u.runtime(attempt.id)
    limits = deps.config.limits
    attempts = await u.attempts_of(task.id)
    if runtime is not None and runtime.cancel_requested_at is not None:
        await u.move_task(task, TaskState.CANCELLED, f"cancel requested; {reason}")
    elif not requeue_ok:
        await u.move_task(task, TaskState.FAILED, reason, failure=failure)
    elif task.deadline_at is not None and u.now >= task.deadline_at:
        await u.move_task(task, TaskState.FAILED, "TASK_DEADLINE_EXCEEDED", failure=failure)
    elif len(attempts) >= limits.max_total_attempts:
        await u.move_task(task, TaskState.FAILED, "MAX_TOTAL_ATTEMPTS", failure=failure)
    else:
        await requeue(
            u,
            task,
            attempt,
            attempts,
            reason=reason,
            error_class=failure.failure_class,
            same_model_only=task.spec.routing.mode is RoutingMode.STRICT_MODEL,
            limits=limits,
        )

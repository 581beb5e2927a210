"""The decisions every execution worker shares, applied inside one unit of work (`UnitOfWork`).

* `accept`: a provider job is known for the attempt (submit ACCEPTED, recovery FOUND, a crashed
  submit whose job row exists): record the job (never overwriting another, 9.3.4), move the
  attempt to ACCEPTED and the task to RUNNING, schedule the first poll.
* `to_unknown`: the submit's fate is unknown: SUBMIT_UNKNOWN with the transport stage, recovery
  scheduled, lease moved to the unknown budget. Never a new attempt, never a re-send (9.17).
* `fail_attempt`: a definite failure (rejected submit, failed job): the 9.9.1 matrix via
  `controlplane.domain.failover.decide` chooses RETRY_SAME / FAIL_OVER / FAIL_TASK.
* `requeue`: hand the task back to the scheduler (task -> QUEUED + ``task.requeue``), unless
  the task is past its deadline or a new attempt could push its estimated platform loss past
  ``max_estimated_platform_loss_micros`` (9.16.4): then the task FAILS with that reason. Every
  path that gives a task a new attempt (failover here, recovery's PROVEN_ABSENT / ABANDONED)
  goes through it, so these bounds hold on all of them.

Lease calls are collected in `AfterCommit` and run only once the transaction committed.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.domain.failover import (
    FailoverAction,
    FailoverInput,
    FailoverLimits,
    FailureStage,
    backoff_delay_s,
    count_switches,
    decide,
    exclusion_is_soft,
    requeue_backoff_s,
)
from controlplane.domain.observation import task_waits_on
from controlplane.domain.outbox import Topic
from controlplane.domain.polling import DurationEvidence, PollPhase, next_poll_delay
from controlplane.domain.requeue import ExcludedCandidate, RequeueRequest
from controlplane.domain.states import ATTEMPT_MACHINE, TASK_MACHINE, AttemptState, TaskState
from controlplane.execution.bounds import as_failed, loss_after, platform_loss, requeue_refusal
from controlplane.execution.breakers import OperationGate
from controlplane.execution.config import ExecutionConfig
from controlplane.execution.leasing import LeaseKeeper
from controlplane.execution.usage_entries import record_expected
from controlplane.persistence.ports import ExecutionReads, TaskReads, UnitOfWork, UnitSource
from controlplane.persistence.records import (
    AccountInfo,
    AttemptChanges,
    AttemptRecord,
    Failure,
    NewOutboxMessage,
    NewProviderJob,
    OutboxRecord,
    ProviderJobRecord,
    TaskRecord,
)
from vidroute_core import tracing
from vidroute_core.adapter import CompiledPlan, JobRef, JobSnapshot, SubmitOutcome
from vidroute_core.errors import ErrorClass, ProviderError

__all__ = [
    "PROVEN_ABSENT",
    "AfterCommit",
    "DurationSource",
    "ExecutionDeps",
    "accept",
    "claim_batch",
    "complete",
    "fail_attempt",
    "job_ref",
    "plan_of",
    "requeue",
    "retry_later",
    "to_unknown",
]

# The decisions an operator asks about (retry, failover, unknown submit, a task failing) are
# INFO lines, logged in the deciding transaction (one the database refuses is retried).
log = logging.getLogger(__name__)

PROVEN_ABSENT = "PROVEN_ABSENT"


class DurationSource(Protocol):
    """What the poller needs of the scheduler's `HealthMonitor` (its health windows)."""

    def job_durations(self, provider: str, account: str, model: str) -> DurationEvidence | None: ...


@dataclass
class ExecutionDeps:
    """What every worker needs; `adapters` maps a provider name to its adapter client.

    `db` opens the units of work every write goes through; `reads` and `tasks` are the
    lock-free reads a worker decides from (a `Database`'s queries, or the in-memory fake)."""

    db: UnitSource
    reads: ExecutionReads
    tasks: TaskReads
    adapters: Mapping[str, AdapterClient]
    leases: LeaseKeeper
    config: ExecutionConfig
    clock: Callable[[], datetime]
    rng: random.Random = field(default_factory=random.Random)
    # Told about every submit call (account, attempt, result, seconds taken), e.g. to feed the
    # circuit breakers and health windows of the scheduler (9.13.3, 9.15). Never raises into
    # the worker: a failing observer is logged and ignored.
    on_submit: SubmitObserver | None = None
    # Told when a provider job reaches a terminal state (succeeded or not), with the snapshot:
    # the generation outcomes that feed the routing health windows (9.13.3).
    on_attempt_end: AttemptEndObserver | None = None
    # The operation breakers (POLL, CANCEL, DOWNLOAD_OUTPUT, USAGE_QUERY) around provider calls.
    gate: OperationGate = field(default_factory=OperationGate)
    # The candidates' finished-job durations (the scheduler's health windows), from which the
    # poller learns each model's p95 and max plausible duration (9.18.2); None: configured.
    durations: DurationSource | None = None
    # Whether the attempt's candidate declares usage records (Describe's
    # `operations.usage_records`); None: not wired, every provider is asked.
    usage_declared: UsageDeclared | None = None

    # Accounts by id, as read once (their identity is the table's unique key, never updated).
    _accounts: dict[int, AccountInfo] = field(default_factory=dict, init=False, repr=False)

    async def account(self, account_id: int, u: UnitOfWork | None = None) -> AccountInfo:
        """The account, read the first time only. Inside a unit pass it as `u`: the read then
        goes through the unit's connection (a read on another connection inside a unit could
        wait for the unit's own connection on SQLite)."""
        found = self._accounts.get(account_id)
        if found is None:
            reader = self.reads if u is None else u
            found = self._accounts[account_id] = await reader.account(account_id)
        return found

    async def lists_usage(self, attempt: AttemptRecord) -> bool:
        """Whether recovery may read the attempt's provider's usage records: only where its
        capability declares them (a provider without a usage route is never asked)."""
        return self.usage_declared is None or await self.usage_declared(attempt)

    def adapter(self, account: AccountInfo) -> AdapterClient:
        try:
            return self.adapters[account.provider]
        except KeyError:
            raise LookupError(f"no adapter client configured for {account.provider!r}") from None

    def callback_url(self, account: AccountInfo, attempt: AttemptRecord) -> str:
        base = self.config.callback_base_url.rstrip("/")
        if not base:
            return ""
        return f"{base}/callbacks/{account.provider}?attempt={attempt.id}"


UsageDeclared = Callable[[AttemptRecord], Awaitable[bool]]
SubmitObserver = Callable[[AccountInfo, AttemptRecord, SubmitOutcome, float], Awaitable[None]]
AttemptEndObserver = Callable[[AccountInfo, AttemptRecord, JobSnapshot], Awaitable[None]]


async def claim_batch(deps: ExecutionDeps, topic: str) -> list[OutboxRecord]:
    """Claim this worker's next batch of `topic` messages for the configured lease (one
    statement, `claim_messages`: on PostgreSQL without BEGIN/COMMIT around it)."""
    cfg = deps.config
    async with deps.db.unit(deps.clock(), one_statement=True) as u:
        return await u.claim_messages(
            topic, cfg.worker_id, limit=cfg.batch_size, lease_seconds=cfg.claim_lease_s
        )


async def complete(deps: ExecutionDeps, message_id: int, worker: str) -> None:
    """Mark a message done that needs nothing else written (its effect is moot)."""
    async with deps.db.unit(deps.clock()) as u:
        await u.complete_message(message_id, worker)


async def retry_later(
    deps: ExecutionDeps, message_id: int, worker: str, *, available_at: datetime
) -> None:
    """Release the claim on a message so it becomes due again at `available_at`."""
    async with deps.db.unit(deps.clock()) as u:
        await u.retry_message(message_id, worker, available_at=available_at)


@dataclass
class AfterCommit:
    """Lease operations to run once the transaction that justified them committed."""

    release: list[AttemptRecord] = field(default_factory=list)
    mark_unknown: list[AttemptRecord] = field(default_factory=list)
    resolve_unknown: list[AttemptRecord] = field(default_factory=list)
    ended: list[tuple[AttemptRecord, JobSnapshot]] = field(default_factory=list)

    async def run(self, leases: LeaseKeeper) -> None:
        for attempt in self.mark_unknown:
            await leases.mark_unknown(attempt)
        for attempt in self.resolve_unknown:
            await leases.resolve_unknown(attempt)
        for attempt in self.release:
            await leases.release(attempt)


def plan_of(attempt: AttemptRecord, account: AccountInfo) -> CompiledPlan:
    """The stored plan JSON as the `CompiledPlan` the adapter was compiled with."""
    p = attempt.compile_plan
    cost = p.get("estimated_cost") or {}
    return CompiledPlan(
        provider=str(p.get("provider", account.provider)),
        account=str(p.get("account", account.account_name)),
        model=str(p.get("model", attempt.provider_model)),
        model_version=str(p.get("model_version", attempt.provider_model_version)),
        capability_version=str(p.get("capability_version", attempt.capability_version)),
        price_version=str(p.get("price_version", attempt.price_version)),
        request_hash=str(p.get("request_hash", attempt.request_hash or "")),
        estimated_cost_micros=int(cost.get("amount_micros", attempt.estimated_cost_micros)),
        currency=str(cost.get("currency_code", attempt.currency)),
        submittable=bool(p.get("submittable", True)),
        transformations=(),
        plan_json=p,
    )


def job_ref(
    attempt: AttemptRecord, account: AccountInfo, job_id: str, request_id: str = ""
) -> JobRef:
    return JobRef(
        provider_job_id=job_id,
        account=str(attempt.compile_plan.get("account", account.account_name)),
        model=attempt.provider_model,
        provider_request_id=request_id,
    )


def first_poll_at(deps: ExecutionDeps, now: datetime) -> datetime:
    plan = next_poll_delay(
        deps.config.polling,
        PollPhase.SUBMITTED,
        polls_in_phase=0,
        elapsed_since_submit_s=0.0,
        unit_random=deps.rng.random(),
    )
    return now + timedelta(seconds=plan.delay_s)


async def accept(
    u: UnitOfWork,
    deps: ExecutionDeps,
    attempt: AttemptRecord,
    task: TaskRecord,
    job: JobRef,
    *,
    raw_status: str,
    reason: str,
    after: AfterCommit,
) -> AttemptRecord:
    """Record `job` for the attempt and move attempt/task forward (idempotent).

    A job without an id names nothing (its poll would address the collection): refused."""
    if not job.provider_job_id:
        raise ValueError(f"attempt {attempt.id}: refusing to adopt a job with an empty id")
    # A replay of the recorded job is a no-op; another job for the attempt, or this job id on
    # another attempt, raises DuplicateRecord (9.3.4: a job is never overwritten).
    await u.insert_job(
        NewProviderJob(
            attempt_id=attempt.id,
            provider_account_id=attempt.provider_account_id,
            provider_job_id=job.provider_job_id,
            provider_request_id=job.provider_request_id or None,
            normalized_status=AttemptState.ACCEPTED,
            submitted_at=attempt.request_started_at or u.now,
            raw_status=raw_status or None,
        ),
        task_id=attempt.task_id,  # the attempt's row is the caller's (locked)
    )
    # 9.23.1: the provider has the job, so its expected cost is the platform's (once per attempt).
    account = await deps.account(attempt.provider_account_id, u)
    await record_expected(u, attempt, job.provider_job_id, account)
    runtime = await u.runtime(attempt.id)
    cancel_wanted = runtime is not None and runtime.cancel_requested_at is not None
    if attempt.state in (AttemptState.SUBMITTING, AttemptState.SUBMIT_UNKNOWN):
        was_unknown = attempt.state is AttemptState.SUBMIT_UNKNOWN
        moved = await u.move_attempt(attempt, AttemptState.ACCEPTED, reason)
        if moved is not None:
            attempt = moved
            if was_unknown:
                after.resolve_unknown.append(moved)
        if cancel_wanted and moved is not None:
            attempt = (
                await u.move_attempt(
                    attempt, AttemptState.CANCEL_REQUESTED, "cancel requested before acceptance"
                )
                or attempt
            )
            await u.enqueue(_cancel_message(attempt))
        await u.set_runtime(
            attempt.id,
            attempt.task_id,
            accepted_at=u.now,
            next_poll_at=first_poll_at(deps, u.now),
            poll_phase=PollPhase.SUBMITTED.value,
            polls_in_phase=0,
            unknown_since=None,
            next_recovery_at=None,
        )
    if task.state is TaskState.SUBMITTING:
        await u.move_task(task, TaskState.RUNNING, f"attempt {attempt.attempt_no} accepted")
    return attempt


def _cancel_message(attempt: AttemptRecord) -> NewOutboxMessage:
    return NewOutboxMessage(
        Topic.CANCEL, str(attempt.id), {"task_id": attempt.task_id, "attempt_id": attempt.id}
    )


async def to_unknown(
    u: UnitOfWork,
    deps: ExecutionDeps,
    attempt: AttemptRecord,
    stage: str,
    error: ProviderError | None,
    *,
    after: AfterCommit,
) -> AttemptRecord | None:
    """SUBMITTING -> SUBMIT_UNKNOWN with recovery scheduled; no new attempt, no re-send."""
    failure = Failure(
        ErrorClass.SUBMISSION_UNKNOWN.value,
        error.code if error else "SUBMIT_UNKNOWN",
        error.message if error else "the submit's outcome is unknown",
    )
    moved = await u.move_attempt(
        attempt,
        AttemptState.SUBMIT_UNKNOWN,
        f"submit outcome unknown at {stage or 'UNKNOWN'}",
        AttemptChanges(failure=failure, transport_error_stage=stage or "UNKNOWN"),
    )
    if moved is None:
        return None
    delay = backoff_delay_s(
        0,
        base_s=deps.config.recovery_base_s,
        cap_s=deps.config.recovery_cap_s,
        unit_random=deps.rng.random(),
    )
    await u.set_runtime(
        moved.id,
        moved.task_id,
        unknown_since=u.now,
        recovery_queries=0,
        next_recovery_at=u.now + timedelta(seconds=delay),
        next_poll_at=None,
    )
    after.mark_unknown.append(moved)
    log.info(
        "attempt %s: submit outcome unknown at %s (%s); recovery in %.1fs",
        moved.id,
        stage or "UNKNOWN",
        failure.code,
        delay,
    )
    return moved


async def is_current(u: UnitOfWork, task: TaskRecord, attempt: AttemptRecord) -> bool:
    """Whether the task still waits on this attempt (`observation.task_waits_on`)."""
    # Asked first as if this were the latest attempt: the task row alone may rule it out unread.
    if not task_waits_on(task.state, task.adopted_attempt_id, attempt.id, attempt.id):
        return False
    attempts = await u.attempts_of(task.id)
    latest = attempts[-1].id if attempts else None
    return task_waits_on(task.state, task.adopted_attempt_id, latest, attempt.id)


async def fail_attempt(
    u: UnitOfWork,
    deps: ExecutionDeps,
    attempt: AttemptRecord,
    task: TaskRecord,
    error: ProviderError,
    *,
    stage: FailureStage,
    after: AfterCommit,
) -> FailoverAction | None:
    """Apply a definite failure; returns the action taken (None if only the attempt moved)."""
    attempts = await u.attempts_of(task.id)
    runtime = await u.runtime(attempt.id)
    # The failing attempt counts as ended: its job (if any) was billed for nothing.
    ended = [a if a.id != attempt.id else as_failed(a) for a in attempts]
    decision = decide(
        FailoverInput(
            error=error,
            stage=stage,
            routing_mode=task.spec.routing.mode,
            attempts_so_far=len(attempts),
            provider_switches_so_far=count_switches(
                [(a.provider_account_id, a.provider_model) for a in attempts]
            ),
            same_candidate_retries=runtime.submit_retries if runtime else 0,
            now=u.now,
            deadline_at=task.deadline_at,
            platform_loss_micros=await platform_loss(u, ended),
            next_attempt_cost_micros=attempt.estimated_cost_micros,
        ),
        deps.config.limits,
        unit_random=deps.rng.random(),
    )
    cancel_wanted = runtime is not None and runtime.cancel_requested_at is not None
    retry_ok = attempt.state in (AttemptState.SUBMITTING, AttemptState.SUBMIT_UNKNOWN)
    if decision.action is FailoverAction.RETRY_SAME and retry_ok and not cancel_wanted:
        was_unknown = attempt.state is AttemptState.SUBMIT_UNKNOWN
        moved = await u.move_attempt(
            attempt,
            AttemptState.READY_TO_SUBMIT,
            f"RETRY_SAME after {error.error_class.value} in {decision.retry_delay_s:.1f}s",
        )
        if moved is None:
            return None
        if was_unknown:
            after.resolve_unknown.append(moved)
        log.info(
            "attempt %s: retry on the same candidate in %.1fs after %s (%s)",
            moved.id,
            decision.retry_delay_s,
            error.error_class.value,
            error.code,
        )
        await u.bump_runtime(moved.id, moved.task_id, "submit_retries")
        await u.set_runtime(moved.id, moved.task_id, next_recovery_at=None, unknown_since=None)
        await u.enqueue(
            NewOutboxMessage(
                Topic.SUBMIT,
                str(moved.id),
                # The retry continues this submit's trace (vidroute_core.tracing).
                {"task_id": moved.task_id, "attempt_id": moved.id, **tracing.carrier()},
                available_at=u.now + timedelta(seconds=decision.retry_delay_s),
            )
        )
        return FailoverAction.RETRY_SAME
    failure = Failure(error.error_class.value, error.code, f"{decision.reason}: {error.message}")
    if not ATTEMPT_MACHINE.is_terminal(attempt.state):
        moved = await u.move_attempt(
            attempt, AttemptState.FAILED, decision.reason, AttemptChanges(failure=failure)
        )
        if moved is None:
            return None
        attempt = moved
    after.release.append(attempt)
    await u.set_runtime(attempt.id, attempt.task_id, next_poll_at=None, next_recovery_at=None)
    if not await is_current(u, task, attempt):
        return None
    if cancel_wanted:
        await u.move_task(task, TaskState.CANCELLED, "cancel requested; attempt failed")
        return FailoverAction.FAIL_TASK
    if decision.action is FailoverAction.FAIL_OVER:
        return await requeue(
            u,
            task,
            attempt,
            attempts,
            reason=decision.reason,
            error_class=error.error_class.value,
            same_model_only=decision.same_model_only,
            limits=deps.config.limits,
            unit_random=deps.rng.random(),
        )
    log.info("task %s failed after attempt %s: %s", task.id, attempt.id, decision.reason)
    await u.move_task(task, TaskState.FAILED, decision.reason, failure=failure)
    return FailoverAction.FAIL_TASK


async def requeue(
    u: UnitOfWork,
    task: TaskRecord,
    attempt: AttemptRecord,
    attempts: list[AttemptRecord],
    *,
    reason: str,
    error_class: str,
    same_model_only: bool,
    limits: FailoverLimits,
    unit_random: float = 1.0,
) -> FailoverAction | None:
    """Task -> QUEUED (via SCHEDULING when needed), its failover history stored and a
    ``task.requeue`` wake-up enqueued, all in this transaction: FAIL_OVER.

    Every FAILED attempt's candidate is excluded (except PROVEN_ABSENT: nothing failed there);
    softly after an endpoint-health failure (`exclusion_is_soft`), the failed attempt's own
    candidate then not before `requeue_backoff_s` (`unit_random` is its jitter draw).

    Past the task deadline, or when a new attempt could take the estimated platform loss past
    the limit, the task FAILS instead (FAIL_TASK). None: another writer moved the task first.
    """
    loss = await loss_after(u, attempt, attempts)
    refusal = await requeue_refusal(u, task, attempt, attempts, limits, loss=loss)
    if refusal is not None:
        # As for decide's FAIL_TASK reasons: the failure keeps the attempt's class and code,
        # the message (and the transition) lead with why no new attempt was made.
        code, detail = refusal
        base = attempt.failure or Failure(error_class, reason)
        failure = Failure(base.failure_class, base.code, f"{code}: {detail}; {base.message}")
        log.info("task %s: no new attempt after attempt %s: %s", task.id, attempt.id, code)
        moved = await u.move_task(task, TaskState.FAILED, code, failure=failure)
        return FailoverAction.FAIL_TASK if moved is not None else None
    excluded = _exclusions(
        attempt, attempts, reason, limits=limits, now=u.now, unit_random=unit_random
    )
    request = RequeueRequest(
        task_id=task.id,
        failed_attempt_id=attempt.id,
        reason=reason,
        error_class=error_class,
        excluded_candidates=excluded,
        same_model_only=same_model_only,
        required_model=attempt.provider_model if same_model_only else "",
        platform_loss_micros=loss,
        platform_loss_limit_micros=limits.max_estimated_platform_loss_micros,
    )
    current: TaskRecord | None = task
    if not TASK_MACHINE.can(task.state, TaskState.QUEUED):
        current = await u.move_task(task, TaskState.SCHEDULING, reason)
    if current is None:
        return None
    if await u.move_task(current, TaskState.QUEUED, reason) is None:
        return None
    # The history is rows in this transaction; the message only wakes the dispatcher.
    await u.record_requeue(request)
    await u.enqueue(NewOutboxMessage(Topic.REQUEUE, str(task.id), request.wake_up()))
    log.info(
        "task %s: failover after attempt %s (%s, %s); requeued excluding %d candidates; "
        "estimated platform loss %d of %d micros",
        task.id,
        attempt.id,
        reason,
        error_class,
        len(excluded),
        loss,
        limits.max_estimated_platform_loss_micros,
    )
    return FailoverAction.FAIL_OVER


def _exclusions(
    attempt: AttemptRecord,
    attempts: list[AttemptRecord],
    reason: str,
    *,
    limits: FailoverLimits,
    now: datetime,
    unit_random: float,
) -> tuple[ExcludedCandidate, ...]:
    """What the next routing must avoid: hard wins over soft for the same candidate."""
    ended = {a.id: a for a in attempts}
    # Only a failure of this attempt earns its candidate a backoff: a PROVEN_ABSENT or
    # abandoned attempt failed nowhere (earlier failures keep the instants they were given).
    failed_here = attempt.state is AttemptState.FAILED and reason != PROVEN_ABSENT
    if failed_here:
        ended[attempt.id] = attempt
    # Each candidate's first failure of a kind is its cause (the one that first excluded it).
    hard: dict[tuple[int, str], AttemptRecord] = {}
    soft: dict[tuple[int, str], AttemptRecord] = {}
    for a in ended.values():
        if a.state is not AttemptState.FAILED or (a.failure and a.failure.code == PROVEN_ABSENT):
            continue
        key = (a.provider_account_id, a.provider_model)
        if exclusion_is_soft(a.failure.failure_class if a.failure else None):
            soft.setdefault(key, a)
        else:
            hard.setdefault(key, a)
    mine = (attempt.provider_account_id, attempt.provider_model) if failed_here else None
    if mine in soft:
        soft[mine] = attempt  # its new backoff is this failure's
    retry_at = now + timedelta(
        seconds=requeue_backoff_s(len(attempts), limits, unit_random=unit_random)
    )
    return tuple(
        [_excluded(hard[key]) for key in sorted(hard)]
        + [
            _excluded(soft[key], soft=True, retry_at=retry_at if key == mine else None)
            for key in sorted(soft.keys() - hard.keys())
        ]
    )


def _excluded(
    cause: AttemptRecord, *, soft: bool = False, retry_at: datetime | None = None
) -> ExcludedCandidate:
    """The exclusion of `cause`'s candidate, naming the failed attempt that caused it."""
    return ExcludedCandidate(
        cause.provider_account_id,
        cause.provider_model,
        soft=soft,
        retry_at=retry_at,
        attempt_id=cause.id,
        error_class=cause.failure.failure_class if cause.failure else "",
    )


def outputs_json(job: ProviderJobRecord | None) -> list[dict[str, object]]:
    locator = (job.output_locator if job else None) or {}
    outputs = locator.get("outputs", [])
    return list(outputs) if isinstance(outputs, list) else []

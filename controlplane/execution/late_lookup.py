"""Background lookup of ABANDONED attempts (design 9.17.5): find the job, record it, change nothing.

Recovery gave up on an unknown submit, but the provider may still have created (and be billing)
a job. Every `abandoned_lookup_period_s`, for `abandoned_lookup_for_s` after the abandonment,
the same evidence chain runs without ever sending anything: an early callback stored for the
attempt, ``RecoverSubmission`` (which asks the sidecar's submit journal first), then usage
records. Never the idempotent re-send: for an abandoned task that could create a job.

What it finds is RECORDED, on the runtime row (``late_found_job_id``, ``late_found_method``) and
as a LATE_FOUND evidence event; the attempt stays ABANDONED and the task keeps its outcome (no
late event overwrites an adopted result). A conclusive NOT_FOUND is recorded as the method
``not_found:<method>`` with no job. Either ends the lookup; so does the cap. The money
reconciliation reads these records against billing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from controlplane.domain.states import AttemptState
from controlplane.execution.evidence import EvidenceKind, record_evidence
from controlplane.execution.outcomes import ExecutionDeps, job_ref, plan_of
from controlplane.persistence.records import AttemptRecord
from vidroute_core.adapter import RecoverQuery, RecoverResult, RecoveryVerdict

if TYPE_CHECKING:
    from controlplane.execution.recovery import RecoveryWorker

__all__ = ["LateLookup"]

log = logging.getLogger(__name__)
_WINDOW_SLACK = timedelta(minutes=5)


class LateLookup:
    """Runs the background lookups; `found` counts jobs found late."""

    def __init__(self, deps: ExecutionDeps, recovery: RecoveryWorker) -> None:
        self._deps = deps
        self._recovery = recovery
        self.found = 0

    def first_at(self, now: datetime) -> datetime | None:
        """When the first lookup of an attempt abandoned `now` is due (None: lookups are off)."""
        cfg = self._deps.config
        if cfg.abandoned_lookup_for_s <= 0:
            return None
        return now + timedelta(seconds=cfg.abandoned_lookup_period_s)

    async def step(self, attempt_id: int) -> RecoveryVerdict | None:
        """One lookup; the verdict reached, None when the lookup is over or not due."""
        snap = await self._deps.reads.snapshot(attempt_id)
        if snap is None or snap[0].state is not AttemptState.ABANDONED:
            return None
        attempt, job, runtime = snap
        cfg = self._deps.config
        now = self._deps.clock()
        over = (now - attempt.updated_at).total_seconds() > cfg.abandoned_lookup_for_s
        if job is not None or (runtime and runtime.late_found_method) or over:
            await self._stop(attempt)  # a held job (lost, not unknown) needs no lookup
            return None
        result = await self._lookup(attempt, runtime.unknown_since if runtime else None)
        if result.verdict is RecoveryVerdict.FOUND and result.job and result.job.provider_job_id:
            await self._record(attempt, result.job.provider_job_id, result.method or "recover")
            return RecoveryVerdict.FOUND
        if result.verdict is RecoveryVerdict.NOT_FOUND:
            await self._record(attempt, None, f"not_found:{result.method or 'recover'}")
            return RecoveryVerdict.NOT_FOUND
        async with self._deps.db.unit(now) as u:
            due = now + timedelta(seconds=cfg.abandoned_lookup_period_s)
            await u.set_runtime(attempt.id, attempt.task_id, next_recovery_at=due)
        return RecoveryVerdict.INCONCLUSIVE

    async def _lookup(
        self, attempt: AttemptRecord, unknown_since: datetime | None
    ) -> RecoverResult:
        account = await self._deps.account(attempt.provider_account_id)
        for event in reversed(await self._deps.reads.events(attempt_id=attempt.id)):
            if event.outcome == "UNMATCHED" and event.provider_job_id:
                ref = job_ref(attempt, account, event.provider_job_id)
                return RecoverResult(RecoveryVerdict.FOUND, job=ref, method="early_callback")
        started = attempt.request_started_at or unknown_since or attempt.created_at
        try:
            result = await self._deps.adapter(account).recover(
                RecoverQuery(
                    account=str(attempt.compile_plan.get("account", account.account_name)),
                    model=attempt.provider_model,
                    client_request_key=attempt.client_request_key,
                    request_hash=attempt.request_hash or "",
                    plan=plan_of(attempt, account),
                    submitted_after=started - _WINDOW_SLACK,
                    submitted_before=unknown_since or attempt.updated_at,
                    request_started_at=attempt.request_started_at,
                )
            )
        except Exception as exc:
            log.info("attempt %s: late recover raised %r", attempt.id, exc)
            result = RecoverResult(RecoveryVerdict.INCONCLUSIVE, method="recover_error")
        if result.verdict is RecoveryVerdict.INCONCLUSIVE:
            by_usage = await self._recovery.usage_lookup(attempt, account, started)
            if by_usage is not None:
                return by_usage
        return result

    async def _record(self, attempt: AttemptRecord, job_id: str | None, method: str) -> None:
        async with self._deps.db.unit(self._deps.clock()) as u:
            current = await u.attempt(attempt.id, lock=True)
            if current is None or current.state is not AttemptState.ABANDONED:
                return
            await u.set_runtime(
                attempt.id,
                attempt.task_id,
                late_found_job_id=job_id,
                late_found_method=method,
                next_recovery_at=None,
            )
            if job_id:
                await record_evidence(
                    u, current, EvidenceKind.LATE_FOUND, {"method": method}, job_id=job_id
                )
        if job_id:
            self.found += 1
            log.warning(
                "abandoned attempt %s: its job %s exists at the provider (by %s); recorded "
                "for reconciliation, the task keeps its outcome",
                attempt.id,
                job_id,
                method,
            )

    async def _stop(self, attempt: AttemptRecord) -> None:
        async with self._deps.db.unit(self._deps.clock()) as u:
            await u.set_runtime(attempt.id, attempt.task_id, next_recovery_at=None)

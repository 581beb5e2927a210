"""Recovery never adopts what it cannot name: usage records adopt only a job of THIS attempt."""

from __future__ import annotations

from controlplane.domain.states import AttemptState
from controlplane.execution.evidence import EvidenceKind, is_evidence
from tests.integration.execution.exec_harness import ACCOUNT, Harness
from vidroute_core.adapter import (
    JobRef,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
    UsageRecord,
)
from vidroute_core.errors import ErrorClass, make_error


def _unknown() -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.UNKNOWN,
        error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "read timeout"),
        transport_stage=TransportStage.AWAIT_RESPONSE,
    )


def _usage(lite: Harness, job_id: str, key: str = "", milliunits: int = 1000) -> UsageRecord:
    return UsageRecord(
        job_id,
        "gen4.5",
        lite.clock.now,
        milliunits,
        "credits",
        milliunits * 10,
        "USD",
        "{}",
        client_request_key=key,
    )


async def _recover_steps(lite: Harness, steps: int = 3) -> None:
    engine = lite.engine(usage_lookup_after_queries=1)
    await engine.run_until_idle()
    for _ in range(steps):
        lite.clock.advance(200)
        await engine.run_until_idle()


async def _evidence_kinds(lite: Harness, attempt_id: int) -> set[str]:
    return {e.raw_status for e in await lite.reads.events(attempt_id=attempt_id) if is_evidence(e)}


async def test_daily_aggregate_is_evidence_not_a_job(lite: Harness) -> None:
    """Runway-like daily totals (no job id) never adopt a job: the attempt stays unknown and the
    aggregate is kept as evidence for reconciliation."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    lite.fake.usage.append(_usage(lite, "", milliunits=12_000))
    await _recover_steps(lite)
    detail = await lite.detail(attempt.task_id)
    assert not detail.provider_jobs
    assert detail.attempts[0].state is AttemptState.SUBMIT_UNKNOWN
    assert lite.fake.get_job_calls == []
    assert EvidenceKind.USAGE_AGGREGATE.value in await _evidence_kinds(lite, attempt.id)


async def test_a_job_without_our_identity_is_not_adopted(lite: Harness) -> None:
    """A single usage job that names no request identity of this attempt is not adopted, even
    when it is the only unknown job of the account."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    lite.fake.usage.append(_usage(lite, "job-stranger"))
    await _recover_steps(lite)
    detail = await lite.detail(attempt.task_id)
    assert not detail.provider_jobs
    assert EvidenceKind.USAGE_UNIDENTIFIED.value in await _evidence_kinds(lite, attempt.id)


async def test_two_jobs_claiming_our_key_are_ambiguous(lite: Harness) -> None:
    """Two usage jobs carrying this attempt's key cannot both be ours: no adoption, evidence."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    key = attempt.client_request_key
    lite.fake.usage.extend([_usage(lite, "job-a", key), _usage(lite, "job-b", key)])
    await _recover_steps(lite)
    detail = await lite.detail(attempt.task_id)
    assert not detail.provider_jobs
    assert EvidenceKind.USAGE_AMBIGUOUS.value in await _evidence_kinds(lite, attempt.id)


async def test_a_found_with_an_empty_job_id_is_inconclusive(lite: Harness) -> None:
    """An adapter claiming FOUND without a job id adopts nothing and nothing is polled."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    lite.fake.script_recover(
        RecoverResult(RecoveryVerdict.FOUND, job=JobRef("", ACCOUNT), method="usage")
    )
    engine = lite.engine(usage_lookup_after_queries=99)
    await engine.run_until_idle()
    lite.clock.advance(200)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert not detail.provider_jobs
    assert detail.attempts[0].state is AttemptState.SUBMIT_UNKNOWN
    assert lite.fake.get_job_calls == []

"""A poll NOT_FOUND of a held job is never "cancelled by the provider", and ABANDONED attempts get
a background lookup whose result is recorded, never applied."""

from __future__ import annotations

from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.evidence import EvidenceKind, is_evidence
from tests.integration.execution.exec_harness import ACCOUNT, Harness
from vidroute_core.adapter import (
    JobRef,
    JobSnapshot,
    JobState,
    PollResult,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
)
from vidroute_core.errors import ErrorClass, make_error


def _not_found() -> PollResult:
    return PollResult(
        None,
        make_error(ErrorClass.INTERNAL_RETRYABLE, "JOB_NOT_FOUND", "HTTP 404", raw_status_code=404),
    )


def _running() -> JobSnapshot:
    return JobSnapshot(JobState.RUNNING, "RUNNING", '{"status":"RUNNING"}')


def _unknown() -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.UNKNOWN,
        error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "read timeout"),
        transport_stage=TransportStage.AWAIT_RESPONSE,
    )


async def test_not_found_keeps_the_attempt_then_abandons_without_failover(lite: Harness) -> None:
    """NOT_FOUND polls keep the attempt (no CANCELLED, no new attempt) until
    job_not_found_abandon_after_s has passed; then the attempt is ABANDONED and the task FAILED
    by the abandon policy, never failed over."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-lost"))
    lite.fake.set_job("job-lost", _not_found())
    engine = lite.engine(job_not_found_abandon_after_s=600)
    await engine.run_until_idle()
    for _ in range(3):
        lite.clock.advance(60)
        await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.attempts[0].state is AttemptState.ACCEPTED
    assert detail.task.state is TaskState.RUNNING
    polls_before = len(lite.fake.get_job_calls)
    assert polls_before >= 2
    for _ in range(30):
        lite.clock.advance(60)
        await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ABANDONED]
    assert detail.task.state is TaskState.FAILED
    assert len(lite.fake.submit_calls) == 1
    assert await lite.messages(Topic.REQUEUE) == []
    kinds = [e.raw_status for e in await lite.reads.events(attempt_id=attempt.id) if is_evidence(e)]
    assert kinds == [EvidenceKind.JOB_NOT_FOUND.value]


async def test_a_real_status_ends_the_not_found_streak(lite: Harness) -> None:
    """A job that reads NOT_FOUND and then RUNNING again is not abandoned when the first streak
    would have run out."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-blip"))
    lite.fake.set_job("job-blip", _not_found(), PollResult(_running()))
    engine = lite.engine(job_not_found_abandon_after_s=300)
    await engine.run_until_idle()
    for _ in range(20):
        lite.clock.advance(60)
        await engine.run_until_idle()
    runtime = await lite.reads.runtime(attempt.id)
    assert (await lite.attempt(attempt.id)).state is AttemptState.RUNNING
    assert runtime is not None
    assert runtime.job_not_found_since is None


async def test_not_found_after_our_cancel_is_the_cancel_confirmed(lite: Harness) -> None:
    """A job we asked to cancel that then reads NOT_FOUND (Runway deletes on DELETE) is
    CANCELLED and so is the task."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-del"))
    lite.fake.set_job("job-del", PollResult(_running()), _not_found())
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(5)
    await engine.run_until_idle()
    assert (await lite.attempt(attempt.id)).state is AttemptState.RUNNING
    await engine.cancel_service.cancel(attempt.task_id)
    await engine.canceller.run_once()
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.attempts[0].state is AttemptState.CANCELLED
    assert detail.task.state is TaskState.CANCELLED


async def test_abandoned_attempt_lookup_records_the_late_job(lite: Harness) -> None:
    """After recovery gave up, the background lookup finds the job through RecoverSubmission and
    records it (runtime + LATE_FOUND evidence) without reviving the task or adopting the job."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    engine = lite.engine(
        max_recovery_queries=1,
        usage_lookup_after_queries=99,
        abandoned_lookup_period_s=60,
        abandoned_lookup_for_s=3600,
    )
    await engine.run_until_idle()
    for _ in range(3):
        lite.clock.advance(130)
        await engine.run_until_idle()
    assert (await lite.attempt(attempt.id)).state is AttemptState.ABANDONED
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.FAILED
    lite.fake.script_recover(
        RecoverResult(
            RecoveryVerdict.FOUND, job=JobRef("job-late", ACCOUNT), method="submit_journal"
        )
    )
    for _ in range(3):
        lite.clock.advance(61)
        await engine.run_until_idle()
    runtime = await lite.reads.runtime(attempt.id)
    assert runtime is not None
    assert (runtime.late_found_job_id, runtime.late_found_method) == ("job-late", "submit_journal")
    detail = await lite.detail(attempt.task_id)
    assert detail.attempts[0].state is AttemptState.ABANDONED
    assert detail.task.state is TaskState.FAILED
    assert not detail.provider_jobs
    assert len(lite.fake.submit_calls) == 1
    calls = len(lite.fake.recover_calls)
    lite.clock.advance(600)
    await engine.run_until_idle()
    assert len(lite.fake.recover_calls) == calls  # found once: the lookup is over
    kinds = [e.raw_status for e in await lite.reads.events(attempt_id=attempt.id) if is_evidence(e)]
    assert kinds == [EvidenceKind.LATE_FOUND.value]


async def test_abandoned_lookup_stops_at_its_cap(lite: Harness) -> None:
    """An inconclusive background lookup repeats each period and ends at abandoned_lookup_for_s."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    engine = lite.engine(
        max_recovery_queries=1,
        usage_lookup_after_queries=99,
        abandoned_lookup_period_s=60,
        abandoned_lookup_for_s=300,
    )
    await engine.run_until_idle()
    for _ in range(3):
        lite.clock.advance(130)
        await engine.run_until_idle()
    assert (await lite.attempt(attempt.id)).state is AttemptState.ABANDONED
    start = len(lite.fake.recover_calls)
    for _ in range(20):
        lite.clock.advance(61)
        await engine.run_until_idle()
    late_calls = len(lite.fake.recover_calls) - start
    assert 2 <= late_calls <= 6
    runtime = await lite.reads.runtime(attempt.id)
    assert runtime is not None
    assert runtime.next_recovery_at is None

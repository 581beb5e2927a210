"""Past the task deadline no new attempt starts, on any path; a running job is left to finish."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import (
    JobOutput,
    JobSnapshot,
    JobState,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
)
from vidroute_core.errors import ErrorClass, make_error


def unknown() -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.UNKNOWN,
        error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "no answer"),
        transport_stage=TransportStage.AWAIT_RESPONSE,
    )


async def test_recovery_proving_absence_after_the_deadline_does_not_requeue(lite: Harness) -> None:
    """A submit proven absent after the task deadline fails the task; nothing is resubmitted."""
    attempt = await lite.task_with_attempt(deadline_at=lite.clock.now + timedelta(seconds=30))
    lite.fake.script_submit(unknown())
    lite.fake.script_recover(RecoverResult(RecoveryVerdict.NOT_FOUND, method="task_search"))
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(60)
    await engine.run_until_idle()

    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.FAILED
    assert [a.state for a in detail.attempts] == [AttemptState.FAILED]
    assert await lite.messages(Topic.REQUEUE) == []
    assert len(lite.fake.submit_calls) == 1


async def test_a_job_failing_after_the_deadline_is_not_failed_over(lite: Harness) -> None:
    """A failover-able job failure observed past the deadline ends the task, not a new attempt."""
    attempt = await lite.task_with_attempt(deadline_at=lite.clock.now + timedelta(seconds=30))
    lite.fake.script_submit(lite.fake.accepted("job-late"))
    error = make_error(ErrorClass.INTERNAL_PERMANENT, "GENERATION_FAILED", "model crashed")
    lite.fake.set_job("job-late", JobSnapshot(JobState.FAILED, "FAILED", failure=error))
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(60)
    await engine.run_until_idle()

    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.message.startswith("TASK_DEADLINE_EXCEEDED")
    assert await lite.messages(Topic.REQUEUE) == []


async def test_a_job_running_across_the_deadline_is_left_to_finish_and_delivered(
    lite: Harness,
) -> None:
    """The deadline stops new attempts only: a job already running still delivers its video."""
    attempt = await lite.task_with_attempt(deadline_at=lite.clock.now + timedelta(seconds=30))
    lite.fake.script_submit(lite.fake.accepted("job-slow"))
    output = JobOutput(
        "https://cdn.example/out.mp4", "video/mp4", datetime(2026, 6, 26, tzinfo=UTC)
    )
    lite.fake.set_job(
        "job-slow",
        JobSnapshot(JobState.RUNNING, "RUNNING"),
        JobSnapshot(JobState.SUCCEEDED, "SUCCEEDED", outputs=(output,)),
    )
    engine = lite.engine()
    await engine.run_until_idle()
    for _ in range(3):
        lite.clock.advance(60)
        await engine.run_until_idle()

    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.SUCCEEDED
    assert lite.fake.cancel_calls == []

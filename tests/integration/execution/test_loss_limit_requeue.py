"""max_estimated_platform_loss (9.16.4): a new attempt that could push a task's platform loss past
the limit is refused, and the task FAILS with that reason instead of being requeued.

Every attempt of the harness is estimated at 250 000 micros. A job accepted and then failed
(or an ABANDONED submit) may have been billed for nothing: that is the loss. A new attempt may
end the same way, so a failover is allowed only while loss + 250 000 stays within the limit.
"""

from __future__ import annotations

from controlplane.domain.failover import FailoverLimits
from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import JobSnapshot, JobState, SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass, make_error

COST = 250_000


def limits(max_loss: int) -> FailoverLimits:
    return FailoverLimits(max_estimated_platform_loss_micros=max_loss)


def failed_job(actual_cost_micros: int | None = None) -> JobSnapshot:
    error = make_error(ErrorClass.INTERNAL_PERMANENT, "GENERATION_FAILED", "model crashed")
    return JobSnapshot(
        JobState.FAILED, "FAILED", failure=error, actual_cost_micros=actual_cost_micros
    )


async def run_accepted_then_failed(
    lite: Harness, max_loss: int, actual_cost_micros: int | None = None
) -> int:
    """Submit accepted, first poll FAILED; returns the task id."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-lost"))
    lite.fake.set_job("job-lost", failed_job(actual_cost_micros))
    engine = lite.engine(limits=limits(max_loss))
    await engine.run_until_idle()
    lite.clock.advance(30)
    await engine.run_until_idle()
    assert (await lite.attempt(attempt.id)).state is AttemptState.FAILED
    return attempt.task_id


async def test_an_accepted_then_failed_job_over_the_limit_fails_the_task(lite: Harness) -> None:
    """Loss 250 000 plus a new attempt's 250 000 exceeds 400 000: FAILED, nothing requeued."""
    task_id = await run_accepted_then_failed(lite, max_loss=400_000)
    detail = await lite.detail(task_id)
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.code == "GENERATION_FAILED"  # the provider's failure, kept
    assert detail.task.failure.message.startswith("MAX_ESTIMATED_PLATFORM_LOSS")
    assert await lite.messages(Topic.REQUEUE) == []
    assert len(lite.fake.submit_calls) == 1


async def test_within_the_limit_the_task_fails_over(lite: Harness) -> None:
    """At a limit of 500 000 the same failure fails over: QUEUED with one requeue message."""
    task_id = await run_accepted_then_failed(lite, max_loss=500_000)
    assert (await lite.detail(task_id)).task.state is TaskState.QUEUED
    assert len(await lite.messages(Topic.REQUEUE)) == 1


async def test_the_failover_records_its_loss_figure_and_limit(lite: Harness) -> None:
    """The requeue row keeps the estimated loss it was allowed at and the limit in force."""
    task_id = await run_accepted_then_failed(lite, max_loss=500_000)
    [row] = await lite.requeues(task_id)
    assert (row.platform_loss_micros, row.platform_loss_limit_micros) == (COST, 500_000)


async def test_a_provider_reported_cost_replaces_the_estimate(lite: Harness) -> None:
    """A failed job the provider says cost 0 is no loss, so even a 400 000 limit fails over."""
    task_id = await run_accepted_then_failed(lite, max_loss=400_000, actual_cost_micros=0)
    assert (await lite.detail(task_id)).task.state is TaskState.QUEUED


async def test_a_rejected_submit_costs_nothing(lite: Harness) -> None:
    """A submit the provider refused created no job: no loss, so a 300 000 limit fails over."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(
        SubmitOutcome(
            SubmitKind.REJECTED,
            error=make_error(ErrorClass.UNSUPPORTED_CAPABILITY, "NO_MODEL", "no such model"),
        )
    )
    await lite.engine(limits=limits(300_000)).run_until_idle()
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.QUEUED


async def test_an_abandoned_submit_counts_as_loss_on_the_recovery_path(lite: Harness) -> None:
    """Recovery's new attempt after ABANDONED is refused too when it could exceed the limit."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(
        SubmitOutcome(
            SubmitKind.UNKNOWN,
            error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "no answer"),
            transport_stage=TransportStage.AWAIT_RESPONSE,
        )
    )
    engine = lite.engine(
        allow_new_attempt_after_abandon=True,
        unknown_recovery_deadline_s=60,
        usage_lookup_after_queries=99,
        limits=limits(400_000),
    )
    await engine.run_until_idle()
    lite.clock.advance(3600)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ABANDONED]
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.message.startswith("MAX_ESTIMATED_PLATFORM_LOSS")
    assert await lite.messages(Topic.REQUEUE) == []

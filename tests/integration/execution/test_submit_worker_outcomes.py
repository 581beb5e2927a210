"""The submit boundaries of design 9.25.3 at the engine level: ACCEPTED, REJECTED(class),
UNKNOWN.
"""

from __future__ import annotations

import pytest

from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import CallFailure, JobRef, SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass, make_error
from vidroute_core.spec import RoutingMode


def _rejected(
    error_class: ErrorClass, code: str = "E", retry_after_ms: int | None = None
) -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.REJECTED,
        error=make_error(error_class, code, "refused", retry_after_ms=retry_after_ms),
    )


def _unknown(stage: str) -> SubmitOutcome:
    """UNKNOWN at a provider transport stage, or at a failed call to the adapter itself."""
    failed_call = CallFailure[stage] if stage in CallFailure.__members__ else None
    return SubmitOutcome(
        SubmitKind.UNKNOWN,
        error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "no answer"),
        transport_stage=TransportStage.NONE if failed_call else TransportStage[stage],
        call_failure=failed_call,
    )


async def test_accepted_records_job_and_runs_task(harness: Harness) -> None:
    """ACCEPTED records the provider job once, moves the attempt to ACCEPTED and the task to
    RUNNING.
    """
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(harness.fake.accepted("job-a"))
    await harness.engine().run_until_idle()

    detail = await harness.detail(attempt.task_id)
    assert detail.task.state is TaskState.RUNNING
    assert [a.state for a in detail.attempts] == [AttemptState.ACCEPTED]
    assert [j.provider_job_id for j in detail.provider_jobs] == ["job-a"]
    assert detail.attempts[0].request_started_at is not None
    assert [c.client_request_key for c in harness.fake.submit_calls] == [attempt.client_request_key]


@pytest.mark.parametrize(
    "stage", ["SEND_REQUEST", "AWAIT_RESPONSE", "READ_RESPONSE", "ADAPTER_RPC"]
)
async def test_unknown_never_resubmits_nor_creates_attempt(lite: Harness, stage: str) -> None:
    """An UNKNOWN outcome at any stage parks the attempt in SUBMIT_UNKNOWN: one submit, one
    attempt.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown(stage))
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(5)
    await engine.run_until_idle()

    detail = await lite.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.SUBMIT_UNKNOWN]
    assert detail.attempts[0].transport_error_stage == stage
    assert detail.task.state is TaskState.SUBMITTING
    assert len(lite.fake.submit_calls) == 1
    assert len(lite.fake.recover_calls) >= 1  # recovery, not a re-send
    assert await lite.used(attempt.provider_account_id) == (1, 1)  # slot kept, counted unknown


async def test_adapter_exception_is_unknown(lite: Harness) -> None:
    """An exception from the submit call itself is treated as UNKNOWN, never as a rejection."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(ConnectionResetError("reset after write"))
    await lite.engine().run_until_idle()
    current = await lite.attempt(attempt.id)
    assert current.state is AttemptState.SUBMIT_UNKNOWN
    assert current.transport_error_stage == "CLIENT_EXCEPTION"


async def test_accepted_without_job_id_is_unknown(lite: Harness) -> None:
    """A 2xx whose job id could not be read (9.17.3) is UNKNOWN, not ACCEPTED."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(
        SubmitOutcome(SubmitKind.ACCEPTED, job=None, transport_stage=TransportStage.READ_RESPONSE)
    )
    await lite.engine().run_until_idle()
    assert (await lite.attempt(attempt.id)).state is AttemptState.SUBMIT_UNKNOWN


async def test_rate_limited_retries_same_candidate_with_same_key(harness: Harness) -> None:
    """RATE_LIMITED goes back to READY_TO_SUBMIT with a delayed message and re-sends the same
    key.
    """
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(_rejected(ErrorClass.RATE_LIMITED, retry_after_ms=3000))
    engine = harness.engine()
    await engine.run_until_idle()
    assert (await harness.attempt(attempt.id)).state is AttemptState.READY_TO_SUBMIT
    assert len(harness.fake.submit_calls) == 1  # the retry is not due yet

    harness.clock.advance(61)
    await engine.run_until_idle()
    detail = await harness.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ACCEPTED]
    keys = {c.client_request_key for c in harness.fake.submit_calls}
    assert len(harness.fake.submit_calls) == 2
    assert keys == {attempt.client_request_key}


async def test_retries_exhausted_fail_over_to_scheduler(lite: Harness) -> None:
    """After the bounded same-candidate retries an overload fails the attempt and requeues the
    task, excluding the candidate softly (endpoint health) with a retry instant after now.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(*[_rejected(ErrorClass.PROVIDER_OVERLOADED)] * 4)
    engine = lite.engine()
    for _ in range(5):
        await engine.run_until_idle()
        lite.clock.advance(120)

    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.QUEUED
    assert [a.state for a in detail.attempts] == [AttemptState.FAILED]
    assert len(lite.fake.submit_calls) == 4
    assert len(await lite.messages(Topic.REQUEUE)) == 1
    [requeue] = await lite.requeues(attempt.task_id)
    assert requeue.reason == "FAIL_OVER"
    excluded_candidates = await lite.excluded(attempt.task_id)
    assert [(c.provider_account_id, c.provider_model) for c in excluded_candidates] == [
        (attempt.provider_account_id, "gen4.5")
    ]
    [excluded] = excluded_candidates
    assert excluded.attempt_id == attempt.id
    assert excluded.soft
    assert excluded.retry_at is not None
    assert excluded.retry_at > detail.task.updated_at  # the instant the task was requeued
    assert await lite.used(attempt.provider_account_id) == (0, 0)


async def test_safety_input_fails_task_without_failover(harness: Harness) -> None:
    """SAFETY_INPUT ends the task FAILED with the safety error and never requeues it (9.9.2)."""
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(_rejected(ErrorClass.SAFETY_INPUT, "MODERATION"))
    await harness.engine().run_until_idle()

    detail = await harness.detail(attempt.task_id)
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.failure_class == "SAFETY_INPUT"
    assert await harness.messages(Topic.REQUEUE) == []
    assert len(harness.fake.submit_calls) == 1


async def test_strict_model_failover_keeps_the_model(lite: Harness) -> None:
    """Under STRICT_MODEL a failover request pins the model: the scheduler may only change
    account.
    """
    attempt = await lite.task_with_attempt(mode=RoutingMode.STRICT_MODEL)
    lite.fake.script_submit(_rejected(ErrorClass.UNSUPPORTED_CAPABILITY))
    await lite.engine().run_until_idle()

    assert len(await lite.messages(Topic.REQUEUE)) == 1
    [requeue] = await lite.requeues(attempt.task_id)
    assert requeue.required_model == attempt.provider_model  # same model only
    # The candidate said it cannot do this: a hard exclusion, never offered again.
    excluded = await lite.excluded(attempt.task_id)
    assert [(c.soft, c.error_class) for c in excluded] == [(False, "UNSUPPORTED_CAPABILITY")]
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.QUEUED


async def test_invalid_input_fails_task(lite: Harness) -> None:
    """INVALID_INPUT neither retries nor fails over: the task FAILS with the error class."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_rejected(ErrorClass.INVALID_INPUT, "BAD_RATIO"))
    await lite.engine().run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.code == "BAD_RATIO"


async def test_duplicate_submit_message_is_a_noop(lite: Harness) -> None:
    """A second attempt.submit message for an attempt already submitted sends nothing."""
    attempt = await lite.task_with_attempt()
    engine = lite.engine()
    await engine.run_until_idle()
    async with lite.db.unit(lite.clock()) as u:
        await u.enqueue(
            __import__(
                "controlplane.persistence.records", fromlist=["NewOutboxMessage"]
            ).NewOutboxMessage(
                Topic.SUBMIT,
                str(attempt.id),
                {"task_id": attempt.task_id, "attempt_id": attempt.id},
            )
        )
    await engine.run_until_idle()
    assert len(lite.fake.submit_calls) == 1
    assert (await lite.attempt(attempt.id)).state is AttemptState.ACCEPTED


async def test_task_deadline_passed_fails_instead_of_failover(lite: Harness) -> None:
    """A failover-able rejection after the task deadline fails the task (9.16.4 task_deadline)."""
    attempt = await lite.task_with_attempt(deadline_at=lite.clock.now)
    lite.fake.script_submit(_rejected(ErrorClass.AUTH))
    await lite.engine().run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None


_ = JobRef  # re-exported type used by sibling modules' scripts

"""Cancellation (9.18.3), polling to completion (9.18.2) and delivery of the output (9.22)."""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.output_fetch import InvalidReason, OutputExpired, OutputInvalid
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import (
    CancelResult,
    JobOutput,
    JobSnapshot,
    JobState,
    PollResult,
    TransportStage,
)


def snap(state: JobState, **kw: object) -> JobSnapshot:
    return JobSnapshot(state, state.value, f'{{"status":"{state.value}","kw":"{kw}"}}', **kw)  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them


def done(url: str = "https://cdn.example/out.mp4") -> JobSnapshot:
    output = JobOutput(url, "video/mp4", datetime(2026, 6, 26, tzinfo=UTC))
    return snap(JobState.SUCCEEDED, outputs=(output,), actual_cost_micros=240_000)


async def test_cancel_before_submit_cancels_without_provider_call(harness: Harness) -> None:
    """Cancelling a task whose attempt was not sent cancels both and releases the lease."""
    attempt = await harness.task_with_attempt()
    engine = harness.engine()
    outcome = await engine.cancel_service.cancel(attempt.task_id)
    assert outcome.requested is False
    assert outcome.task.state is TaskState.CANCELLED
    await engine.run_until_idle()
    assert harness.fake.submit_calls == []
    assert (await harness.attempt(attempt.id)).state is AttemptState.CANCELLED
    assert await harness.used(attempt.provider_account_id) == (0, 0)


async def test_cancel_running_job_waits_for_provider_confirmation(harness: Harness) -> None:
    """A running job goes CANCEL_REQUESTED; only the provider's CANCELLED status cancels the
    task.
    """
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(harness.fake.accepted("job-c"))
    harness.fake.set_job("job-c", snap(JobState.RUNNING), snap(JobState.CANCELLED))
    harness.fake.script_cancel(CancelResult(acknowledged=True))
    engine = harness.engine()
    await engine.run_until_idle()
    harness.clock.advance(5)
    await engine.run_until_idle()  # polled: RUNNING
    assert (await harness.attempt(attempt.id)).state is AttemptState.RUNNING

    outcome = await engine.cancel_service.cancel(attempt.task_id)
    assert outcome.requested is True
    assert (await harness.attempt(attempt.id)).state is AttemptState.CANCEL_REQUESTED
    await engine.canceller.run_once()  # acknowledged, not yet a fact
    assert (await harness.detail(attempt.task_id)).task.state is TaskState.RUNNING
    await engine.run_until_idle()  # the prompt poll sees CANCELLED
    detail = await harness.detail(attempt.task_id)
    assert detail.task.state is TaskState.CANCELLED
    assert detail.attempts[0].state is AttemptState.CANCELLED
    assert [j.provider_job_id for j in harness.fake.cancel_calls] == ["job-c"]
    assert await harness.used(attempt.provider_account_id) == (0, 0)


async def test_success_racing_cancel_keeps_provider_truth_and_delivers(lite: Harness) -> None:
    """If the provider succeeded before confirming the cancel, SUCCEEDED stands and the output is
    delivered.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-r"))
    lite.fake.script_cancel(CancelResult(acknowledged=False, snapshot=done()))
    engine = lite.engine()
    await engine.run_until_idle()
    await engine.cancel_service.cancel(attempt.task_id)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.attempts[0].state is AttemptState.SUCCEEDED
    assert detail.task.state is TaskState.SUCCEEDED
    assert detail.task.output_asset is not None


async def test_success_racing_cancel_discarded_by_policy(lite: Harness) -> None:
    """With deliver_if_succeeded_during_cancel=False the attempt stays SUCCEEDED and the task is
    CANCELLED.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-d"))
    lite.fake.script_cancel(CancelResult(acknowledged=False, snapshot=done()))
    engine = lite.engine(deliver_if_succeeded_during_cancel=False)
    await engine.run_until_idle()
    await engine.cancel_service.cancel(attempt.task_id)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.attempts[0].state is AttemptState.SUCCEEDED
    assert detail.task.state is TaskState.CANCELLED
    assert lite.fetch.calls == []


async def test_cancel_during_unknown_submit_cancels_when_proven_absent(lite: Harness) -> None:
    """A cancel while the submit is unknown is remembered; a proven-absent job then cancels the
    task.
    """
    from vidroute_core.adapter import RecoverResult, RecoveryVerdict, SubmitKind, SubmitOutcome
    from vidroute_core.errors import ErrorClass, make_error

    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(
        SubmitOutcome(
            SubmitKind.UNKNOWN,
            error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "T", "t"),
            transport_stage=TransportStage.AWAIT_RESPONSE,
        )
    )
    lite.fake.script_recover(RecoverResult(RecoveryVerdict.NOT_FOUND))
    engine = lite.engine()
    await engine.run_until_idle()
    outcome = await engine.cancel_service.cancel(attempt.task_id)
    assert outcome.requested is True
    lite.clock.advance(10)
    await engine.run_until_idle()
    assert (await lite.detail(attempt.task_id)).task.state is TaskState.CANCELLED


async def test_polling_drives_job_to_delivery(harness: Harness) -> None:
    """Polls walk QUEUED -> RUNNING -> SUCCEEDED, the output is stored, the task SUCCEEDS, the lease
    is freed.
    """
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(harness.fake.accepted("job-p"))
    harness.fake.set_job("job-p", snap(JobState.QUEUED), snap(JobState.RUNNING), done())
    engine = harness.engine()
    await engine.run_until_idle()
    for _ in range(4):
        harness.clock.advance(90)
        await engine.run_until_idle()

    detail = await harness.detail(attempt.task_id)
    assert detail.task.state is TaskState.SUCCEEDED
    assert detail.task.output_asset is not None
    assert detail.task.output_asset["key"] == f"outputs/{attempt.task_id}/{attempt.id}/output.mp4"
    assert detail.attempts[0].actual_cost_micros == 240_000
    assert len(harness.fake.get_job_calls) == 3
    assert await harness.used(attempt.provider_account_id) == (0, 0)
    assert harness.fetch.calls[0].source_uri == "https://cdn.example/out.mp4"


async def test_expired_output_is_refreshed_not_regenerated(lite: Harness) -> None:
    """An expired locator re-queries the job for a fresh URL and fetches again; nothing is
    resubmitted.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-e"))
    lite.fake.set_job(
        "job-e", done("https://cdn.example/old.mp4"), done("https://cdn.example/fresh.mp4")
    )
    lite.fetch.results = [OutputExpired("403 signature expired")]
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(10)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.SUCCEEDED
    assert [c.source_uri for c in lite.fetch.calls] == [
        "https://cdn.example/old.mp4",
        "https://cdn.example/fresh.mp4",
    ]
    assert len(lite.fake.submit_calls) == 1


async def test_a_sidecar_away_during_an_output_refresh_uses_no_refresh(lite: Harness) -> None:
    """An expired locator whose refresh finds the sidecar away (get_job raises, more times than
    refreshes are allowed) does not fail the task: each unanswered refresh is asked again later
    and uses none; once the sidecar answers, the fresh URL is fetched (issue 20)."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-a"))
    unanswered = lite.config.max_output_refreshes + 2
    lite.fake.set_job(
        "job-a",
        done("https://cdn.example/old.mp4"),
        *[ConnectionError("sidecar restarting")] * unanswered,
        done("https://cdn.example/fresh.mp4"),
    )
    # The old URL stays expired: fetched once, then again after each unanswered refresh.
    lite.fetch.results = [OutputExpired("403 signature expired")] * (unanswered + 1)
    engine = lite.engine()
    await engine.run_until_idle()
    for _ in range(unanswered + 2):
        lite.clock.advance(lite.config.breaker_retry_s + 1)
        await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.SUCCEEDED
    assert [c.source_uri for c in lite.fetch.calls] == [
        *["https://cdn.example/old.mp4"] * (unanswered + 1),
        "https://cdn.example/fresh.mp4",
    ]
    runtime = await lite.reads.runtime(attempt.id)
    assert runtime is not None
    assert runtime.output_refreshes == 1  # only the answered refresh counted
    assert len(lite.fake.submit_calls) == 1


async def test_invalid_output_fails_task_with_reason(lite: Harness) -> None:
    """Bytes that are not the asked video fail the task with an OUTPUT_INVALID code."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-i"))
    lite.fake.set_job("job-i", done())
    lite.fetch.results = [OutputInvalid(InvalidReason.NOT_MP4, "html page")]
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(10)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.code == "OUTPUT_INVALID_NOT_MP4"


async def test_stuck_job_is_flagged_and_still_polled(lite: Harness) -> None:
    """Past the max plausible duration the job is flagged stuck and keeps being polled slowly."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-s"))
    lite.fake.set_job("job-s", snap(JobState.RUNNING))
    engine = lite.engine(max_plausible_s=60.0)
    await engine.run_until_idle()
    for _ in range(3):
        lite.clock.advance(160)
        await engine.run_until_idle()
    runtime = await lite.reads.runtime(attempt.id)
    assert runtime is not None
    assert runtime.stuck_since is not None
    assert engine.poller.stuck_flags == 1
    assert len(lite.fake.get_job_calls) >= 3


async def test_poll_error_is_retried_on_schedule(lite: Harness) -> None:
    """A failing get_job changes no state and the job is polled again later."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-f"))
    lite.fake.set_job("job-f", TimeoutError("adapter down"), PollResult(snap(JobState.RUNNING)))
    engine = lite.engine()
    await engine.run_until_idle()
    for _ in range(2):
        lite.clock.advance(30)
        await engine.run_until_idle()
    assert (await lite.attempt(attempt.id)).state is AttemptState.RUNNING


async def test_observers_hear_each_submit_and_each_finished_generation(harness: Harness) -> None:
    """The submit observer sees the ACCEPTED call and the end observer sees SUCCEEDED once."""
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(harness.fake.accepted("job-o"))
    harness.fake.set_job("job-o", snap(JobState.RUNNING), done())
    engine = harness.engine()
    submits: list[tuple[str, str]] = []
    ends: list[tuple[int, JobState]] = []

    async def on_submit(account, attempt, result, took_s):  # type: ignore[no-untyped-def]  # a hook double; its arguments are unused
        assert took_s >= 0
        submits.append((account.provider, result.kind.value))

    async def on_end(account, attempt, snapshot):  # type: ignore[no-untyped-def]  # a hook double; its arguments are unused
        ends.append((attempt.id, snapshot.state))

    engine.deps.on_submit = on_submit
    engine.deps.on_attempt_end = on_end
    await engine.run_until_idle()
    for _ in range(3):
        harness.clock.advance(90)
        await engine.run_until_idle()

    assert submits == [("runway", "ACCEPTED")]
    assert ends == [(attempt.id, JobState.SUCCEEDED)]

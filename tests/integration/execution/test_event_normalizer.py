"""The one event normalizer (9.18.1): idempotent, monotonic, tolerant, and never overriding
adoption.
"""

from __future__ import annotations

from controlplane.domain.observation import IngestOutcome
from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.engine import ExecutionEngine
from controlplane.execution.events import EventSource, Observation
from controlplane.persistence.records import AttemptRecord
from tests.integration.execution.exec_harness import Harness
from vidroute_core.adapter import (
    JobRef,
    JobSnapshot,
    JobState,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
)
from vidroute_core.errors import ErrorClass, make_error


def snap(state: JobState, raw: str | None = None, **kw: object) -> JobSnapshot:
    raw = raw or state.value
    return JobSnapshot(state, raw, f'{{"status":"{raw}"}}', **kw)  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them


async def accepted(h: Harness, job_id: str = "job-1") -> tuple[ExecutionEngine, AttemptRecord]:
    attempt = await h.task_with_attempt()
    h.fake.script_submit(h.fake.accepted(job_id))
    engine = h.engine()
    await engine.submitter.run_once()
    return engine, attempt


def obs(attempt: AttemptRecord, job_id: str, snapshot: JobSnapshot, h: Harness) -> Observation:
    return Observation(
        attempt.provider_account_id, job_id, snapshot, EventSource.CALLBACK, h.clock(), attempt.id
    )


async def test_duplicate_callback_moves_state_once(harness: Harness) -> None:
    """The same callback delivered twice yields one transition and one stored event."""
    engine, attempt = await accepted(harness)
    first = await engine.normalizer.ingest(obs(attempt, "job-1", snap(JobState.RUNNING), harness))
    again = await engine.normalizer.ingest(obs(attempt, "job-1", snap(JobState.RUNNING), harness))
    assert (first, again) == (IngestOutcome.APPLIED, IngestOutcome.DUPLICATE)
    events = await harness.reads.events(attempt_id=attempt.id)
    assert len(events) == 1
    current = await harness.attempt(attempt.id)
    assert current.state is AttemptState.RUNNING
    assert current.status_version == 3


async def test_out_of_order_status_never_moves_backwards(harness: Harness) -> None:
    """A late QUEUED after RUNNING is stored as STALE and the attempt stays RUNNING."""
    engine, attempt = await accepted(harness)
    await engine.normalizer.ingest(obs(attempt, "job-1", snap(JobState.RUNNING), harness))
    late = await engine.normalizer.ingest(obs(attempt, "job-1", snap(JobState.QUEUED), harness))
    assert late is IngestOutcome.STALE
    assert (await harness.attempt(attempt.id)).state is AttemptState.RUNNING
    assert [e.outcome for e in await harness.reads.events(attempt_id=attempt.id)] == [
        "APPLIED",
        "STALE",
    ]


async def test_terminal_is_final_even_for_late_running(lite: Harness) -> None:
    """After FAILED, a late RUNNING is stored and changes nothing."""
    engine, attempt = await accepted(lite)
    failure = make_error(ErrorClass.INTERNAL_PERMANENT, "BOOM", "gpu fault")
    await engine.normalizer.ingest(
        obs(attempt, "job-1", snap(JobState.FAILED, failure=failure), lite)
    )
    late = await engine.normalizer.ingest(obs(attempt, "job-1", snap(JobState.RUNNING), lite))
    assert late is IngestOutcome.LATE_STORED
    assert (await lite.attempt(attempt.id)).state is AttemptState.FAILED


async def test_unrecognized_status_is_flagged_not_fatal(harness: Harness) -> None:
    """An unknown provider status is stored raw and flagged on the attempt, with no transition."""
    engine, attempt = await accepted(harness)
    outcome = await engine.normalizer.ingest(
        obs(attempt, "job-1", snap(JobState.UNRECOGNIZED, "WARMING_UP"), harness)
    )
    assert outcome is IngestOutcome.UNRECOGNIZED
    runtime = await harness.reads.runtime(attempt.id)
    assert runtime is not None
    assert runtime.unrecognized_count == 1
    assert runtime.last_unrecognized_status == "WARMING_UP"
    assert (await harness.attempt(attempt.id)).state is AttemptState.ACCEPTED
    [event] = await harness.reads.events(attempt_id=attempt.id)
    assert event.raw_payload == '{"status":"WARMING_UP"}'


async def test_succeeded_adopts_and_queues_output_fetch(lite: Harness) -> None:
    """SUCCEEDED adopts the attempt: task OUTPUT_FETCHING and one output.fetch message."""
    engine, attempt = await accepted(lite)
    outcome = await engine.normalizer.ingest(obs(attempt, "job-1", snap(JobState.SUCCEEDED), lite))
    assert outcome is IngestOutcome.ADOPTED
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.OUTPUT_FETCHING
    assert detail.task.adopted_attempt_id == attempt.id
    assert len(await lite.messages(Topic.OUTPUT_FETCH)) == 1


async def test_late_success_of_old_attempt_is_stored_not_adopted(harness: Harness) -> None:
    """When the task adopted attempt B, a late SUCCEEDED of attempt A is stored but never
    adopted.
    """
    engine, first = await accepted(harness, "job-a")
    detail = await harness.detail(first.task_id)
    # The scheduler started a second attempt while A still ran (e.g. hedging or an operator).
    async with harness.db.unit(harness.clock()) as u:
        assert await u.move_task_at(first.task_id, detail.task.status_version, TaskState.SCHEDULING)
    second = await harness.new_attempt(first.task_id, first.provider_account_id)
    harness.fake.script_submit(harness.fake.accepted("job-b"))
    await engine.submitter.run_once()
    won = await engine.normalizer.ingest(obs(second, "job-b", snap(JobState.SUCCEEDED), harness))
    late = await engine.normalizer.ingest(obs(first, "job-a", snap(JobState.SUCCEEDED), harness))

    assert (won, late) == (IngestOutcome.ADOPTED, IngestOutcome.NOT_ADOPTED)
    detail = await harness.detail(first.task_id)
    assert detail.task.adopted_attempt_id == second.id
    assert (await harness.attempt(first.id)).state is AttemptState.SUCCEEDED
    assert len(await harness.reads.events(attempt_id=first.id)) == 1


async def test_job_failure_fails_over_with_exclusion(lite: Harness) -> None:
    """A retryable job failure after acceptance requeues the task, excluding the failed
    candidate softly (an endpoint-health failure) and not again before a backoff.
    """
    engine, attempt = await accepted(lite)
    failure = make_error(ErrorClass.INTERNAL_RETRYABLE, "GPU_LOST", "worker died")
    await engine.normalizer.ingest(
        obs(attempt, "job-1", snap(JobState.FAILED, failure=failure), lite)
    )
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.QUEUED
    assert len(await lite.messages(Topic.REQUEUE)) == 1
    [excluded] = await lite.excluded(attempt.task_id)
    assert (excluded.provider_account_id, excluded.provider_model, excluded.soft) == (
        attempt.provider_account_id,
        "gen4.5",
        True,
    )
    assert excluded.retry_at is not None
    assert excluded.retry_at > detail.task.updated_at
    assert await lite.used(attempt.provider_account_id) == (0, 0)


async def test_safety_output_failure_is_not_regenerated(lite: Harness) -> None:
    """A SAFETY_OUTPUT job failure fails the task (regeneration is off by product policy)."""
    engine, attempt = await accepted(lite)
    failure = make_error(ErrorClass.SAFETY_OUTPUT, "OUTPUT_BLOCKED", "moderation")
    await engine.normalizer.ingest(
        obs(attempt, "job-1", snap(JobState.FAILED, failure=failure), lite)
    )
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.FAILED
    assert await lite.messages(Topic.REQUEUE) == []


async def test_unknown_job_is_stored_unmatched(lite: Harness) -> None:
    """An observation of a job nobody recorded is stored as UNMATCHED evidence, no crash."""
    engine, attempt = await accepted(lite)
    outcome = await engine.normalizer.ingest(obs(attempt, "job-x", snap(JobState.RUNNING), lite))
    assert outcome is IngestOutcome.UNMATCHED
    assert (await lite.attempt(attempt.id)).state is AttemptState.ACCEPTED


async def test_job_failure_replaces_an_earlier_transport_error(harness: Harness) -> None:
    """A recovered submit whose job then fails reports the job's failure, not the old timeout."""
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(
        SubmitOutcome(
            SubmitKind.UNKNOWN,
            error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "read timeout"),
            transport_stage=TransportStage.AWAIT_RESPONSE,
        )
    )
    harness.fake.script_recover(
        RecoverResult(
            RecoveryVerdict.FOUND,
            job=JobRef("job-f", harness.fake.account),
            method="idempotency_key",
        )
    )
    engine = harness.engine()
    failed = JobSnapshot(
        JobState.FAILED,
        "FAILED",
        '{"status":"FAILED"}',
        failure=make_error(ErrorClass.SAFETY_OUTPUT, "SAFETY.OUTPUT.VIDEO", "blocked"),
    )
    harness.fake.set_job("job-f", failed)
    for _ in range(4):
        harness.clock.advance(60)
        await engine.run_until_idle()
    final = await harness.attempt(attempt.id)
    assert final.state is AttemptState.FAILED
    assert final.failure is not None
    assert final.failure.failure_class == "SAFETY_OUTPUT"
    assert final.failure.code == "SAFETY.OUTPUT.VIDEO"

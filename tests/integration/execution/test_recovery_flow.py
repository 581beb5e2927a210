"""Recovery of unknown submits (9.17.4/9.17.5) and crash safety around the submit call."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest

from controlplane.domain.observation import IngestOutcome
from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.events import EventSource, Observation
from controlplane.persistence.database import Database
from controlplane.persistence.records import AttemptRecord
from tests.integration.execution.exec_harness import ACCOUNT, Harness
from vidroute_core.adapter import (
    JobRef,
    JobSnapshot,
    JobState,
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


async def test_recovery_found_adopts_the_job(harness: Harness) -> None:
    """recover() FOUND records that job, moves the attempt to ACCEPTED and resolves the unknown
    slot.
    """
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(_unknown())
    harness.fake.script_recover(
        RecoverResult(RecoveryVerdict.FOUND, job=JobRef("job-r", ACCOUNT), method="idempotency_key")
    )
    engine = harness.engine()
    await engine.run_until_idle()
    harness.clock.advance(10)
    await engine.run_until_idle()

    detail = await harness.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ACCEPTED]
    assert [j.provider_job_id for j in detail.provider_jobs] == ["job-r"]
    assert detail.task.state is TaskState.RUNNING
    assert len(harness.fake.submit_calls) == 1
    assert harness.fake.recover_calls[0].client_request_key == attempt.client_request_key
    assert await harness.used(attempt.provider_account_id) == (1, 0)


async def test_not_found_proves_absence_and_requeues(harness: Harness) -> None:
    """NOT_FOUND fails the attempt as PROVEN_ABSENT and requeues the task without excluding it."""
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(_unknown())
    harness.fake.script_recover(RecoverResult(RecoveryVerdict.NOT_FOUND, method="task_search"))
    engine = harness.engine()
    await engine.run_until_idle()
    harness.clock.advance(10)
    await engine.run_until_idle()

    detail = await harness.detail(attempt.task_id)
    assert detail.task.state is TaskState.QUEUED
    [failed] = detail.attempts
    assert failed.state is AttemptState.FAILED
    assert failed.failure is not None
    assert failed.failure.code == "PROVEN_ABSENT"
    assert len(await harness.messages(Topic.REQUEUE)) == 1
    [requeue] = await harness.requeues(attempt.task_id)
    assert requeue.reason == "PROVEN_ABSENT"
    assert await harness.excluded(attempt.task_id) == []
    assert len(harness.fake.submit_calls) == 1
    assert await harness.used(attempt.provider_account_id) == (0, 0)


async def test_inconclusive_until_limits_abandons_and_fails_task(lite: Harness) -> None:
    """Inconclusive answers retry with backoff; past max_recovery_queries the attempt is
    ABANDONED.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    engine = lite.engine(max_recovery_queries=3, usage_lookup_after_queries=99)
    await engine.run_until_idle()
    for _ in range(6):
        lite.clock.advance(300)
        await engine.run_until_idle()

    detail = await lite.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ABANDONED]
    assert len(lite.fake.recover_calls) == 3
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.failure_class == "SUBMISSION_UNKNOWN"
    assert "allow_new_attempt_after_abandon=False" in detail.task.failure.message
    assert len(lite.fake.submit_calls) == 1
    assert await lite.used(attempt.provider_account_id) == (1, 1)  # left to reconciliation


async def test_abandon_policy_may_requeue(lite: Harness) -> None:
    """With allow_new_attempt_after_abandon the abandoned task is requeued, as a recorded
    decision.
    """
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    engine = lite.engine(
        allow_new_attempt_after_abandon=True,
        unknown_recovery_deadline_s=60,
        usage_lookup_after_queries=99,
    )
    await engine.run_until_idle()
    lite.clock.advance(3600)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert detail.task.state is TaskState.QUEUED
    assert len(await lite.messages(Topic.REQUEUE)) == 1
    [requeue] = await lite.requeues(attempt.task_id)
    assert requeue.reason == "ABANDONED_NEW_ATTEMPT"


async def test_idempotent_provider_resends_with_the_same_key(lite: Harness) -> None:
    """For a provider honouring keys, recovery re-sends the SAME key and adopts the returned job."""
    attempt = await lite.task_with_attempt(provider="self_hosted")
    lite.fake.script_submit(_unknown(), lite.fake.accepted("job-same"))
    engine = lite.engine()
    await engine.run_until_idle()
    lite.clock.advance(10)
    await engine.run_until_idle()

    keys = [c.client_request_key for c in lite.fake.submit_calls]
    assert keys == [attempt.client_request_key, attempt.client_request_key]
    assert lite.fake.recover_calls == []
    detail = await lite.detail(attempt.task_id)
    assert [j.provider_job_id for j in detail.provider_jobs] == ["job-same"]
    assert detail.attempts[0].state is AttemptState.ACCEPTED


def _usage_naming(attempt: AttemptRecord, lite: Harness) -> UsageRecord:
    """A usage record of job "job-usage" that carries `attempt`'s client request key."""
    return UsageRecord(
        "job-usage",
        "gen4.5",
        lite.clock.now,
        1000,
        "s",
        250_000,
        "USD",
        "{}",
        client_request_key=attempt.client_request_key,
    )


async def test_usage_records_are_the_last_resort(lite: Harness) -> None:
    """When queries stay inconclusive, the one usage job carrying this attempt's client request
    key is adopted."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    lite.fake.usage.append(_usage_naming(attempt, lite))
    engine = lite.engine(usage_lookup_after_queries=1)
    await engine.run_until_idle()
    lite.clock.advance(10)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert [j.provider_job_id for j in detail.provider_jobs] == ["job-usage"]


async def test_usage_is_never_asked_where_the_capability_declares_none(lite: Harness) -> None:
    """A provider whose capability declares no usage records (Veo) is never asked for them:
    the same job in its usage stays unread and the attempt stays unknown, INCONCLUSIVE."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(_unknown())
    lite.fake.usage.append(_usage_naming(attempt, lite))

    async def declares_none(_attempt: AttemptRecord) -> bool:
        return False

    engine = lite.engine(usage_declared=declares_none, usage_lookup_after_queries=1)
    await engine.run_until_idle()
    lite.clock.advance(10)
    await engine.run_until_idle()
    assert lite.fake.usage_calls == []
    assert lite.fake.recover_calls  # recovery ran: only the usage step was left out
    detail = await lite.detail(attempt.task_id)
    assert not detail.provider_jobs
    assert detail.attempts[0].state is AttemptState.SUBMIT_UNKNOWN


class FlakyDatabase(Database):
    """Fails the next unit of work once armed (a database outage at the worst moment)."""

    armed = False

    @asynccontextmanager
    async def unit(self, now, **options):  # type: ignore[no-untyped-def]  # a test double; the base types it
        if FlakyDatabase.armed:
            FlakyDatabase.armed = False
            raise ConnectionError("database went away")
        async with super().unit(now, **options) as u:
            yield u


async def test_database_failure_after_job_id_recovers_without_second_submit(
    harness: Harness,
) -> None:
    """A DB failure right after ACCEPTED leaves SUBMITTING; a restart makes it unknown and recovers
    it.
    """
    attempt = await harness.task_with_attempt()

    def accept_then_break(*_args: object) -> SubmitOutcome:
        FlakyDatabase.armed = True
        return harness.fake.accepted("job-lost")

    harness.fake.script_submit(accept_then_break)
    harness.fake.script_recover(
        RecoverResult(
            RecoveryVerdict.FOUND, job=JobRef("job-lost", ACCOUNT), method="idempotency_key"
        )
    )
    crashed = harness.engine()
    crashed.deps.db = FlakyDatabase(harness.db.engine)
    with pytest.raises(ConnectionError):
        await crashed.run_until_idle()
    assert (await harness.attempt(attempt.id)).state is AttemptState.SUBMITTING
    assert (await harness.detail(attempt.task_id)).provider_jobs == ()

    harness.clock.advance(120)  # past submitting_grace_s and the message claim
    restarted = harness.engine(worker_id="w2")
    await restarted.run_until_idle()
    harness.clock.advance(10)
    await restarted.run_until_idle()

    detail = await harness.detail(attempt.task_id)
    assert [a.state for a in detail.attempts] == [AttemptState.ACCEPTED]
    assert detail.attempts[0].transport_error_stage == "SUBMIT_INTERRUPTED"
    assert [j.provider_job_id for j in detail.provider_jobs] == ["job-lost"]
    assert len(harness.fake.submit_calls) == 1


async def test_callback_before_submit_response_is_applied_after_accept(lite: Harness) -> None:
    """A callback that beats the submit response is stored, then replayed once the job is
    recorded.
    """
    attempt = await lite.task_with_attempt()
    engine = lite.engine()
    done = JobSnapshot(JobState.SUCCEEDED, "SUCCEEDED", '{"status":"SUCCEEDED"}')

    async def early_callback(*_args: object) -> SubmitOutcome:
        outcome = await engine.normalizer.ingest(
            Observation(
                attempt.provider_account_id,
                "job-early",
                done,
                EventSource.CALLBACK,
                lite.clock(),
                attempt.id,
            )
        )
        assert outcome is IngestOutcome.UNMATCHED
        return lite.fake.accepted("job-early")

    lite.fake.script_submit(early_callback)
    await engine.submitter.run_once()
    detail = await lite.detail(attempt.task_id)
    assert detail.attempts[0].state is AttemptState.SUCCEEDED
    assert detail.task.state is TaskState.OUTPUT_FETCHING
    assert detail.task.adopted_attempt_id == attempt.id


async def test_early_callback_resolves_an_unknown_submit(lite: Harness) -> None:
    """An early callback naming the attempt is recovery evidence: FOUND without asking the
    provider.
    """
    attempt = await lite.task_with_attempt()
    engine = lite.engine()
    running = JobSnapshot(JobState.RUNNING, "RUNNING", '{"status":"RUNNING"}')

    async def callback_then_timeout(*_args: object) -> SubmitOutcome:
        await engine.normalizer.ingest(
            Observation(
                attempt.provider_account_id,
                "job-cb",
                running,
                EventSource.CALLBACK,
                lite.clock(),
                attempt.id,
            )
        )
        return _unknown()

    lite.fake.script_submit(callback_then_timeout)
    await engine.run_until_idle()
    lite.clock.advance(10)
    await engine.run_until_idle()
    detail = await lite.detail(attempt.task_id)
    assert [j.provider_job_id for j in detail.provider_jobs] == ["job-cb"]
    assert detail.attempts[0].state not in (AttemptState.SUBMIT_UNKNOWN, AttemptState.FAILED)
    assert lite.fake.recover_calls == []

"""The event normalizer's rules over the in-memory unit of work (no database at all).

`MemoryDatabase` implements the same ports as `Database`, compare-and-set included, so these
tests drive the real `EventNormalizer` and check what it wrote: the attempt's move, the job,
the runtime row, the task's adoption and its outbox message, the stored observation.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.events import EventNormalizer, EventSource, Observation
from controlplane.execution.outcomes import ExecutionDeps
from controlplane.persistence.memory import MemoryDatabase
from controlplane.persistence.records import AttemptRecord, TaskRecord
from tests.support.memory_deps import NOW, SPEC, memory_deps
from vidroute_core.adapter import JobSnapshot, JobState
from vidroute_core.errors import ErrorClass, make_error


def _deps(mem: MemoryDatabase) -> ExecutionDeps:
    return memory_deps(mem, NOW)


def _running(mem: MemoryDatabase, job_id: str = "job-1") -> tuple[TaskRecord, AttemptRecord]:
    """A RUNNING task whose only attempt is ACCEPTED with a recorded job."""
    account = mem.add_account("runway")
    task = mem.add_task(SPEC, TaskState.RUNNING)
    return task, mem.add_attempt(task, account, AttemptState.ACCEPTED, job_id=job_id)


def _seen(attempt: AttemptRecord, state: JobState, raw: str, job_id: str = "job-1") -> Observation:
    return Observation(
        attempt.provider_account_id,
        job_id,
        JobSnapshot(state, raw, raw_payload_json=f'{{"status": "{raw}"}}'),
        EventSource.POLL,
        NOW,
    )


async def test_a_running_job_moves_the_accepted_attempt_forward() -> None:
    """RUNNING applies: the attempt moves by CAS, the job and runtime row follow, all stored."""
    mem = MemoryDatabase()
    _, attempt = _running(mem)
    normalizer = EventNormalizer(_deps(mem))

    outcome = await normalizer.ingest(_seen(attempt, JobState.RUNNING, "IN_PROGRESS"))

    assert outcome.value == "APPLIED"
    snap = await mem.snapshot(attempt.id)
    assert snap is not None
    moved, job, runtime = snap
    assert (moved.state, moved.status_version) == (AttemptState.RUNNING, 1)
    assert job is not None
    assert (job.raw_status, job.normalized_status) == ("IN_PROGRESS", AttemptState.RUNNING)
    assert runtime is not None
    assert runtime.poll_phase is not None
    assert [e.outcome for e in await mem.events(attempt_id=attempt.id)] == ["APPLIED"]
    assert [e.kind for e in mem.task_events] == ["attempt.state_changed"]


async def test_the_same_observation_twice_is_a_duplicate_and_changes_nothing() -> None:
    """Deduplicated by (account, job, raw status, payload hash): the second one writes nothing."""
    mem = MemoryDatabase()
    _, attempt = _running(mem)
    normalizer = EventNormalizer(_deps(mem))
    await normalizer.ingest(_seen(attempt, JobState.RUNNING, "IN_PROGRESS"))
    before = await mem.snapshot(attempt.id)

    again = await normalizer.ingest(_seen(attempt, JobState.RUNNING, "IN_PROGRESS"))

    assert again.value == "DUPLICATE"
    assert await mem.snapshot(attempt.id) == before
    assert len(await mem.events(attempt_id=attempt.id)) == 1


async def test_success_of_the_current_attempt_adopts_it_and_asks_for_the_output() -> None:
    """SUCCEEDED: task -> OUTPUT_FETCHING with the attempt adopted, and one output.fetch."""
    mem = MemoryDatabase()
    task, attempt = _running(mem)

    outcome = await EventNormalizer(_deps(mem)).ingest(
        _seen(attempt, JobState.SUCCEEDED, "SUCCEEDED")
    )

    assert outcome.value == "ADOPTED"
    detail = await mem.get_task(task.id)
    assert detail is not None
    assert (detail.task.state, detail.task.adopted_attempt_id) == (
        TaskState.OUTPUT_FETCHING,
        attempt.id,
    )
    assert detail.attempts[0].state is AttemptState.SUCCEEDED
    (message,) = mem.outbox
    assert (message.topic, message.payload["attempt_id"]) == (Topic.OUTPUT_FETCH, attempt.id)


async def test_success_of_an_attempt_the_task_no_longer_waits_on_is_not_adopted() -> None:
    """A later attempt exists: the older one's success is stored, the task keeps waiting."""
    mem = MemoryDatabase()
    task, first = _running(mem)
    mem.add_attempt(task, first.provider_account_id, AttemptState.ACCEPTED, job_id="job-2")

    outcome = await EventNormalizer(_deps(mem)).ingest(
        _seen(first, JobState.SUCCEEDED, "SUCCEEDED")
    )

    assert outcome.value == "NOT_ADOPTED"
    detail = await mem.get_task(task.id)
    assert detail is not None
    assert (detail.task.state, detail.task.adopted_attempt_id) == (TaskState.RUNNING, None)
    assert mem.outbox == []


async def test_a_failed_job_fails_the_attempt_over_and_requeues_the_task() -> None:
    """FAILED with a retryable class: the attempt fails, the task goes back to QUEUED with its
    failover history recorded and a ``task.requeue`` wake-up, all in the one unit."""
    mem = MemoryDatabase()
    task, attempt = _running(mem)
    failed = JobSnapshot(
        JobState.FAILED,
        "FAILED",
        raw_payload_json='{"status": "FAILED"}',
        failure=make_error(ErrorClass.PROVIDER_OVERLOADED, "OVERLOADED", "try later"),
    )

    outcome = await EventNormalizer(_deps(mem)).ingest(
        Observation(attempt.provider_account_id, "job-1", failed, EventSource.POLL, NOW)
    )

    assert outcome.value == "APPLIED"
    detail = await mem.get_task(task.id)
    assert detail is not None
    assert detail.attempts[0].state is AttemptState.FAILED
    assert detail.task.state is TaskState.QUEUED
    (request,) = mem.requeues
    assert (request.task_id, request.failed_attempt_id) == (task.id, attempt.id)
    assert [m.topic for m in mem.outbox] == [Topic.REQUEUE]


async def test_an_observation_of_an_unknown_job_is_stored_unmatched() -> None:
    """A callback that beat the submit response: kept for replay, nothing moves."""
    mem = MemoryDatabase()
    _, attempt = _running(mem)

    outcome = await EventNormalizer(_deps(mem)).ingest(
        _seen(attempt, JobState.RUNNING, "IN_PROGRESS", job_id="job-from-the-future")
    )

    assert outcome.value == "UNMATCHED"
    assert (await mem.snapshot(attempt.id)) is not None
    assert mem.task_events == []
    (event,) = await mem.events(job_id="job-from-the-future")
    assert event.outcome == "UNMATCHED"


async def test_the_fake_refuses_a_stale_compare_and_set_like_the_database() -> None:
    """A move from an outdated version, or one the table forbids, writes nothing."""
    mem = MemoryDatabase()
    task, attempt = _running(mem)
    async with mem.unit(NOW) as u:
        assert await u.move_attempt(attempt, AttemptState.RUNNING) is not None
        assert await u.move_attempt(attempt, AttemptState.RUNNING) is None  # version 0 is gone
        assert await u.move_task(task, TaskState.QUEUED) is None  # RUNNING -> QUEUED: forbidden
        stale = replace(task, status_version=task.status_version + 5)
        assert await u.move_task(stale, TaskState.FAILED) is None
    assert [e.kind for e in mem.task_events] == ["attempt.state_changed"]


async def test_a_failing_unit_leaves_nothing_behind() -> None:
    """Like a rolled-back transaction: the moves of a unit that raised are not kept."""
    mem = MemoryDatabase()
    _, attempt = _running(mem)

    async def move_then_crash() -> None:
        async with mem.unit(NOW) as u:
            assert await u.move_attempt(attempt, AttemptState.RUNNING) is not None
            raise RuntimeError("crash before commit")

    with pytest.raises(RuntimeError):
        await move_then_crash()
    snap = await mem.snapshot(attempt.id)
    assert snap is not None
    assert snap[0].state is AttemptState.ACCEPTED
    assert mem.task_events == []

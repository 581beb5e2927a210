"""Provider progress through the event normalizer into ``provider.progress`` task events:
throttled, rendered as TaskEvent.progress, never a state change, dropped once the attempt ended.
"""

from __future__ import annotations

import json

from controlplane.api.views import task_event
from controlplane.domain.observation import IngestOutcome
from controlplane.domain.states import AttemptState
from controlplane.execution.engine import ExecutionEngine
from controlplane.execution.events import EventSource, Observation
from controlplane.persistence.records import AttemptRecord, TaskEventRecord
from tests.integration.execution.exec_harness import Harness
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState


def _reading(
    state: JobState,
    fraction: float | None = None,
    position: int | None = None,
    outputs: tuple[JobOutput, ...] = (),
) -> JobSnapshot:
    raw = {"status": state.value, "progress": fraction, "queue_position": position}
    return JobSnapshot(
        state,
        state.value,
        json.dumps(raw),
        progress=fraction,
        queue_position=position,
        outputs=outputs,
    )


async def _accepted(h: Harness) -> tuple[ExecutionEngine, AttemptRecord]:
    attempt = await h.task_with_attempt()
    h.fake.script_submit(h.fake.accepted("job-1"))
    engine = h.engine()
    await engine.submitter.run_once()
    return engine, attempt


async def _see(
    h: Harness, engine: ExecutionEngine, attempt: AttemptRecord, snap: JobSnapshot
) -> IngestOutcome:
    return await engine.normalizer.ingest(
        Observation(
            attempt.provider_account_id, "job-1", snap, EventSource.POLL, h.clock(), attempt.id
        )
    )


async def _progress(h: Harness, task_id: int) -> list[TaskEventRecord]:
    events = await h.tasks.task_events(task_id, after_seq=0, limit=500)
    return [e for e in events if e.kind == "provider.progress"]


async def test_rising_progress_is_written_in_steps_and_same_progress_writes_nothing(
    harness: Harness,
) -> None:
    """Readings 0.0, 0.02, 0.10, 0.10, 0.40 (5 s apart) write 0.0, 0.10 and 0.40 only, and the
    progress-only observations leave the attempt's state and version alone."""
    engine, attempt = await _accepted(harness)
    await _see(harness, engine, attempt, _reading(JobState.RUNNING, 0.0))
    running = await harness.attempt(attempt.id)
    assert running.state is AttemptState.RUNNING
    for fraction in (0.02, 0.10, 0.10, 0.40):
        harness.clock.advance(5)
        await _see(harness, engine, attempt, _reading(JobState.RUNNING, fraction))
    marks = await _progress(harness, attempt.task_id)
    assert [m.payload["fraction"] for m in marks] == [0.0, 0.10, 0.40]
    assert {m.payload["attempt_id"] for m in marks} == {attempt.id}
    after = await harness.attempt(attempt.id)
    assert (after.state, after.status_version) == (running.state, running.status_version)
    rendered = task_event(marks[-1], pb.TASK_STATE_RUNNING)
    assert rendered.kind == pb.TASK_EVENT_KIND_PROVIDER_PROGRESS
    assert rendered.progress.HasField("fraction")
    assert rendered.progress.fraction == 0.40
    assert not rendered.progress.HasField("queue_position")
    assert rendered.attempt_state == pb.ATTEMPT_STATE_RUNNING


async def test_the_interval_holds_a_change_back_until_the_next_reading_after_it(
    lite: Harness,
) -> None:
    """A jump to 0.5 one second after the 0.1 mark is held back; the next reading, 5 s on,
    writes it (nothing is lost, only delayed)."""
    engine, attempt = await _accepted(lite)
    await _see(lite, engine, attempt, _reading(JobState.RUNNING, 0.1))
    lite.clock.advance(1)
    await _see(lite, engine, attempt, _reading(JobState.RUNNING, 0.5))
    assert [m.payload["fraction"] for m in await _progress(lite, attempt.task_id)] == [0.1]
    lite.clock.advance(5)
    await _see(lite, engine, attempt, _reading(JobState.RUNNING, 0.55))
    assert [m.payload["fraction"] for m in await _progress(lite, attempt.task_id)] == [0.1, 0.55]
    assert engine.normalizer.progress_marks == 2


async def test_queue_position_travels_into_the_event(harness: Harness) -> None:
    """Queue positions 2, 2, 0 write two marks carrying the position, rendered on the event."""
    engine, attempt = await _accepted(harness)
    for position in (2, 2, 0):
        await _see(harness, engine, attempt, _reading(JobState.QUEUED, 0.0, position))
        harness.clock.advance(6)
    marks = await _progress(harness, attempt.task_id)
    assert [m.payload["queue_position"] for m in marks] == [2, 0]
    assert marks[0].payload["state"] == "PROVIDER_QUEUED"
    rendered = task_event(marks[-1], pb.TASK_STATE_RUNNING)
    assert rendered.progress.HasField("queue_position")
    assert rendered.progress.queue_position == 0


async def test_late_progress_after_the_end_is_dropped(lite: Harness) -> None:
    """After SUCCEEDED adopted the attempt, a late RUNNING reading writes no progress event and
    moves nothing."""
    engine, attempt = await _accepted(lite)
    await _see(lite, engine, attempt, _reading(JobState.RUNNING, 0.3))
    lite.clock.advance(6)
    done = _reading(JobState.SUCCEEDED, 1.0, outputs=(JobOutput("https://cdn/x.mp4"),))
    assert await _see(lite, engine, attempt, done) is IngestOutcome.ADOPTED
    ended = await lite.attempt(attempt.id)
    lite.clock.advance(6)
    late = await _see(lite, engine, attempt, _reading(JobState.RUNNING, 0.9))
    assert late is IngestOutcome.LATE_STORED
    assert [m.payload["fraction"] for m in await _progress(lite, attempt.task_id)] == [0.3]
    assert (await lite.attempt(attempt.id)).status_version == ended.status_version

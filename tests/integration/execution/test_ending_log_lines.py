"""Every ending says why, once (issue 20): an attempt that ends ABANDONED and a task that ends
terminal each log one line with their ids and reason, and the caller sees the same reason in
GetTask (the attempt's error, the task's failure) and WatchTask (the event's detail)."""

from __future__ import annotations

import json
import logging

import pytest

from controlplane.api import views
from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence.endings import Ending, log_endings
from tests.integration.execution.exec_harness import Harness
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute_core.adapter import SubmitKind, SubmitOutcome, TransportStage
from vidroute_core.errors import ErrorClass, make_error
from vidroute_core.logs import bound_ids

ENDINGS = "controlplane.persistence.endings"


def _unknown() -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.UNKNOWN,
        error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "TIMEOUT", "read timeout"),
        transport_stage=TransportStage.AWAIT_RESPONSE,
    )


class _Ids(logging.Handler):
    """Keeps each ending record with the ids bound when it was logged."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, dict[str, object]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), dict(bound_ids())))


async def test_an_abandoned_attempt_and_its_failed_task_log_one_line_each(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Recovery gives up on an unknown submit: one WARNING line names the attempt, its task and
    why it was ABANDONED, one names the task that FAILED with it; GetTask and WatchTask show the
    same reason."""
    attempt = await harness.task_with_attempt()
    harness.fake.script_submit(_unknown())
    engine = harness.engine(max_recovery_queries=2, usage_lookup_after_queries=99)
    ids = _Ids()
    logging.getLogger(ENDINGS).addHandler(ids)
    try:
        with caplog.at_level(logging.INFO, logger=ENDINGS):
            await engine.run_until_idle()
            for _ in range(6):
                harness.clock.advance(300)
                await engine.run_until_idle()
    finally:
        logging.getLogger(ENDINGS).removeHandler(ids)

    detail = await harness.detail(attempt.task_id)
    [abandoned] = detail.attempts
    assert abandoned.state is AttemptState.ABANDONED
    assert detail.task.state is TaskState.FAILED
    lines = [r for r in caplog.records if r.name == ENDINGS]
    attempt_lines = [r for r in lines if r.getMessage().startswith(f"attempt {attempt.id} ")]
    task_lines = [r for r in lines if r.getMessage().startswith(f"task {attempt.task_id} ")]
    assert len(attempt_lines) == 1
    assert len(task_lines) == 1
    assert attempt_lines[0].levelno == logging.WARNING
    assert f"of task {attempt.task_id} ended ABANDONED: ABANDONED:" in attempt_lines[0].getMessage()
    assert "SUBMISSION_UNKNOWN" in attempt_lines[0].getMessage()
    assert "ended FAILED" in task_lines[0].getMessage()
    bound = dict(ids.seen)
    attempt_ids = bound[attempt_lines[0].getMessage()]
    assert (attempt_ids["task_id"], attempt_ids["attempt_id"]) == (attempt.task_id, attempt.id)
    assert bound[task_lines[0].getMessage()]["task_id"] == attempt.task_id

    # The caller's view: GetTask's attempt error and task failure, WatchTask's event detail.
    shown = views.task(detail.task, detail)
    [view] = shown.attempts
    assert view.state == pb.ATTEMPT_STATE_ABANDONED
    assert view.error.code == "ABANDONED"
    assert "recovery gave up" in view.error.message
    assert shown.failure.message
    events = await harness.tasks.task_events(attempt.task_id, after_seq=0, limit=100)
    moved = [
        json.loads(views.task_event(e, None).detail_json)
        for e in events
        if e.kind == "attempt.state_changed" and e.payload.get("state") == "ABANDONED"
    ]
    assert len(moved) == 1
    assert moved[0]["reason"].startswith("ABANDONED:")
    assert moved[0]["failure"]["code"] == "ABANDONED"


async def test_a_rolled_back_ending_logs_nothing(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A unit that moved a task to a terminal state and then rolled back logs no ending."""
    attempt = await harness.task_with_attempt()

    async def cancel_then_fail() -> None:
        async with harness.db.unit(harness.clock()) as u:
            task = await u.task(attempt.task_id)
            assert task is not None
            moved = await u.move_task(task, TaskState.CANCELLED, "cancelled by test")
            assert moved is not None
            raise RuntimeError("roll back")

    with caplog.at_level(logging.INFO, logger=ENDINGS), pytest.raises(RuntimeError):
        await cancel_then_fail()
    assert not [r for r in caplog.records if r.name == ENDINGS]
    assert (await harness.detail(attempt.task_id)).task.state is not TaskState.CANCELLED


def test_an_ending_line_carries_its_reason_and_failure(caplog: pytest.LogCaptureFixture) -> None:
    """The line of a SUCCEEDED task is INFO; a FAILED one is a WARNING with its failure."""
    from controlplane.persistence.records import Failure

    with caplog.at_level(logging.INFO, logger=ENDINGS):
        log_endings(
            [
                Ending(7, "SUCCEEDED", "output stored"),
                Ending(
                    8,
                    "FAILED",
                    "NO_ELIGIBLE_CANDIDATE",
                    Failure("UNSUPPORTED_CAPABILITY", "X", "why"),
                ),
            ]
        )
    ok, bad = [r for r in caplog.records if r.name == ENDINGS]
    assert (ok.levelno, ok.getMessage()) == (logging.INFO, "task 7 ended SUCCEEDED: output stored")
    assert bad.levelno == logging.WARNING
    assert bad.getMessage() == (
        "task 8 ended FAILED: NO_ELIGIBLE_CANDIDATE (UNSUPPORTED_CAPABILITY X: why)"
    )

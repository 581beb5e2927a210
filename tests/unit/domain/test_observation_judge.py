"""Judging a provider observation (design 9.8.1, 9.18.1, 9.3.4): moves, adoption and late events."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.observation import (
    ATTEMPT_TARGET,
    IngestOutcome,
    ObservationFacts,
    TaskMove,
    judge,
    poll_phase_of,
    settles_submit,
    task_waits_on,
)
from controlplane.domain.polling import PollPhase
from controlplane.domain.states import ATTEMPT_MACHINE, ATTEMPT_PHASE, AttemptState, TaskState
from vidroute_core.adapter import JobState
from vidroute_core.errors import ErrorClass, make_error

_A = AttemptState
ATTEMPT_ID = 7

# A running attempt its task still waits on: the common case each example varies.
RUNNING = ObservationFacts(
    job_state=JobState.RUNNING,
    raw_status="processing",
    attempt_id=ATTEMPT_ID,
    attempt_no=2,
    attempt_state=_A.RUNNING,
    task_state=TaskState.RUNNING,
    latest_attempt_id=ATTEMPT_ID,
)

facts_st = st.builds(
    ObservationFacts,
    job_state=st.sampled_from(JobState),
    raw_status=st.sampled_from(["", "done", "error", "weird"]),
    attempt_id=st.just(ATTEMPT_ID),
    attempt_no=st.integers(1, 5),
    attempt_state=st.sampled_from(AttemptState),
    task_state=st.sampled_from(TaskState),
    adopted_attempt_id=st.sampled_from([None, ATTEMPT_ID, ATTEMPT_ID + 1]),
    latest_attempt_id=st.sampled_from([None, ATTEMPT_ID, ATTEMPT_ID + 1]),
    failure=st.sampled_from(
        [None, make_error(ErrorClass.SAFETY_OUTPUT, "BLOCKED", "the output was blocked")]
    ),
    cancel_requested=st.booleans(),
    deliver_if_succeeded_during_cancel=st.booleans(),
)


def test_every_recognized_job_state_names_an_attempt_state() -> None:
    """Each provider job state but UNRECOGNIZED maps to one attempt state, terminal for terminal."""
    assert set(ATTEMPT_TARGET) == set(JobState) - {JobState.UNRECOGNIZED}
    for job_state, target in ATTEMPT_TARGET.items():
        assert ATTEMPT_MACHINE.is_terminal(target) is job_state.terminal


def test_forward_observation_moves_the_attempt() -> None:
    """A later provider state moves the attempt to its target and records the job."""
    verdict = judge(replace(RUNNING, job_state=JobState.RUNNING, attempt_state=_A.PROVIDER_QUEUED))
    assert verdict.outcome is IngestOutcome.APPLIED
    assert (verdict.move_to, verdict.record) == (_A.RUNNING, True)
    assert verdict.task_move is None
    assert verdict.fail_over is None


def test_older_observation_is_stale() -> None:
    """QUEUED after RUNNING is an older view: STALE, nothing recorded."""
    verdict = judge(replace(RUNNING, job_state=JobState.QUEUED))
    assert verdict.outcome is IngestOutcome.STALE
    assert verdict.move_to is None
    assert not verdict.record


def test_same_state_is_no_change_but_recorded() -> None:
    """The state the attempt is already in changes nothing but the job's raw view."""
    verdict = judge(RUNNING)
    assert (verdict.outcome, verdict.move_to, verdict.record) == (
        IngestOutcome.NO_CHANGE,
        None,
        True,
    )


def test_unrecognized_is_stored_and_flagged_never_a_move() -> None:
    """An unknown provider status is stored raw, even for a submit still in flight."""
    for state in (_A.RUNNING, _A.SUBMITTING, _A.SUCCEEDED):
        verdict = judge(replace(RUNNING, job_state=JobState.UNRECOGNIZED, attempt_state=state))
        assert verdict.outcome is IngestOutcome.UNRECOGNIZED
        assert verdict.move_to is None
        assert verdict.record
    assert not settles_submit(_A.SUBMITTING, JobState.UNRECOGNIZED)


def test_late_terminal_event_is_stored_on_the_job_only() -> None:
    """FAILED after SUCCEEDED is LATE_STORED on the job; a late non-terminal one is not stored."""
    done = replace(RUNNING, attempt_state=_A.SUCCEEDED)
    late = judge(replace(done, job_state=JobState.FAILED))
    assert (late.outcome, late.move_to, late.record) == (IngestOutcome.LATE_STORED, None, True)
    early = judge(replace(done, job_state=JobState.RUNNING))
    assert (early.outcome, early.record) == (IngestOutcome.LATE_STORED, False)
    again = judge(replace(done, job_state=JobState.SUCCEEDED))
    assert (again.outcome, again.record) == (IngestOutcome.NO_CHANGE, False)


def test_success_of_the_waited_on_attempt_is_adopted() -> None:
    """SUCCEEDED while the task waits: task -> OUTPUT_FETCHING adopting it, output fetched."""
    verdict = judge(replace(RUNNING, job_state=JobState.SUCCEEDED))
    assert verdict.outcome is IngestOutcome.ADOPTED
    assert verdict.move_to is _A.SUCCEEDED
    assert verdict.task_move == TaskMove(
        TaskState.OUTPUT_FETCHING, "attempt 2 succeeded", adopt=True
    )
    assert verdict.fetch_output


def test_success_of_a_superseded_attempt_is_not_adopted() -> None:
    """A task that adopted another attempt keeps it; the success only ends this attempt."""
    verdict = judge(
        replace(
            RUNNING,
            job_state=JobState.SUCCEEDED,
            task_state=TaskState.OUTPUT_FETCHING,
            adopted_attempt_id=ATTEMPT_ID + 1,
        )
    )
    assert verdict.outcome is IngestOutcome.NOT_ADOPTED
    assert verdict.move_to is _A.SUCCEEDED
    assert verdict.task_move is None
    assert not verdict.fetch_output


def test_success_during_a_cancel_is_discarded_unless_delivered() -> None:
    """A success that beat a requested cancel cancels the task, or is adopted if policy says so."""
    asked = replace(RUNNING, job_state=JobState.SUCCEEDED, attempt_state=_A.CANCEL_REQUESTED)
    discarded = judge(replace(asked, cancel_requested=True))
    assert discarded.outcome is IngestOutcome.NOT_ADOPTED
    assert discarded.task_move is not None
    assert discarded.task_move.to is TaskState.CANCELLED
    assert not discarded.task_move.adopt
    delivered = judge(
        replace(asked, cancel_requested=True, deliver_if_succeeded_during_cancel=True)
    )
    assert delivered.outcome is IngestOutcome.ADOPTED
    assert delivered.fetch_output


def test_failure_goes_to_failover_with_the_jobs_own_error() -> None:
    """FAILED ends the attempt with the job's failure, or PROVIDER_FAILED when it gave none."""
    own = make_error(ErrorClass.SAFETY_OUTPUT, "BLOCKED", "blocked")
    verdict = judge(replace(RUNNING, job_state=JobState.FAILED, failure=own))
    assert (verdict.outcome, verdict.move_to) == (IngestOutcome.APPLIED, _A.FAILED)
    assert verdict.failure == own
    assert verdict.fail_over == own
    bare = judge(replace(RUNNING, job_state=JobState.FAILED, raw_status="error 500"))
    assert bare.fail_over is not None
    assert (bare.fail_over.error_class, bare.fail_over.code, bare.fail_over.message) == (
        ErrorClass.INTERNAL_PERMANENT,
        "PROVIDER_FAILED",
        "error 500",
    )


def test_cancel_confirmation_cancels_the_task_and_a_provider_cancel_fails_over() -> None:
    """CANCELLED asked for cancels the waiting task; unasked, it is a definite failure."""
    cancelled = replace(RUNNING, job_state=JobState.CANCELLED)
    for asked in (
        replace(cancelled, attempt_state=_A.CANCEL_REQUESTED),
        replace(cancelled, cancel_requested=True),
    ):
        verdict = judge(asked)
        assert verdict.outcome is IngestOutcome.APPLIED
        assert verdict.task_move == TaskMove(TaskState.CANCELLED, "provider confirmed the cancel")
        assert verdict.fail_over is None
    unasked = judge(cancelled)
    assert unasked.task_move is None
    assert unasked.fail_over is not None
    assert unasked.fail_over.code == "PROVIDER_CANCELLED"
    assert unasked.failure is None  # the attempt records no failure of its own
    gone = judge(replace(cancelled, latest_attempt_id=ATTEMPT_ID + 1))
    assert (gone.move_to, gone.task_move, gone.fail_over) == (_A.CANCELLED, None, None)


def test_task_waits_only_on_its_latest_unadopted_attempt_while_live() -> None:
    """Live task, latest attempt, nothing else adopted: the only case a task waits on it."""
    assert task_waits_on(TaskState.RUNNING, None, ATTEMPT_ID, ATTEMPT_ID)
    assert task_waits_on(TaskState.SUBMITTING, ATTEMPT_ID, ATTEMPT_ID, ATTEMPT_ID)
    assert not task_waits_on(TaskState.RUNNING, ATTEMPT_ID + 1, ATTEMPT_ID, ATTEMPT_ID)
    assert not task_waits_on(TaskState.RUNNING, None, ATTEMPT_ID + 1, ATTEMPT_ID)
    assert not task_waits_on(TaskState.RUNNING, None, None, ATTEMPT_ID)
    assert not task_waits_on(TaskState.QUEUED, None, ATTEMPT_ID, ATTEMPT_ID)


def test_submit_is_settled_before_judging() -> None:
    """A recognized observation of a job whose submit is unsettled settles it first."""
    assert settles_submit(_A.SUBMITTING, JobState.RUNNING)
    assert settles_submit(_A.SUBMIT_UNKNOWN, JobState.SUCCEEDED)
    assert not settles_submit(_A.ACCEPTED, JobState.RUNNING)


def test_poll_phase_follows_the_attempt() -> None:
    """Queued and throttled poll alike; a terminal attempt is not polled."""
    assert poll_phase_of(_A.PROVIDER_THROTTLED) is PollPhase.QUEUED
    assert poll_phase_of(_A.CANCEL_REQUESTED) is PollPhase.CANCELLING
    assert poll_phase_of(_A.SUCCEEDED) is None


@given(facts_st)
def test_a_terminal_attempt_is_never_moved(facts: ObservationFacts) -> None:
    """Whatever the provider says, an ended attempt stays ended and its task is not touched."""
    if not ATTEMPT_MACHINE.is_terminal(facts.attempt_state):
        return
    verdict = judge(facts)
    assert verdict.move_to is None
    assert verdict.task_move is None
    assert not verdict.fetch_output
    assert verdict.fail_over is None
    assert verdict.outcome in {
        IngestOutcome.NO_CHANGE,
        IngestOutcome.LATE_STORED,
        IngestOutcome.UNRECOGNIZED,
    }


@given(facts_st)
def test_an_adopted_result_is_never_overwritten(facts: ObservationFacts) -> None:
    """A task that adopted another attempt, or no longer waits, is never moved or re-adopted."""
    adopted_other = facts.adopted_attempt_id not in (None, facts.attempt_id)
    past_waiting = facts.task_state not in (TaskState.SUBMITTING, TaskState.RUNNING)
    if not (adopted_other or past_waiting):
        return
    verdict = judge(facts)
    assert verdict.task_move is None
    assert not verdict.fetch_output
    assert verdict.outcome is not IngestOutcome.ADOPTED


@given(facts_st)
def test_every_move_is_forward_along_the_table(facts: ObservationFacts) -> None:
    """A move is the job state's target, allowed by the table and never to a lower phase."""
    verdict = judge(facts)
    if verdict.move_to is None:
        assert verdict.task_move is None
        assert verdict.fail_over is None
        return
    assert verdict.move_to is ATTEMPT_TARGET[facts.job_state]
    assert ATTEMPT_MACHINE.can(facts.attempt_state, verdict.move_to)
    assert ATTEMPT_PHASE[verdict.move_to] >= ATTEMPT_PHASE[facts.attempt_state]
    assert verdict.record


@given(facts_st)
def test_adoption_needs_a_success_the_task_waits_on(facts: ObservationFacts) -> None:
    """Only a SUCCEEDED observation of the attempt the task waits on adopts it."""
    verdict = judge(facts)
    if verdict.task_move is not None and verdict.task_move.adopt:
        assert facts.job_state is JobState.SUCCEEDED
        assert task_waits_on(
            facts.task_state, facts.adopted_attempt_id, facts.latest_attempt_id, facts.attempt_id
        )
        assert verdict.fetch_output
        assert verdict.outcome is IngestOutcome.ADOPTED
    else:
        assert not verdict.fetch_output

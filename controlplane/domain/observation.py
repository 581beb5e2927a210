"""Judging one observation of a provider job (design 9.8.1, 9.18.1, 9.3.4): the rule, no I/O.

The event normalizer (`controlplane.execution.events`) stores every poll, callback and cancel
reply, loads the rows the observation is about and asks `judge` what it means; it then applies the
`ObservationVerdict` in its unit of work. The rule:

- the provider's state names one attempt state (`ATTEMPT_TARGET`); UNRECOGNIZED names none: it is
  stored raw and flagged, never a transition;
- an attempt only moves forward, along the table and never to a lower phase (9.8.1): an older
  observation is STALE and changes nothing;
- a terminal attempt is never moved again: an observation that disagrees with its end is stored
  on the job (LATE_STORED) if the provider calls it terminal, and only then;
- SUCCEEDED adopts the attempt (task -> OUTPUT_FETCHING and an ``output.fetch``) only while the
  task still waits on it (`task_waits_on`): a task that adopted another attempt, or ended, keeps
  what it has, so no late event overwrites an adopted result (9.3.4). A success that beat a
  requested cancel is discarded (task -> CANCELLED) unless the deployment delivers it;
- FAILED, and a CANCELLED nobody asked for, are a definite end of the attempt: the failover
  decision takes the job's own failure; a CANCELLED that was asked for cancels the waiting task.

A submit still SUBMITTING or SUBMIT_UNKNOWN when its job is observed is settled first
(`settles_submit`): the job is recorded, so the provider has it. The normalizer settles it and
judges the settled attempt.

The verdict assumes every compare-and-set it implies holds; when a concurrent writer wins the
attempt move the observation is STALE, and when it wins the adopting task move NOT_ADOPTED.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.domain.polling import PollPhase
from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    ATTEMPT_PHASE,
    SENDING_ATTEMPT_STATES,
    AttemptState,
    TaskState,
)
from vidroute_core.adapter import JobState
from vidroute_core.errors import ErrorClass, ProviderError, make_error

__all__ = [
    "ATTEMPT_TARGET",
    "IngestOutcome",
    "ObservationFacts",
    "ObservationVerdict",
    "TaskMove",
    "judge",
    "poll_phase_of",
    "settles_submit",
    "task_waits_on",
]

_A = AttemptState
ATTEMPT_TARGET: Mapping[JobState, AttemptState] = {
    JobState.QUEUED: _A.PROVIDER_QUEUED,
    JobState.THROTTLED: _A.PROVIDER_THROTTLED,
    JobState.RUNNING: _A.RUNNING,
    JobState.SUCCEEDED: _A.SUCCEEDED,
    JobState.FAILED: _A.FAILED,
    JobState.CANCELLED: _A.CANCELLED,
}
"""The attempt state each recognized provider job state names."""

_POLL_PHASE: Mapping[AttemptState, PollPhase] = {
    _A.ACCEPTED: PollPhase.SUBMITTED,
    _A.PROVIDER_QUEUED: PollPhase.QUEUED,
    _A.PROVIDER_THROTTLED: PollPhase.QUEUED,
    _A.RUNNING: PollPhase.RUNNING,
    _A.CANCEL_REQUESTED: PollPhase.CANCELLING,
}

# A task waits on an attempt only while it is being submitted or run; SCHEDULING/QUEUED tasks
# have let their attempt go (requeued), OUTPUT_FETCHING and the terminal ones have a result.
_WAITING_TASK_STATES = frozenset({TaskState.SUBMITTING, TaskState.RUNNING})


class IngestOutcome(enum.Enum):
    """What one observation did; stored in ``provider_events.outcome``.

    DUPLICATE (the same raw observation seen again) and UNMATCHED (a job we have no row for yet)
    are decided by the normalizer's storage before there is anything to judge."""

    APPLIED = "APPLIED"
    ADOPTED = "ADOPTED"
    NOT_ADOPTED = "NOT_ADOPTED"
    DUPLICATE = "DUPLICATE"
    NO_CHANGE = "NO_CHANGE"
    STALE = "STALE"
    LATE_STORED = "LATE_STORED"
    UNRECOGNIZED = "UNRECOGNIZED"
    UNMATCHED = "UNMATCHED"


@dataclass(frozen=True, slots=True)
class ObservationFacts:
    """The loaded rows' facts one observation is judged on.

    The task facts after `latest_attempt_id` only matter when the provider calls the job
    terminal; the normalizer may leave them at their defaults otherwise."""

    job_state: JobState
    raw_status: str
    attempt_id: int
    attempt_no: int
    attempt_state: AttemptState
    task_state: TaskState
    adopted_attempt_id: int | None = None
    #: The newest attempt of the task (None: the task has none).
    latest_attempt_id: int | None = None
    #: The job's own failure, when the provider gave one.
    failure: ProviderError | None = None
    #: A cancel of this attempt was asked (``attempt_runtime.cancel_requested_at``).
    cancel_requested: bool = False
    #: Deployment policy: a success that beat a requested cancel is still delivered.
    deliver_if_succeeded_during_cancel: bool = False


@dataclass(frozen=True, slots=True)
class TaskMove:
    """A task transition the verdict asks for; `adopt` records the attempt as the task's result."""

    to: TaskState
    reason: str
    adopt: bool = False


@dataclass(frozen=True, slots=True)
class ObservationVerdict:
    """What to do with one observation, assuming every compare-and-set holds.

    `record`: the provider job row takes the observation (raw status, outputs, failure; with the
    normalized status when the attempt moves). `failure`: what the moved attempt records as its
    failure. `fail_over`: the attempt ended definitely; the failover decision takes this error.
    `fetch_output`: enqueue the ``output.fetch`` of the adopted attempt."""

    outcome: IngestOutcome
    move_to: AttemptState | None = None
    record: bool = False
    failure: ProviderError | None = None
    task_move: TaskMove | None = None
    fetch_output: bool = False
    fail_over: ProviderError | None = None


def task_waits_on(
    task_state: TaskState,
    adopted_attempt_id: int | None,
    latest_attempt_id: int | None,
    attempt_id: int,
) -> bool:
    """Whether the task still waits on this attempt: live, latest attempt, none other adopted."""
    if task_state not in _WAITING_TASK_STATES or adopted_attempt_id not in (None, attempt_id):
        return False
    return latest_attempt_id == attempt_id


def settles_submit(attempt_state: AttemptState, job_state: JobState) -> bool:
    """Whether an observation of the recorded job first settles the attempt's submit."""
    return job_state is not JobState.UNRECOGNIZED and attempt_state in SENDING_ATTEMPT_STATES


def poll_phase_of(state: AttemptState) -> PollPhase | None:
    """The polling phase of an attempt in `state`; None where the attempt is not polled."""
    return _POLL_PHASE.get(state)


def judge(facts: ObservationFacts) -> ObservationVerdict:
    """The verdict on one observation of a recorded job (see the module docstring)."""
    state, current = facts.job_state, facts.attempt_state
    if state is JobState.UNRECOGNIZED:
        return ObservationVerdict(IngestOutcome.UNRECOGNIZED, record=True)
    target = ATTEMPT_TARGET[state]
    if ATTEMPT_MACHINE.is_terminal(current):
        if current is target:
            return ObservationVerdict(IngestOutcome.NO_CHANGE)
        return ObservationVerdict(IngestOutcome.LATE_STORED, record=state.terminal)
    if current is target:
        return ObservationVerdict(IngestOutcome.NO_CHANGE, record=True)
    if ATTEMPT_PHASE[target] < ATTEMPT_PHASE[current] or not ATTEMPT_MACHINE.can(current, target):
        return ObservationVerdict(IngestOutcome.STALE)
    if not state.terminal:
        return ObservationVerdict(IngestOutcome.APPLIED, move_to=target, record=True)
    if state is JobState.SUCCEEDED:
        return _succeeded(facts, target)
    if state is JobState.FAILED:
        # The job's own failure replaces any earlier transport error of a recovered submit.
        cause = facts.failure or make_error(
            ErrorClass.INTERNAL_PERMANENT, "PROVIDER_FAILED", facts.raw_status
        )
        return ObservationVerdict(
            IngestOutcome.APPLIED, move_to=target, record=True, failure=cause, fail_over=cause
        )
    return _cancelled(facts, target)


def _waits(facts: ObservationFacts) -> bool:
    return task_waits_on(
        facts.task_state, facts.adopted_attempt_id, facts.latest_attempt_id, facts.attempt_id
    )


def _succeeded(facts: ObservationFacts, target: AttemptState) -> ObservationVerdict:
    if not _waits(facts):
        return ObservationVerdict(IngestOutcome.NOT_ADOPTED, move_to=target, record=True)
    if facts.cancel_requested and not facts.deliver_if_succeeded_during_cancel:
        discard = TaskMove(
            TaskState.CANCELLED, "cancel requested; provider succeeded first (discard)"
        )
        return ObservationVerdict(
            IngestOutcome.NOT_ADOPTED, move_to=target, record=True, task_move=discard
        )
    adopt = TaskMove(TaskState.OUTPUT_FETCHING, f"attempt {facts.attempt_no} succeeded", adopt=True)
    return ObservationVerdict(
        IngestOutcome.ADOPTED, move_to=target, record=True, task_move=adopt, fetch_output=True
    )


def _cancelled(facts: ObservationFacts, target: AttemptState) -> ObservationVerdict:
    applied = ObservationVerdict(IngestOutcome.APPLIED, move_to=target, record=True)
    if not _waits(facts):
        return applied
    if facts.attempt_state is AttemptState.CANCEL_REQUESTED or facts.cancel_requested:
        confirm = TaskMove(TaskState.CANCELLED, "provider confirmed the cancel")
        return ObservationVerdict(
            IngestOutcome.APPLIED, move_to=target, record=True, task_move=confirm
        )
    # Cancelled by the provider on its own: a definite end of this attempt, not ours to hide.
    error = make_error(
        ErrorClass.INTERNAL_PERMANENT, "PROVIDER_CANCELLED", "the provider cancelled the job"
    )
    return ObservationVerdict(IngestOutcome.APPLIED, move_to=target, record=True, fail_over=error)

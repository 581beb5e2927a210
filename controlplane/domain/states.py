"""Task and attempt lifecycles as explicit transition tables (design 9.3.1, 9.8, 9.8.1).

A state change is legal only if the table lists it. Persistence applies every change as a
compare-and-set on ``status_version`` *and* the set of allowed from-states
(``StateMachine.allowed_from``), so an out-of-order update can never move a state backwards or
out of a terminal state, whichever process or event delivers it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

# Re-exported: the exception lives with the domain's other errors so it subclasses DomainError.
from vidroute_core.exceptions import IllegalTransition

__all__ = [
    "ATTEMPT_MACHINE",
    "ATTEMPT_PHASE",
    "IN_FLIGHT_ATTEMPT_STATES",
    "IN_FLIGHT_TASK_STATES",
    "MAYBE_BILLED_ATTEMPT_STATES",
    "NOT_SENT_ATTEMPT_STATES",
    "POLLABLE_ATTEMPT_STATES",
    "SENDING_ATTEMPT_STATES",
    "TASK_MACHINE",
    "AttemptState",
    "IllegalTransition",
    "StateMachine",
    "TaskState",
]


class TaskState(enum.Enum):
    """The user's business goal (design 9.3.1, plus OUTPUT_FETCHING from 9.22)."""

    QUEUED = "QUEUED"
    SCHEDULING = "SCHEDULING"
    SUBMITTING = "SUBMITTING"
    RUNNING = "RUNNING"
    OUTPUT_FETCHING = "OUTPUT_FETCHING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class AttemptState(enum.Enum):
    """One immutable execution plan against one provider account and model (design 9.8)."""

    CREATED = "CREATED"
    RESERVING = "RESERVING"
    READY_TO_SUBMIT = "READY_TO_SUBMIT"
    SUBMITTING = "SUBMITTING"
    SUBMIT_UNKNOWN = "SUBMIT_UNKNOWN"
    ACCEPTED = "ACCEPTED"
    PROVIDER_QUEUED = "PROVIDER_QUEUED"
    PROVIDER_THROTTLED = "PROVIDER_THROTTLED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    CANCELLED = "CANCELLED"
    ABANDONED = "ABANDONED"


S = TypeVar("S", TaskState, AttemptState)


@dataclass(frozen=True)
class StateMachine(Generic[S]):
    """A transition table with its terminal states."""

    name: str
    transitions: Mapping[S, frozenset[S]]
    terminal: frozenset[S]

    def can(self, current: S, target: S) -> bool:
        """Whether `current -> target` is in the table (self-transitions never are)."""
        return target in self.transitions.get(current, frozenset())

    def check(self, current: S, target: S) -> None:
        """Raise `IllegalTransition` unless `current -> target` is allowed."""
        if not self.can(current, target):
            raise IllegalTransition(current, target)

    def allowed_from(self, target: S) -> frozenset[S]:
        """Every state from which `target` may be entered: the CAS guard of 9.8.1."""
        return frozenset(s for s, targets in self.transitions.items() if target in targets)

    def is_terminal(self, state: S) -> bool:
        """Whether `state` is final: no transition leaves it."""
        return state in self.terminal


_T = TaskState
TASK_MACHINE: StateMachine[TaskState] = StateMachine(
    name="task",
    transitions={
        _T.QUEUED: frozenset({_T.SCHEDULING, _T.FAILED, _T.CANCELLED}),
        # SCHEDULING -> QUEUED: no capacity anywhere keeps the task queued, never failed.
        _T.SCHEDULING: frozenset({_T.QUEUED, _T.SUBMITTING, _T.FAILED, _T.CANCELLED}),
        # SUBMITTING -> SCHEDULING: the attempt was certainly not accepted; fail over.
        _T.SUBMITTING: frozenset(
            {_T.RUNNING, _T.OUTPUT_FETCHING, _T.SCHEDULING, _T.QUEUED, _T.FAILED, _T.CANCELLED}
        ),
        _T.RUNNING: frozenset({_T.OUTPUT_FETCHING, _T.SCHEDULING, _T.FAILED, _T.CANCELLED}),
        _T.OUTPUT_FETCHING: frozenset({_T.SUCCEEDED, _T.FAILED, _T.CANCELLED}),
        _T.SUCCEEDED: frozenset(),
        _T.FAILED: frozenset(),
        _T.CANCELLED: frozenset(),
    },
    terminal=frozenset({_T.SUCCEEDED, _T.FAILED, _T.CANCELLED}),
)

_A = AttemptState
_PROVIDER_LIVE = frozenset({_A.PROVIDER_QUEUED, _A.PROVIDER_THROTTLED, _A.RUNNING})
_PROVIDER_END = frozenset({_A.SUCCEEDED, _A.FAILED, _A.CANCELLED})
ATTEMPT_MACHINE: StateMachine[AttemptState] = StateMachine(
    name="attempt",
    transitions={
        _A.CREATED: frozenset({_A.RESERVING, _A.READY_TO_SUBMIT, _A.FAILED, _A.CANCELLED}),
        _A.RESERVING: frozenset({_A.READY_TO_SUBMIT, _A.FAILED, _A.CANCELLED}),
        _A.READY_TO_SUBMIT: frozenset({_A.SUBMITTING, _A.FAILED, _A.CANCELLED}),
        # SUBMITTING -> READY_TO_SUBMIT only after a definite REJECTED (retry, same key).
        _A.SUBMITTING: frozenset(
            {_A.SUBMIT_UNKNOWN, _A.ACCEPTED, _A.READY_TO_SUBMIT, _A.CANCEL_REQUESTED}
            | _PROVIDER_LIVE
            | _PROVIDER_END
        ),
        # Recovery either finds the job (ACCEPTED or later), proves it absent (READY_TO_SUBMIT
        # or FAILED), or gives up (ABANDONED, still reconciled in the background).
        _A.SUBMIT_UNKNOWN: frozenset(
            {_A.ACCEPTED, _A.READY_TO_SUBMIT, _A.ABANDONED, _A.CANCEL_REQUESTED}
            | _PROVIDER_LIVE
            | _PROVIDER_END
        ),
        # -> ABANDONED: the provider stopped knowing the job we hold (polls NOT_FOUND for
        # job_not_found_abandon_after_s); a lost job, never a fail-over by itself.
        _A.ACCEPTED: frozenset(
            {_A.CANCEL_REQUESTED, _A.ABANDONED} | _PROVIDER_LIVE | _PROVIDER_END
        ),
        # Queued and throttled share one phase (40): the provider may move between them.
        _A.PROVIDER_QUEUED: frozenset(
            {_A.PROVIDER_THROTTLED, _A.RUNNING, _A.CANCEL_REQUESTED, _A.ABANDONED} | _PROVIDER_END
        ),
        _A.PROVIDER_THROTTLED: frozenset(
            {_A.PROVIDER_QUEUED, _A.RUNNING, _A.CANCEL_REQUESTED, _A.ABANDONED} | _PROVIDER_END
        ),
        _A.RUNNING: frozenset({_A.CANCEL_REQUESTED, _A.ABANDONED} | _PROVIDER_END),
        # A cancel is a request, not a fact (9.18.3): the provider's real terminal state wins.
        _A.CANCEL_REQUESTED: _PROVIDER_END,
        _A.SUCCEEDED: frozenset(),
        _A.FAILED: frozenset(),
        _A.CANCELLED: frozenset(),
        _A.ABANDONED: frozenset(),
    },
    terminal=frozenset({_A.SUCCEEDED, _A.FAILED, _A.CANCELLED, _A.ABANDONED}),
)

# Phase numbers of 9.8.1, used to order provider observations; never the only guard. Along the
# table the phase rises on every edge except queued <-> throttled (equal) and the two rewinds to
# READY_TO_SUBMIT from SUBMITTING / SUBMIT_UNKNOWN once the provider provably has no job.
ATTEMPT_PHASE: Mapping[AttemptState, int] = {
    _A.CREATED: 10,
    _A.RESERVING: 12,
    _A.READY_TO_SUBMIT: 15,
    _A.SUBMITTING: 20,
    _A.SUBMIT_UNKNOWN: 25,
    _A.ACCEPTED: 30,
    _A.PROVIDER_QUEUED: 40,
    _A.PROVIDER_THROTTLED: 40,
    _A.RUNNING: 50,
    _A.CANCEL_REQUESTED: 60,
    _A.SUCCEEDED: 100,
    _A.FAILED: 100,
    _A.CANCELLED: 100,
    _A.ABANDONED: 100,
}

# Attempts that hold provider capacity (design 9.11.2): the lease reconciler counts these.
IN_FLIGHT_ATTEMPT_STATES: frozenset[AttemptState] = frozenset(
    {
        _A.SUBMITTING,
        _A.SUBMIT_UNKNOWN,
        _A.ACCEPTED,
        _A.PROVIDER_QUEUED,
        _A.PROVIDER_THROTTLED,
        _A.RUNNING,
        _A.CANCEL_REQUESTED,
    }
)

# Attempts nothing has been sent for yet: cancelling one needs no provider call, and only these
# may be the first state a new attempt is written in.
NOT_SENT_ATTEMPT_STATES: frozenset[AttemptState] = frozenset(
    {_A.CREATED, _A.RESERVING, _A.READY_TO_SUBMIT}
)

# Attempts whose request may be with the provider and whose fate is not yet known: a cancel has
# to wait for the submit to settle, an observation may settle it.
SENDING_ATTEMPT_STATES: frozenset[AttemptState] = frozenset({_A.SUBMITTING, _A.SUBMIT_UNKNOWN})

# Attempts that ended (or stayed) without our knowing whether the provider holds a job: the
# provider may have billed one.
MAYBE_BILLED_ATTEMPT_STATES: frozenset[AttemptState] = frozenset({_A.ABANDONED, _A.SUBMIT_UNKNOWN})

# Attempts whose provider job exists and may still change: the poller asks the provider of these.
POLLABLE_ATTEMPT_STATES: frozenset[AttemptState] = frozenset(
    {_A.ACCEPTED, _A.PROVIDER_QUEUED, _A.PROVIDER_THROTTLED, _A.RUNNING, _A.CANCEL_REQUESTED}
)

# Tasks being dispatched or run: what a tenant's in-flight cap (9.12.1) counts.
IN_FLIGHT_TASK_STATES: tuple[TaskState, ...] = (
    _T.SCHEDULING,
    _T.SUBMITTING,
    _T.RUNNING,
    _T.OUTPUT_FETCHING,
)

"""The task and attempt transition tables, and the compare-and-set protocol that applies them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from controlplane.domain.states import (
    ATTEMPT_MACHINE,
    ATTEMPT_PHASE,
    IN_FLIGHT_ATTEMPT_STATES,
    IN_FLIGHT_TASK_STATES,
    NOT_SENT_ATTEMPT_STATES,
    POLLABLE_ATTEMPT_STATES,
    SENDING_ATTEMPT_STATES,
    TASK_MACHINE,
    AttemptState,
    IllegalTransition,
    StateMachine,
    TaskState,
)
from tests.support.sizes import examples
from vidroute_core.exceptions import DomainError

# The tables restated from design 9.3.1 / 9.8 / 9.8.1 / 9.17 / 9.18.3, independently of the code.
_TASK_EDGES = """
QUEUED -> SCHEDULING FAILED CANCELLED
SCHEDULING -> QUEUED SUBMITTING FAILED CANCELLED
SUBMITTING -> RUNNING OUTPUT_FETCHING SCHEDULING QUEUED FAILED CANCELLED
RUNNING -> OUTPUT_FETCHING SCHEDULING FAILED CANCELLED
OUTPUT_FETCHING -> SUCCEEDED FAILED CANCELLED
"""
_LIVE = "PROVIDER_QUEUED PROVIDER_THROTTLED RUNNING"
_END = "SUCCEEDED FAILED CANCELLED"
_ATTEMPT_EDGES = f"""
CREATED -> RESERVING READY_TO_SUBMIT FAILED CANCELLED
RESERVING -> READY_TO_SUBMIT FAILED CANCELLED
READY_TO_SUBMIT -> SUBMITTING FAILED CANCELLED
SUBMITTING -> SUBMIT_UNKNOWN ACCEPTED READY_TO_SUBMIT CANCEL_REQUESTED {_LIVE} {_END}
SUBMIT_UNKNOWN -> ACCEPTED READY_TO_SUBMIT ABANDONED CANCEL_REQUESTED {_LIVE} {_END}
ACCEPTED -> CANCEL_REQUESTED ABANDONED {_LIVE} {_END}
PROVIDER_QUEUED -> PROVIDER_THROTTLED RUNNING CANCEL_REQUESTED ABANDONED {_END}
PROVIDER_THROTTLED -> PROVIDER_QUEUED RUNNING CANCEL_REQUESTED ABANDONED {_END}
RUNNING -> CANCEL_REQUESTED ABANDONED {_END}
CANCEL_REQUESTED -> {_END}
"""


def _edges(text: str, states: Any) -> frozenset[tuple[Any, Any]]:
    edges: set[tuple[Any, Any]] = set()
    for line in text.strip().splitlines():
        source, targets = line.split("->")
        edges.update((states[source.strip()], states[t]) for t in targets.split())
    return frozenset(edges)


TASK_EDGES = _edges(_TASK_EDGES, TaskState)
ATTEMPT_EDGES = _edges(_ATTEMPT_EDGES, AttemptState)
CASES: list[tuple[StateMachine[Any], frozenset[tuple[Any, Any]]]] = [
    (TASK_MACHINE, TASK_EDGES),
    (ATTEMPT_MACHINE, ATTEMPT_EDGES),
]
ALL_PAIRS = [
    pytest.param(machine, a, b, (a, b) in edges, id=f"{machine.name}:{a.value}->{b.value}")
    for machine, edges in CASES
    for a, b in itertools.product(list(machine.transitions), repeat=2)
]
# Attempt edges along which the phase does not rise: queued <-> throttled share phase 40, and a
# submission proven not accepted returns to READY_TO_SUBMIT to be sent again with the same key.
PHASE_EQUAL = {
    (AttemptState.PROVIDER_QUEUED, AttemptState.PROVIDER_THROTTLED),
    (AttemptState.PROVIDER_THROTTLED, AttemptState.PROVIDER_QUEUED),
}
PHASE_REWIND = {
    (AttemptState.SUBMITTING, AttemptState.READY_TO_SUBMIT),
    (AttemptState.SUBMIT_UNKNOWN, AttemptState.READY_TO_SUBMIT),
}


@pytest.mark.parametrize(("machine", "current", "target", "allowed"), ALL_PAIRS)
def test_transition_allowed_iff_listed(
    machine: StateMachine[Any], current: Any, target: Any, allowed: bool
) -> None:
    """A transition is allowed exactly when the design's table lists it; others raise."""
    assert machine.can(current, target) is allowed
    if allowed:
        machine.check(current, target)
    else:
        with pytest.raises(IllegalTransition) as excinfo:
            machine.check(current, target)
        assert (excinfo.value.current, excinfo.value.target) == (current, target)


def test_illegal_transition_is_a_domain_error() -> None:
    """IllegalTransition sits under DomainError so one interceptor maps it."""
    assert issubclass(IllegalTransition, DomainError)


@pytest.mark.parametrize(("machine", "edges"), CASES, ids=["task", "attempt"])
def test_terminal_states_have_no_exits(machine: StateMachine[Any], edges: frozenset[Any]) -> None:
    """The terminal states are exactly those with no outgoing transition."""
    states = {s for edge in edges for s in edge}
    assert machine.terminal == {s for s in states if not machine.transitions.get(s)}
    assert set(machine.transitions) == states
    for state in states:
        assert machine.is_terminal(state) is (state in machine.terminal)


@pytest.mark.parametrize(("machine", "edges"), CASES, ids=["task", "attempt"])
def test_allowed_from_is_inverse_of_table(
    machine: StateMachine[Any], edges: frozenset[Any]
) -> None:
    """allowed_from(target) is exactly the set of states with an edge into target."""
    for target in machine.transitions:
        assert machine.allowed_from(target) == {a for a, b in edges if b == target}


@pytest.mark.parametrize(
    ("machine", "start"),
    [(TASK_MACHINE, TaskState.QUEUED), (ATTEMPT_MACHINE, AttemptState.CREATED)],
    ids=["task", "attempt"],
)
def test_every_state_reachable_and_can_finish(machine: StateMachine[Any], start: Any) -> None:
    """Every state is reachable from the initial one, and every state can reach a terminal."""
    assert _reachable(machine, [start]) == set(machine.transitions)
    for state in machine.transitions:
        assert _reachable(machine, [state]) & machine.terminal


def _reachable(machine: StateMachine[Any], frontier: Iterable[Any]) -> set[Any]:
    seen = set(frontier)
    todo = list(seen)
    while todo:
        for nxt in machine.transitions[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_attempt_phase_rises_except_documented_edges() -> None:
    """Attempt phase rises on every edge except queued<->throttled and the not-accepted rewinds."""
    assert set(ATTEMPT_PHASE) == set(AttemptState)
    equal = {(a, b) for a, b in ATTEMPT_EDGES if ATTEMPT_PHASE[b] == ATTEMPT_PHASE[a]}
    lower = {(a, b) for a, b in ATTEMPT_EDGES if ATTEMPT_PHASE[b] < ATTEMPT_PHASE[a]}
    assert equal == PHASE_EQUAL
    assert lower == PHASE_REWIND
    assert all(ATTEMPT_PHASE[s] == 100 for s in ATTEMPT_MACHINE.terminal)


def test_in_flight_states_are_submitted_and_unfinished() -> None:
    """Attempts hold provider capacity from SUBMITTING until they reach a terminal state."""
    submitted = {s for s in AttemptState if ATTEMPT_PHASE[s] >= 20}
    assert submitted - ATTEMPT_MACHINE.terminal == IN_FLIGHT_ATTEMPT_STATES


@given(st.permutations(["PROVIDER_QUEUED", "RUNNING", "SUCCEEDED"]))
def test_out_of_order_observations_never_regress(order: list[str]) -> None:
    """Provider observations applied in any order by CAS never move an attempt backwards (9.8.1)."""
    row = _Row(AttemptState.ACCEPTED)
    for name in order:
        row.cas(ATTEMPT_MACHINE, row.version, AttemptState[name])
    phases = [ATTEMPT_PHASE[s] for s in row.history]
    assert phases == sorted(phases)
    assert row.state is AttemptState.SUCCEEDED


@dataclass
class _Row:
    """A simulated task or attempt row updated like the SQL of 9.8.1."""

    state: Any
    version: int = 0
    history: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.history.append(self.state)

    def cas(self, machine: StateMachine[Any], expected_version: int, target: Any) -> bool:
        """UPDATE ... WHERE status_version = $v AND status = ANY($allowed_from)."""
        if self.version != expected_version or self.state not in machine.allowed_from(target):
            return False
        self.state, self.version = target, self.version + 1
        self.history.append(target)
        return True


class _ConcurrentWriters(RuleBasedStateMachine):
    """Writers hold possibly stale snapshots and race compare-and-set updates on one row."""

    machine: StateMachine[Any]
    initial: Any
    WRITERS = 4

    @initialize()
    def start(self) -> None:
        self.row = _Row(self.initial)
        self.snapshots = [(self.row.state, self.row.version)] * self.WRITERS
        self.applied: list[tuple[Any, Any, int]] = []

    @rule(writer=st.integers(0, WRITERS - 1))
    def read(self, writer: int) -> None:
        self.snapshots[writer] = (self.row.state, self.row.version)

    @rule(writer=st.integers(0, WRITERS - 1), data=st.data())
    def write(self, writer: int, data: st.DataObject) -> None:
        seen_state, seen_version = self.snapshots[writer]
        # Often a move that was legal from what the writer saw (it may be stale); else anything.
        legal = sorted(self.machine.transitions[seen_state], key=lambda s: s.value)
        options = st.sampled_from(sorted(self.machine.transitions, key=lambda s: s.value))
        target = data.draw(st.sampled_from(legal) | options if legal else options)
        before = self.row.state
        if self.row.cas(self.machine, seen_version, target):
            assert (seen_state, seen_version) == (before, self.row.version - 1)
            self.applied.append((before, target, self.row.version))

    @precondition(lambda self: hasattr(self, "row"))
    @invariant()
    def only_table_moves_and_terminal_is_final(self) -> None:
        history = self.row.history
        assert self.row.version == len(history) - 1
        for before, after in itertools.pairwise(history):
            assert self.machine.can(before, after)
            assert not self.machine.is_terminal(before)
        if self.machine is ATTEMPT_MACHINE:
            for before, after in itertools.pairwise(history):
                rewind = (before, after) in PHASE_REWIND
                assert rewind or ATTEMPT_PHASE[after] >= ATTEMPT_PHASE[before]


class TaskWriters(_ConcurrentWriters):
    machine = TASK_MACHINE
    initial = TaskState.QUEUED


class AttemptWriters(_ConcurrentWriters):
    machine = ATTEMPT_MACHINE
    initial = AttemptState.CREATED


TaskWriters.TestCase.settings = settings(
    max_examples=examples(50, long=150), stateful_step_count=40, deadline=None
)
AttemptWriters.TestCase.settings = settings(
    max_examples=examples(50, long=150), stateful_step_count=40, deadline=None
)
TestTaskWriters = TaskWriters.TestCase
TestAttemptWriters = AttemptWriters.TestCase
TestTaskWriters.__doc__ = (
    "Racing CAS writers only ever apply table edges to a task and never leave a terminal state."
)
TestAttemptWriters.__doc__ = (
    "Racing CAS writers never move an attempt to a lower phase (except documented rewinds) "
    "nor out of a terminal state."
)


def test_attempt_state_sets_partition_the_live_states_by_what_the_provider_has() -> None:
    """Not sent, sending and pollable attempts are the live states, each in exactly one set,
    ordered by phase: nothing sent precedes SUBMITTING, every pollable one has a provider job."""
    sending = SENDING_ATTEMPT_STATES
    live = {s for s in AttemptState if not ATTEMPT_MACHINE.is_terminal(s)}
    assert NOT_SENT_ATTEMPT_STATES | sending | POLLABLE_ATTEMPT_STATES == live
    assert not NOT_SENT_ATTEMPT_STATES & (sending | POLLABLE_ATTEMPT_STATES)
    assert not sending & POLLABLE_ATTEMPT_STATES
    assert sending | POLLABLE_ATTEMPT_STATES == IN_FLIGHT_ATTEMPT_STATES
    submitting = ATTEMPT_PHASE[AttemptState.SUBMITTING]
    assert all(ATTEMPT_PHASE[s] < submitting for s in NOT_SENT_ATTEMPT_STATES)
    assert all(
        ATTEMPT_PHASE[s] > ATTEMPT_PHASE[AttemptState.SUBMIT_UNKNOWN]
        for s in POLLABLE_ATTEMPT_STATES
    )


def test_in_flight_tasks_are_the_live_states_past_the_queue() -> None:
    """A tenant's in-flight cap counts every live task state except QUEUED."""
    live = {s for s in TaskState if not TASK_MACHINE.is_terminal(s)}
    assert set(IN_FLIGHT_TASK_STATES) == live - {TaskState.QUEUED}

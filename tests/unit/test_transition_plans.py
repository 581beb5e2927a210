"""The bulk transition's plan asks the state machine for every edge (issue 22): whatever the
start state and steps, `transitions.planned` returns a plan only when `TASK_MACHINE` lists every
edge, and the plan's states, versions and event payloads are the single path's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain.states import TASK_MACHINE, IllegalTransition, TaskState
from controlplane.persistence import _sql
from controlplane.persistence.transitions import TaskMove, TaskStep, planned
from tests.support.sizes import examples

steps = st.lists(
    st.builds(TaskStep, st.sampled_from(TaskState), st.sampled_from(["", "dispatch", "why"])),
    min_size=1,
    max_size=6,
).map(tuple)


@settings(max_examples=examples(300, long=2_000))
@given(start=st.sampled_from(TaskState), version=st.integers(0, 1_000), path=steps)
def test_a_plan_exists_only_along_the_table(
    start: TaskState, version: int, path: tuple[TaskStep, ...]
) -> None:
    """A move with any forbidden edge raises `IllegalTransition`; an allowed one yields each
    step's state, the next version and the payload the single path writes."""
    edges = list(
        zip((start, *(s.target for s in path[:-1])), (s.target for s in path), strict=True)
    )
    allowed = all(TASK_MACHINE.can(a, b) for a, b in edges)
    move = TaskMove(7, start, version, path)
    try:
        plan = planned(move)
    except IllegalTransition:
        assert not allowed
        return
    assert allowed
    assert [(s, v) for s, v, _ in plan] == [
        (step.target, version + i + 1) for i, step in enumerate(path)
    ]
    assert [p for _, _, p in plan] == [
        _sql.state_payload(step.target, version + i + 1, step.reason) for i, step in enumerate(path)
    ]


def test_a_move_without_steps_is_refused() -> None:
    """A move must name at least one step: an empty one is a caller's bug, not a no-op."""
    with pytest.raises(ValueError, match="at least one step"):
        planned(TaskMove(7, TaskState.QUEUED, 0, ()))

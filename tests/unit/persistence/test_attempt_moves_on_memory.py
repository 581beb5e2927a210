"""The in-memory fake's bulk attempt move keeps the real one's rules (issue 22): whatever batch
of moves it is given, it writes nothing when `ATTEMPT_MACHINE` forbids any of them, and
otherwise moves exactly the attempts whose compare-and-set holds, as `move_attempt` would
one by one (the SQL paths are compared row for row in
tests/integration/persistence/test_attempt_transition_paths.py)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.domain.states import ATTEMPT_MACHINE, AttemptState, IllegalTransition, TaskState
from controlplane.persistence.memory import MemoryDatabase
from controlplane.persistence.transitions import AttemptMove
from tests.support.memory_deps import NOW, SPEC
from tests.support.sizes import examples

# (state the attempt is in, target asked, whether the mover read a stale version)
moves = st.lists(
    st.tuples(st.sampled_from(AttemptState), st.sampled_from(AttemptState), st.booleans()),
    min_size=1,
    max_size=6,
)


async def _run(batch: list[tuple[AttemptState, AttemptState, bool]]) -> None:
    mem = MemoryDatabase()
    account = mem.add_account("runway")
    attempts = [
        mem.add_attempt(mem.add_task(SPEC, TaskState.SUBMITTING), account, state)
        for state, _, _ in batch
    ]
    asked = [
        AttemptMove(a.id, a.state, a.status_version + int(stale), target, "why")
        for a, (_, target, stale) in zip(attempts, batch, strict=True)
    ]
    allowed = all(ATTEMPT_MACHINE.can(state, target) for state, target, _ in batch)
    async with mem.unit(NOW) as u:
        try:
            moved = await u.move_attempts(asked)
        except IllegalTransition:
            assert not allowed
            moved = {}
        else:
            assert allowed
        after = [await u.attempt(a.id) for a in attempts]
    expected = {a.id for a, (_, _, stale) in zip(attempts, batch, strict=True) if not stale}
    assert set(moved) == (expected if allowed else set())
    for a, now, (state, target, _) in zip(attempts, after, batch, strict=True):
        assert now is not None
        assert now.state is (target if a.id in moved else state)
        assert now.status_version == a.status_version + (a.id in moved)
    events = [e for e in mem.task_events if e.kind == "attempt.state_changed"]
    assert len(events) == len(moved)


@settings(max_examples=examples(200, long=2_000))
@given(batch=moves)
def test_a_bulk_move_writes_only_what_the_table_allows(
    batch: list[tuple[AttemptState, AttemptState, bool]],
) -> None:
    """A batch with a forbidden edge raises `IllegalTransition` and moves nothing; an allowed
    one moves each attempt read at its current version to its target, one event each."""
    asyncio.run(_run(batch))

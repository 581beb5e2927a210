"""`GroupCommit`: writes that arrive one by one share units under load, never wait when quiet,
and a failed group is written item by item."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from controlplane.execution.group_commit import GroupCommit

pytestmark = pytest.mark.asyncio


async def _turns() -> None:
    """Let every ready task run (the writers queue, their units start) before going on."""
    for _ in range(5):
        await asyncio.sleep(0)


class Units:
    """A fake store: each group call is one unit; `gate` holds a unit open until set."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.ones: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.bad: set[int] = set()

    async def group(self, items: Sequence[int]) -> list[int]:
        self.groups.append(list(items))
        await self.gate.wait()
        if self.bad & set(items):
            raise RuntimeError("unit failed")
        return [i * 10 for i in items]

    async def one(self, item: int) -> int:
        self.ones.append(item)
        if item in self.bad:
            raise ValueError(f"bad {item}")
        return item * 10


async def test_a_lone_write_goes_out_at_once_in_its_own_unit() -> None:
    """With nothing in flight, a write does not wait for company."""
    units = Units()
    commit = GroupCommit(units.group, units.one, max_group=32, max_in_flight=1)
    assert await asyncio.wait_for(commit.write(7), timeout=5) == 70
    assert units.groups == [[7]]


async def test_writes_arriving_during_an_open_unit_share_the_next_one() -> None:
    """While the one allowed unit is open, arrivals queue and go out together, in order, each
    caller getting its own result."""
    units = Units()
    units.gate.clear()
    commit = GroupCommit(units.group, units.one, max_group=32, max_in_flight=1)
    first = asyncio.create_task(commit.write(1))
    await _turns()
    rest = [asyncio.create_task(commit.write(i)) for i in range(2, 7)]
    await _turns()
    units.gate.set()
    results = await asyncio.wait_for(asyncio.gather(first, *rest), timeout=5)
    assert results == [10, 20, 30, 40, 50, 60]
    assert units.groups == [[1], [2, 3, 4, 5, 6]]
    assert commit.units == 2


async def test_groups_are_bounded_and_units_overlap_up_to_the_limit() -> None:
    """At most `max_group` writes a unit, at most `max_in_flight` units open at once."""
    units = Units()
    units.gate.clear()
    commit = GroupCommit(units.group, units.one, max_group=3, max_in_flight=2)
    tasks = [asyncio.create_task(commit.write(i)) for i in range(8)]
    await _turns()
    # The first two arrivals each opened a unit at once; the other six wait for room.
    assert units.groups == [[0], [1]]
    units.gate.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), timeout=5) == [i * 10 for i in range(8)]
    assert units.groups == [[0], [1], [2, 3, 4], [5, 6, 7]]


async def test_a_failed_group_is_written_item_by_item_and_only_the_bad_item_fails() -> None:
    """The group's unit committed nothing; each item is then written alone, and only the item
    that fails alone sees an error."""
    units = Units()
    units.gate.clear()
    units.bad = {3}
    commit = GroupCommit(units.group, units.one, max_group=8, max_in_flight=1)
    lone = asyncio.create_task(commit.write(1))
    await _turns()
    grouped = [asyncio.create_task(commit.write(i)) for i in (2, 3, 4)]
    await _turns()
    units.gate.set()
    results = await asyncio.wait_for(
        asyncio.gather(lone, *grouped, return_exceptions=True), timeout=5
    )
    assert results[0] == 10
    assert results[1] == 20
    assert results[3] == 40
    assert isinstance(results[2], ValueError)
    assert units.ones == [2, 3, 4]
    assert commit.fallbacks == 1


async def test_a_group_of_one_that_fails_is_not_written_twice() -> None:
    """A lone write's error is its unit's: it is not tried again alone."""
    units = Units()
    units.bad = {5}
    commit = GroupCommit(units.group, units.one, max_group=8, max_in_flight=1)
    with pytest.raises(RuntimeError, match="unit failed"):
        await asyncio.wait_for(commit.write(5), timeout=5)
    assert units.ones == []


async def test_a_cancelled_caller_leaves_the_shared_unit_to_commit_the_others() -> None:
    """Cancelling one caller does not cancel the unit its write shares with others."""
    units = Units()
    units.gate.clear()
    commit = GroupCommit(units.group, units.one, max_group=8, max_in_flight=1)
    blocker = asyncio.create_task(commit.write(0))
    await _turns()
    a, b = asyncio.create_task(commit.write(1)), asyncio.create_task(commit.write(2))
    await _turns()
    a.cancel()
    units.gate.set()
    assert list(await asyncio.wait_for(asyncio.gather(blocker, b), timeout=5)) == [0, 20]
    assert units.groups == [[0], [1, 2]]

"""`run_batch` (a claimed batch's items side by side, bounded, one key's items in order),
`GroupWrites` (their writes in groups as they come) and `each_alone` (a failed group's items
written one by one)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from controlplane.execution.batching import GroupWrites, each_alone, run_batch
from controlplane.persistence.errors import StoreUnavailable

pytestmark = pytest.mark.asyncio


async def test_distinct_keys_overlap_up_to_the_limit_and_one_keys_items_never_do() -> None:
    running: dict[str, int] = {}
    peak = 0
    active = 0
    order: list[tuple[str, int]] = []
    release = asyncio.Event()

    async def handle(item: tuple[str, int]) -> None:
        nonlocal peak, active
        key = item[0]
        running[key] = running.get(key, 0) + 1
        assert running[key] == 1, f"two items of {key} at once"
        active += 1
        peak = max(peak, active)
        if active >= 3:
            release.set()
        await release.wait()
        order.append(item)
        active -= 1
        running[key] -= 1

    items = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("d", 1), ("a", 3), ("e", 1)]
    await asyncio.wait_for(run_batch(items, handle, key=lambda i: i[0], limit=3), timeout=10)
    assert peak == 3  # bounded by the limit, and really concurrent
    assert sorted(order) == sorted(items)
    assert [n for k, n in order if k == "a"] == [1, 2, 3]  # one key's items in claim order


async def test_every_item_is_tried_and_the_first_failure_raised_after() -> None:
    done: list[int] = []

    async def handle(item: int) -> None:
        if item in (2, 4):
            raise ValueError(f"item {item}")
        done.append(item)

    with pytest.raises(ValueError, match="item"):
        await run_batch(range(6), handle, key=lambda i: i, limit=4)
    assert sorted(done) == [0, 1, 3, 5]
    with pytest.raises(ValueError, match="item 2"):
        await run_batch(range(6), handle, key=lambda i: i, limit=1)  # sequential path


async def test_group_writes_go_out_at_once_then_together_as_they_come() -> None:
    """The first item is written alone at once; the items put while that write is in flight
    go together in the next; each caller gets its own item's answer."""
    release = asyncio.Event()
    groups: list[list[int]] = []

    async def write(items: list[int]) -> list[int | Exception]:
        groups.append(items)
        if len(groups) == 1:
            await release.wait()  # the first write is in flight while the others are put
        return [i * 10 for i in items]

    writes: GroupWrites[int, int] = GroupWrites(write, units=1)
    first = writes.put(1)
    await asyncio.sleep(0)  # the writer takes item 1
    rest = [writes.put(i) for i in (2, 3, 4)]
    assert writes.waiting == 4
    release.set()
    await writes.wait()
    assert groups == [[1], [2, 3, 4]]
    assert [first.result(), *(f.result() for f in rest)] == [10, 20, 30, 40]
    assert writes.waiting == 0


async def test_group_writes_raise_only_the_refused_items_error() -> None:
    """An item the write refuses gets its exception; the others of its group their results;
    `wait` raises the first error once every item is answered."""

    async def write(items: list[int]) -> list[int | Exception]:
        return [ValueError(f"bad {i}") if i == 2 else i for i in items]

    writes: GroupWrites[int, int] = GroupWrites(write, units=2)
    futures = [writes.put(i) for i in (1, 2, 3)]
    with pytest.raises(ValueError, match="bad 2"):
        await writes.wait()
    assert futures[0].result() == 1
    assert futures[2].result() == 3
    with pytest.raises(ValueError, match="bad 2"):
        futures[1].result()
    assert await writes.submit(5) == 5


async def test_group_writes_share_out_items_over_units() -> None:
    """With two units, a second item put while the first write is open goes out at once in
    the second unit, not after the first."""
    open_writes = 0
    most = 0
    release = asyncio.Event()

    async def write(items: list[int]) -> list[int | Exception]:
        nonlocal open_writes, most
        open_writes += 1
        most = max(most, open_writes)
        await release.wait()
        open_writes -= 1
        return list(items)

    writes: GroupWrites[int, int] = GroupWrites(write, units=2)
    writes.put(1)
    await asyncio.sleep(0)  # the first unit takes item 1 and stays open
    writes.put(2)
    for _ in range(3):
        await asyncio.sleep(0)
    assert open_writes == 2
    release.set()
    await writes.wait()
    assert most == 2


async def test_a_group_that_failed_is_written_each_alone_unless_the_store_is_down() -> None:
    """`each_alone`: after a group's unit raised, each item is written alone (the bad one alone
    refused, the others written); with the store down, or a group of one, every item is refused
    with the group's error and nothing is written again."""
    written: list[Sequence[int]] = []

    async def write(items: Sequence[int]) -> list[str | Exception]:
        written.append(items)
        return [ValueError(f"bad {i}") if i == 2 else f"ok {i}" for i in items]

    group_error = ValueError("the group's unit raised")
    got = await each_alone(group_error, [1, 2, 3], write, "items")
    assert written == [[1], [2], [3]]
    assert [str(r) for r in got] == ["ok 1", "bad 2", "ok 3"]

    written.clear()
    down = StoreUnavailable("connection refused")
    assert await each_alone(down, [1, 2, 3], write, "items") == [down] * 3
    assert await each_alone(group_error, [1], write, "items") == [group_error]
    assert written == []

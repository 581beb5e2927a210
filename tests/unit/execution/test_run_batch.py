"""`run_batch`: a claimed batch's items side by side, bounded, one key's items in order."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.execution.batching import run_batch

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

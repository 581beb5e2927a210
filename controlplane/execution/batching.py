"""Handling a claimed batch concurrently (design 9.20): one claim per batch, then the items of
the batch run side by side, at most `ExecutionConfig.concurrency` at once, so a batch costs
about one sidecar round trip instead of one per item.

Items that share a key (the same attempt) run one after another, in claim order, never side by
side: two messages of one attempt in one batch are handled exactly as two batches would handle
them. Every item is tried even when another fails; the first failure is raised afterwards (the
engine logs it and the failed item's claim expires, as before).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TypeVar

__all__ = ["run_batch"]

T = TypeVar("T")


async def run_batch(
    items: Iterable[T],
    handle: Callable[[T], Awaitable[object]],
    *,
    key: Callable[[T], Hashable],
    limit: int,
) -> None:
    """Run `handle` over `items`: distinct keys side by side (at most `limit`), equal in order."""
    lanes: dict[Hashable, list[T]] = {}
    for item in items:
        lanes.setdefault(key(item), []).append(item)
    if not lanes:
        return
    if limit <= 1 or len(lanes) == 1:
        errors: list[BaseException] = []
        for lane in lanes.values():
            for item in lane:
                try:
                    await handle(item)
                except Exception as exc:  # finish the batch, then raise the first
                    errors.append(exc)
        if errors:
            raise errors[0]
        return
    gate = asyncio.Semaphore(limit)

    async def run_lane(lane: list[T]) -> None:
        first: Exception | None = None
        for item in lane:
            async with gate:
                try:
                    await handle(item)
                except Exception as exc:
                    first = first or exc
        if first is not None:
            raise first

    results = await asyncio.gather(
        *(run_lane(lane) for lane in lanes.values()), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result

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
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from controlplane.persistence.errors import StoreUnavailable

__all__ = ["GroupWrites", "each_alone", "run_batch"]

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)


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


async def each_alone(
    failed: Exception,
    items: Sequence[T],
    write: Callable[[Sequence[T]], Awaitable[Sequence[R | Exception]]],
    what: str,
) -> list[R | Exception]:
    """After a group's unit raised `failed` (so nothing of it committed): each item written
    alone by `write` (the group's own function, given one item), in order; or every item
    refused with `failed` when the group was one item or the store is down (alone, each would
    fail the same way)."""
    if len(items) == 1 or isinstance(failed, StoreUnavailable):
        return [failed] * len(items)
    log.warning("%d %s failed together; writing each alone", len(items), what)
    return [(await write([item]))[0] for item in items]


class GroupWrites(Generic[T, R]):
    """Items written in groups as they come (group commit): an item put while fewer than
    `units` writes are in flight goes out at once; the items put while they all are go out
    together in the next. A group grows with the load, and an item waits for at most the writes
    in flight, never for a sibling still computing (a poll waiting on its provider). The writes
    run in tasks of their own, so whoever puts an item is free meanwhile (a poll's slot goes
    to the next poll).

    `write` takes a group and answers each item's result or the exception that refused it
    (raised to that item's waiter only); an exception of `write` itself goes to the group."""

    def __init__(
        self, write: Callable[[list[T]], Awaitable[Sequence[R | Exception]]], *, units: int = 1
    ) -> None:
        self._write = write
        self._units = max(1, units)
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._put: list[asyncio.Future[R]] = []
        self._writers: set[asyncio.Task[None]] = set()

    def put(self, item: T) -> asyncio.Future[R]:
        """Queue `item` for the next group; its result (or its exception) when written."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        self._put.append(future)
        if len(self._writers) < self._units:
            writer = asyncio.ensure_future(self._drain())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        return future

    async def submit(self, item: T) -> R:
        """Write `item` with whatever else is waiting: its result, or its exception raised."""
        return await self.put(item)

    @property
    def waiting(self) -> int:
        """Items put and not yet answered."""
        return sum(1 for f in self._put if not f.done())

    async def wait(self) -> None:
        """Until every item put so far is written; the first item's exception raised."""
        put, self._put = self._put, []
        for result in await asyncio.gather(*put, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def _drain(self) -> None:
        group: list[tuple[T, asyncio.Future[R]]] = []
        try:
            while self._queue:
                group, self._queue = self._queue, []
                await self._settle(group)
        except BaseException:  # cancelled: no one is left to write what waits
            for _, waiting in group + self._queue:
                waiting.cancel()
            self._queue = []
            raise

    async def _settle(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._write([item for item, _ in group])
        except Exception as exc:
            results = [exc] * len(group)
        for (_, future), result in zip(group, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

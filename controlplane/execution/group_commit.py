"""Group commit (design 9.20, issue 22): writes that finish their provider I/O one by one, applied
together in shared units of work.

A worker's items do their I/O side by side (`run_batch`); each then hands its write to a
`GroupCommit` and awaits it. The first write of a quiet moment goes out at once, alone: no item
waits for a timer or for a straggler of its claim. While `max_in_flight` units are open,
arrivals queue, and the next unit takes every queued write (at most `max_group`): under load the
groups grow by themselves, one transaction per group instead of one per item. A slow call holds
back nobody's write but its own.

`write_group(items)` applies a group in ONE unit and returns each item's result in order. If it
raises, that unit committed nothing, and each item is written alone by `write_one(item)`, as one
item at a time would be: one bad item costs the others nothing, and its own error goes to its
own caller. Cancelling a caller does not cancel the unit its item is in (the unit is shared).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupCommit"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    """See the module docstring; `units` counts group units started, `fallbacks` groups whose
    unit raised and were written item by item."""

    def __init__(
        self,
        write_group: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        write_one: Callable[[T], Awaitable[R]],
        *,
        max_group: int,
        max_in_flight: int,
    ) -> None:
        if max_group < 1 or max_in_flight < 1:
            raise ValueError("max_group and max_in_flight must be at least 1")
        self._write_group = write_group
        self._write_one = write_one
        self._max_group = max_group
        self._max_in_flight = max_in_flight
        self._queued: list[tuple[T, asyncio.Future[R]]] = []
        self._running: set[asyncio.Task[None]] = set()
        self.units = 0
        self.fallbacks = 0

    async def write(self, item: T) -> R:
        """Write `item` in the next unit with room; its result once that unit committed."""
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        # A caller cancelled meanwhile never reads its error: mark it read, so asyncio does not
        # log it as lost.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queued.append((item, done))
        self._start()
        return await asyncio.shield(done)

    def _start(self) -> None:
        while self._queued and len(self._running) < self._max_in_flight:
            group, self._queued = (
                self._queued[: self._max_group],
                self._queued[self._max_group :],
            )
            task = asyncio.create_task(self._commit(group))
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _commit(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.units += 1
        items = [item for item, _ in group]
        try:
            results = await self._write_group(items)
        except Exception as exc:
            if len(group) == 1:
                _settle(group[0][1], exc)
                return
            self.fallbacks += 1
            log.warning("a group of %d writes failed (%r); writing each alone", len(group), exc)
            for item, done in group:
                try:
                    _settle(done, await self._write_one(item))
                except Exception as one:
                    _settle(done, one)
            return
        except BaseException as exc:  # cancelled at shutdown: every caller learns it
            for _, done in group:
                _settle(done, exc)
            raise
        if len(results) != len(group):
            error = RuntimeError(f"write_group returned {len(results)} results for {len(group)}")
            for _, done in group:
                _settle(done, error)
            return
        for (_, done), result in zip(group, results, strict=True):
            _settle(done, result)


def _settle(done: asyncio.Future[R], outcome: R | BaseException) -> None:
    if done.done():
        return
    if isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)

"""The loop that makes scheduled document activations effective on time (design 9.25.5).

Every replica runs one `DocumentActivator` over every kind of versioned document: it sleeps until
the soonest pending activation it knows of, or `poll_s` to learn of ones another replica
scheduled, then calls each kind's `VersionedDocuments.apply_due`. Replicas that wake together
serialise on the kind's publication lock and only the first finds anything to apply (see
`controlplane.service.versioned`), so the activation happens once, within milliseconds of its
time when it was scheduled more than `poll_s` ahead, and at most `poll_s` late otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from controlplane.service.versioned import VersionedDocuments

log = logging.getLogger(__name__)

POLL_S = 5.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class DocumentActivator:
    """Applies due scheduled activations of `kinds`; `kick` after scheduling one here."""

    def __init__(
        self,
        kinds: Sequence[VersionedDocuments],
        *,
        poll_s: float = POLL_S,
        clock: Callable[[], datetime] = _utcnow,
        kicked: asyncio.Event | None = None,
    ) -> None:
        self._kinds, self._poll_s, self._clock = tuple(kinds), poll_s, clock
        # Set by the kinds' ``on_schedule`` (or `kick`): re-read the pending activations now.
        self._kicked = kicked or asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def kick(self) -> None:
        """Re-read the pending activations now (one was just scheduled in this process)."""
        self._kicked.set()

    async def run_once(self) -> float:
        """Apply what is due; the seconds until the next pass (at most `poll_s`)."""
        wait = self._poll_s
        for kind in self._kinds:
            try:
                await kind.apply_due()
                due = await kind.next_due()
            except Exception:  # a database outage must not end the loop; the next pass retries
                log.exception("applying scheduled document activations failed")
                continue
            if due is not None:
                wait = min(wait, max(0.0, (due - self._clock()).total_seconds()))
        return wait

    async def run(self) -> None:
        while not self._stop.is_set():
            self._kicked.clear()
            wait = await self.run_once()
            waiters = [asyncio.ensure_future(e.wait()) for e in (self._stop, self._kicked)]
            try:
                await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiter

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="document-activator")

    async def stop(self) -> None:
        """Idempotent."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

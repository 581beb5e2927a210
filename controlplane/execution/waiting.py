"""`WaitingLeases`: the leases of attempts waiting for a submit worker are kept alive (9.11.1).

The dispatcher leases capacity when it creates an attempt; the attempt then waits, READY_TO_SUBMIT,
until a submit worker sends it. Under load that wait can outlast the lease's TTL (a backlog of a
minute at time factor 0.1 against a 60 s TTL), and an expired lease is reclaimed: the slot goes
to someone else and the attempt cannot be sent under it. So, like a poll renews the lease of a job
in flight, this step renews the lease of every attempt waiting to be sent (including the ones a
breaker or a lost lease parked), every `ExecutionConfig.waiting_lease_renew_s`, a page of the
backlog at a time. A lease already gone is left to the submit worker (`LeaseKeeper.secure` takes
a new one right before the send), so the renewal never fails an attempt.

Every replica renews every waiting attempt: renewing is idempotent, and a replica that stops
leaves the others renewing.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from controlplane.execution.outcomes import ExecutionDeps
from controlplane.persistence.records import AttemptRecord

__all__ = ["WaitingLeases"]

log = logging.getLogger(__name__)

_PAGE = 500
_SIDE_BY_SIDE = 16  # renewals in flight at once (one Redis round trip or two each)


class WaitingLeases:
    """Renews the leases of READY_TO_SUBMIT attempts; `renewed` and `missing` count them."""

    def __init__(self, deps: ExecutionDeps) -> None:
        self._deps = deps
        self._next_at: datetime | None = None
        self.renewed = 0
        self.missing = 0

    async def run_once(self) -> int:
        """One pass over the whole backlog when due (else nothing); returns the renewals."""
        now = self._deps.clock()
        if self._next_at is not None and now < self._next_at:
            return 0
        self._next_at = now + timedelta(seconds=self._deps.config.waiting_lease_renew_s)
        renewed = 0
        after = 0
        gate = asyncio.Semaphore(_SIDE_BY_SIDE)

        async def renew_one(attempt: AttemptRecord) -> bool:
            async with gate:
                return await self._deps.leases.renew(attempt)

        while True:
            page = await self._deps.reads.waiting_to_submit(after_id=after, limit=_PAGE)
            if not page:
                break
            after = page[-1].id
            results = await asyncio.gather(*(renew_one(a) for a in page))
            renewed += sum(results)
            self.missing += len(results) - sum(results)
            if len(page) < _PAGE:
                break
        self.renewed += renewed
        return renewed

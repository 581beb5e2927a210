"""Group commit of CreateTask: concurrent creates written together, one statement per batch.

`CreateBatcher.create` queues a create and waits for its result. While a batch is being
written the next one gathers; the first create to find no batch in flight starts the writer,
so an idle server writes a lone create at once (no timer, no added latency) and a busy one
writes everything that arrived meanwhile (up to `max_batch`). On PostgreSQL that is ONE
statement on an autocommit connection: a multi-row ``INSERT ... ON CONFLICT (tenant, key) DO
NOTHING RETURNING`` whose CTEs add each new task's event, outbox message and RESERVE entry
(`_create.insert_many`). On SQLite it is one transaction of one multi-row INSERT per table
(one write lock and one commit for the batch instead of one each).

Only creates that need no credit check are batched (no reservation, or a policy without a
floor); a prepaid create takes its tenant's lock in its own transaction
(`SqlUnitOfWork.create_task`). Each create gets exactly what it would get alone: its task and
``created``; a key already stored, or repeated in the batch, returns the stored task (another
spec hash: `IdempotencyConflict`). If the batch fails, each of its creates is retried alone, so
one bad row never fails another's create; an outage fails each with `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.domain.money import Reservation
from controlplane.domain.outbox import Topic
from controlplane.persistence import _create
from controlplane.persistence.database import Database
from controlplane.persistence.errors import StoreUnavailable
from controlplane.persistence.records import TaskRecord

__all__ = ["CreateBatcher", "NewTask"]

NewTask = _create.NewTask  # what a create stores (re-exported for the service)

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 64


@dataclass(slots=True)
class _Pending:
    new: NewTask
    reservation: Reservation | None
    now: datetime
    done: asyncio.Future[tuple[TaskRecord, bool]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def settle(self, result: tuple[TaskRecord, bool] | BaseException) -> None:
        if self.done.done():  # the caller went away (its RPC cancelled): nothing to tell
            return
        if isinstance(result, BaseException):
            self.done.set_exception(result)
        else:
            self.done.set_result(result)


class CreateBatcher:
    """Batches the `Database`'s unchecked creates (module docstring); one per database."""

    def __init__(self, db: Database, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self._db = db
        self._max = max_batch
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None

    async def create(
        self, new: NewTask, reservation: Reservation | None, now: datetime
    ) -> tuple[TaskRecord, bool]:
        """The task `new` describes, stored now or found under its key (``(task, created)``)."""
        checked = reservation is not None and reservation.policy.floor_micros() is not None
        if checked:
            return await self._alone(new, reservation, now, one_statement=not checked)
        pending = _Pending(new, reservation, now)
        self._pending.append(pending)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_all())
        # The batch is written whatever happens to this caller (like any write in flight).
        return await asyncio.shield(pending.done)

    async def _alone(
        self,
        new: NewTask,
        reservation: Reservation | None,
        now: datetime,
        *,
        one_statement: bool,
    ) -> tuple[TaskRecord, bool]:
        async with self._db.unit(now, one_statement=one_statement) as u:
            return await u.create_task(
                new.spec,
                reservation=reservation,
                idempotency_key=new.idempotency_key,
                spec_hash=new.spec_hash,
                queue_deadline_at=new.queue_deadline_at,
                deadline_at=new.deadline_at,
                trace_context=new.trace_context,
                webhook=new.webhook,
            )

    async def _write_all(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[: self._max], self._pending[self._max :]
                await self._write(batch)
        finally:
            self._writer = None

    async def _write(self, batch: list[_Pending]) -> None:
        try:
            await self._write_once(batch)
        except BaseException:  # cancelled (shutdown): no caller waits forever
            for pending in batch:
                pending.settle(StoreUnavailable("the create was interrupted"))
            raise

    async def _write_once(self, batch: list[_Pending]) -> None:
        if len(batch) > 1:
            try:
                results = await self._write_batch(batch)
            except Exception:
                log.debug("batched create failed; writing its %d creates alone", len(batch))
            else:
                for pending, result in zip(batch, results, strict=True):
                    pending.settle(result)
                return
        await asyncio.gather(*(self._write_alone(p) for p in batch))

    async def _write_alone(self, pending: _Pending) -> None:
        try:
            result = await self._alone(
                pending.new, pending.reservation, pending.now, one_statement=True
            )
        except Exception as exc:  # the caller's error, raised in its own RPC
            pending.settle(exc)
        else:
            pending.settle(result)

    async def _write_batch(
        self, batch: list[_Pending]
    ) -> list[tuple[TaskRecord, bool] | BaseException]:
        now = max(p.now for p in batch)
        async with self._db.unit(now, one_statement=True) as u:
            results = await _create.insert_many(
                u.conn, [(p.new, p.reservation, p.now) for p in batch]
            )
            if any(not isinstance(r, BaseException) and r[1] for r in results):
                u.topics.add(str(Topic.QUEUED))
        return results

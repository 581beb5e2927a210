"""The caller-webhook outbox in the database: messages written with their task events, claimed
by the delivery worker, settled with each attempt; and the per-task delivery history.

`enqueue_statement` is what `_sql.append_event` adds to a task event's write: an ``INSERT ...
SELECT`` from the task row that inserts a message only when the task is subscribed to the
event (``webhook_url`` set and, for an optional type, its bit in ``webhook_events``), so a task
without a webhook costs nothing but the WHERE. On PostgreSQL it rides in the event's own
statement as a CTE (one round trip, as before).

Claims (`WebhookStore.claim`) lock due PENDING rows with ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL (SQLite's single writer serializes them) and push ``next_attempt_at`` past a lease,
so replicas never send one message twice at once and a crashed sender's claim expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, insert, literal, select, update
from sqlalchemy.sql.expression import ColumnElement, Insert

from controlplane.domain import webhooks as domain
from controlplane.domain.webhooks import DeliveryState
from controlplane.persistence.coltypes import UtcDateTime
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import webhook_attempts as WA
from controlplane.persistence.models import webhook_messages as WM

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = [
    "AttemptResult",
    "ClaimedMessage",
    "DeliveryRecord",
    "WebhookAttemptRecord",
    "WebhookStore",
    "enqueue_statement",
]


def enqueue_statement(
    task_id: int,
    kind: str,
    payload: Mapping[str, Any],
    now: datetime,
    outputs: Iterable[Mapping[str, Any]] = (),
) -> Insert | None:
    """The INSERT of the event's webhook message (module docstring); None when no webhook
    announces an event of this kind."""
    event_type = domain.event_type_for(kind, payload)
    if event_type is None:
        return None
    subscribed: ColumnElement[bool] = T.c.webhook_url.is_not(None)
    bit = domain.event_bit(event_type)
    if bit:
        subscribed = and_(subscribed, T.c.webhook_events.op("&")(bit) != 0)
    body = domain.message_body(event_type, now, task_id, payload, outputs)
    at = literal(now, UtcDateTime)
    return insert(WM).from_select(
        [
            "id",
            "task_id",
            "tenant_id",
            "event_type",
            "url",
            "body",
            "state",
            "attempts",
            "next_attempt_at",
            "created_at",
            "updated_at",
        ],
        select(
            literal(domain.new_message_id()),
            T.c.id,
            T.c.tenant_id,
            literal(event_type),
            T.c.webhook_url,
            literal(body),
            literal(DeliveryState.PENDING.value),
            literal(0),
            at,
            at,
            at,
        ).where(T.c.id == task_id, subscribed),
    )


@dataclass(frozen=True, slots=True)
class ClaimedMessage:
    """A message claimed for one delivery attempt."""

    id: str
    task_id: int
    tenant_id: str
    event_type: str
    url: str
    body: str
    attempts: int  # made before this one


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """One attempt's outcome and what it leaves the message in."""

    message_id: str
    attempt_no: int
    sent_at: datetime
    status_code: int
    error: str
    duration_ms: int
    state: DeliveryState
    next_attempt_at: datetime | None
    record_attempt: bool = True  # False: refused before any request (nothing was sent)


@dataclass(frozen=True, slots=True)
class WebhookAttemptRecord:
    attempt_no: int
    sent_at: datetime
    status_code: int
    error: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """A message of a task and its attempts, oldest first."""

    id: str
    task_id: int
    event_type: str
    url: str
    body: str
    state: DeliveryState
    attempts: tuple[WebhookAttemptRecord, ...]
    next_attempt_at: datetime | None
    last_error: str | None
    created_at: datetime


class WebhookStore:
    """Claims, settlements and reads of the webhook outbox over one `Database`."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim(self, now: datetime, *, limit: int, lease_s: float) -> list[ClaimedMessage]:
        """Up to `limit` due PENDING messages, oldest due first, claimed for `lease_s`."""
        async with self._db.unit(now) as u:
            due = (
                select(WM)
                .where(WM.c.state == DeliveryState.PENDING.value, WM.c.next_attempt_at <= now)
                .order_by(WM.c.next_attempt_at, WM.c.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            rows = (await u.conn.execute(due)).mappings().all()
            if rows:
                await u.conn.execute(
                    update(WM)
                    .where(WM.c.id.in_([r["id"] for r in rows]))
                    .values(next_attempt_at=now + timedelta(seconds=lease_s), updated_at=now)
                )
        return [
            ClaimedMessage(
                id=r["id"],
                task_id=int(r["task_id"]),
                tenant_id=r["tenant_id"],
                event_type=r["event_type"],
                url=r["url"],
                body=r["body"],
                attempts=int(r["attempts"]),
            )
            for r in rows
        ]

    async def settle(self, results: Sequence[AttemptResult], now: datetime) -> None:
        """Record a batch's attempts and move each message to its new state, in one unit."""
        if not results:
            return
        async with self._db.unit(now) as u:
            attempts = [
                {
                    "message_id": r.message_id,
                    "attempt_no": r.attempt_no,
                    "sent_at": r.sent_at,
                    "status_code": r.status_code,
                    "error": r.error,
                    "duration_ms": r.duration_ms,
                }
                for r in results
                if r.record_attempt
            ]
            if attempts:
                await u.conn.execute(insert(WA), attempts)
            for r in results:
                await u.conn.execute(
                    update(WM)
                    .where(WM.c.id == r.message_id, WM.c.state == DeliveryState.PENDING.value)
                    .values(
                        state=r.state.value,
                        attempts=r.attempt_no if r.record_attempt else WM.c.attempts,
                        next_attempt_at=r.next_attempt_at,
                        last_error=r.error or None,
                        updated_at=now,
                    )
                )

    async def deliveries(self, task_id: int) -> list[DeliveryRecord]:
        """The task's messages, oldest first, each with its attempts."""
        async with self._db.reading() as conn:
            messages = (
                (
                    await conn.execute(
                        select(WM).where(WM.c.task_id == task_id).order_by(WM.c.created_at, WM.c.id)
                    )
                )
                .mappings()
                .all()
            )
            ids = [m["id"] for m in messages]
            tried: dict[str, list[WebhookAttemptRecord]] = {i: [] for i in ids}
            if ids:
                rows = await conn.execute(
                    select(WA).where(WA.c.message_id.in_(ids)).order_by(WA.c.attempt_no)
                )
                for a in rows.mappings():
                    tried[a["message_id"]].append(
                        WebhookAttemptRecord(
                            a["attempt_no"],
                            a["sent_at"],
                            a["status_code"],
                            a["error"],
                            a["duration_ms"],
                        )
                    )
        return [
            DeliveryRecord(
                id=m["id"],
                task_id=int(m["task_id"]),
                event_type=m["event_type"],
                url=m["url"],
                body=m["body"],
                state=DeliveryState(m["state"]),
                attempts=tuple(tried[m["id"]]),
                next_attempt_at=m["next_attempt_at"],
                last_error=m["last_error"],
                created_at=m["created_at"],
            )
            for m in messages
        ]

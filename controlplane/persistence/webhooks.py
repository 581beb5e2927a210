"""The caller-webhook outbox in the database: messages written with their task events, claimed
by the delivery worker, settled with each attempt; and the per-task delivery history.

`ENQUEUE` is what a task event's write adds (`_sql.append_event`; `enqueue_many` for the
dispatcher's bulk events): an ``INSERT ... SELECT`` from the task row that inserts a message
only when the task is subscribed to the event (``webhook_url`` set and, for an optional type,
its bit in ``webhook_events``), so a task without a webhook costs nothing but the WHERE. On
PostgreSQL it rides in the event's own statement as a CTE (one round trip, as before). Messages
carry their event's number: one task's are claimed and sent in event order, though a retried
message can arrive after a later one (receivers order by ``status_version``).

Claims (`WebhookStore.claim`) lock due PENDING rows with ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL (SQLite's single writer serializes them) and push ``next_attempt_at`` past a lease,
so replicas never send one message twice at once and a crashed sender's claim expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Text,
    and_,
    bindparam,
    column,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY as PG_ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
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
    "ENQUEUE",
    "AttemptResult",
    "ClaimedMessage",
    "DeliveryRecord",
    "WebhookAttemptRecord",
    "WebhookStore",
    "enqueue_many",
    "enqueue_params",
]


_COLUMNS = [
    "id",
    "task_id",
    "event_seq",
    "tenant_id",
    "event_type",
    "url",
    "body",
    "state",
    "attempts",
    "next_attempt_at",
    "created_at",
    "updated_at",
]


def _enqueue() -> Insert:
    """The message INSERT ... SELECT from the task row, built once; `enqueue_params` binds it."""
    subscribed: ColumnElement[bool] = and_(
        T.c.id == bindparam("w_task_id", type_=BigInteger),
        T.c.webhook_url.is_not(None),
        or_(
            bindparam("w_bit", type_=Integer) == 0,
            T.c.webhook_events.op("&")(bindparam("w_bit", type_=Integer)) != 0,
        ),
    )
    at = bindparam("w_now", type_=UtcDateTime)
    return insert(WM).from_select(
        _COLUMNS,
        select(
            bindparam("w_id", type_=Text),
            T.c.id,
            bindparam("w_seq", type_=BigInteger),
            T.c.tenant_id,
            bindparam("w_type", type_=Text),
            T.c.webhook_url,
            bindparam("w_body", type_=Text),
            literal(DeliveryState.PENDING.value),
            literal(0),
            at,
            at,
            at,
        ).where(subscribed),
    )


ENQUEUE = _enqueue()


def enqueue_params(  # noqa: PLR0917 - a task event's columns, in append_event's order
    task_id: int,
    seq: int,
    kind: str,
    payload: Mapping[str, Any],
    now: datetime,
    outputs: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any] | None:
    """`ENQUEUE`'s parameters for task event `seq` (module docstring); None when no webhook
    announces an event of this kind."""
    event_type = domain.event_type_for(kind, payload)
    if event_type is None:
        return None
    return {
        "w_id": domain.new_message_id(),
        "w_task_id": task_id,
        "w_seq": seq,
        "w_type": event_type,
        "w_bit": domain.event_bit(event_type),
        "w_body": domain.message_body(event_type, now, task_id, payload, outputs),
        "w_now": now,
    }


_ARRAYS = (
    ("w_id", Text),
    ("w_task_id", BigInteger),
    ("w_seq", BigInteger),
    ("w_type", Text),
    ("w_bit", Integer),
    ("w_body", Text),
)


def _enqueue_unnest() -> Insert:
    """`ENQUEUE` for many events in one statement on PostgreSQL: one array per parameter."""
    src = (
        func.unnest(*(bindparam(f"a{name}", type_=PG_ARRAY(kind)) for name, kind in _ARRAYS))
        .table_valued(*(column(name, kind) for name, kind in _ARRAYS))
        .render_derived(name="src")
    )
    at = bindparam("w_now", type_=UtcDateTime)
    return insert(WM).from_select(
        _COLUMNS,
        select(
            src.c.w_id,
            T.c.id,
            src.c.w_seq,
            T.c.tenant_id,
            src.c.w_type,
            T.c.webhook_url,
            src.c.w_body,
            literal(DeliveryState.PENDING.value),
            literal(0),
            at,
            at,
            at,
        )
        .select_from(src.join(T, T.c.id == src.c.w_task_id))
        .where(
            T.c.webhook_url.is_not(None),
            or_(src.c.w_bit == 0, T.c.webhook_events.op("&")(src.c.w_bit) != 0),
        ),
    )


_ENQUEUE_MANY = _enqueue_unnest()


async def enqueue_many(
    conn: AsyncConnection,
    events: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    outputs: Mapping[tuple[int, int], Sequence[Mapping[str, Any]]] | None = None,
    with_events: Any = None,
) -> int:
    """The messages of task events inserted in bulk (``task_events`` row dicts): one statement
    on PostgreSQL (arrays), one executemany on SQLite; events no webhook announces are skipped.
    `outputs` (by (task id, seq)) go into their event's message. On PostgreSQL `with_events`,
    a data-modifying CTE inserting the events themselves (`_bulk.unnest_insert`, its
    parameters merged into the call), rides in the same statement. How many of the events are
    of a kind a webhook may announce (the statement itself keeps only subscribed tasks'): a
    wake-up hint for the delivery worker, not a count of rows."""
    found = outputs or {}
    params = [
        p
        for e in events
        if (
            p := enqueue_params(
                e["task_id"],
                e["seq"],
                e["kind"],
                e["payload"],
                now,
                found.get((e["task_id"], e["seq"]), ()),
            )
        )
    ]
    if not params:
        return 0
    if conn.dialect.name != "postgresql":
        await conn.execute(ENQUEUE, params)
        return len(params)
    arrays: dict[str, Any] = {f"a{name}": [p[name] for p in params] for name, _ in _ARRAYS}
    if with_events is None:
        await conn.execute(_ENQUEUE_MANY, {**arrays, "w_now": now})
    else:
        statement, event_params = with_events
        await conn.execute(_with_events(statement), {**arrays, **event_params, "w_now": now})
    return len(params)


_COMBINED: dict[int, Any] = {}


def _with_events(events_insert: Any) -> Any:
    """`_ENQUEUE_MANY` carrying `events_insert` as an unreferenced CTE (built once per insert)."""
    key = id(events_insert)
    stmt = _COMBINED.get(key)
    if stmt is None:
        stmt = _COMBINED[key] = _ENQUEUE_MANY.add_cte(events_insert.cte("ev"))
    return stmt


@dataclass(frozen=True, slots=True)
class ClaimedMessage:
    """A message claimed for one delivery attempt."""

    id: str
    task_id: int
    event_seq: int
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
                .order_by(WM.c.next_attempt_at, WM.c.task_id, WM.c.event_seq)
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
                event_seq=int(r["event_seq"]),
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
            if attempts:  # a claim that expired mid-send may settle twice: the first one stands
                dialect = postgresql if u.conn.dialect.name == "postgresql" else sqlite
                await u.conn.execute(dialect.insert(WA).on_conflict_do_nothing(), attempts)
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
                        select(WM)
                        .where(WM.c.task_id == task_id)
                        .order_by(WM.c.event_seq, WM.c.created_at)
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

"""The CreateTask write: a QUEUED task, its first event, its ``task.queued`` outbox message and,
with a reservation, its RESERVE entry, in the fewest round trips the database allows.

ONE function writes it, for any number of creates: `insert_many` (the group commit of
`creates`); `insert_task`, a single create, is that function given one item, as
`transitions.move_tasks` is the set-based form of the unit's single move.

PostgreSQL: ONE statement however many creates. The rows arrive as one array per column
(``unnest ... WITH ORDINALITY``) into ``INSERT ... ON CONFLICT (tenant_id, idempotency_key) DO
NOTHING RETURNING``, a data-modifying CTE the event, outbox and reserve inserts select from, so a
replayed key inserts nothing at all (no savepoint, no read before the write). A key that already
exists (committed, or committed by a concurrent creator the ON CONFLICT waited for) returns no
row, and one read by key then returns the stored task (READ COMMITTED: that read's snapshot is
newer than the winner's commit).

SQLite: the same INSERT ... ON CONFLICT DO NOTHING RETURNING (no data-modifying CTEs there), then
one multi-row insert each for the new tasks' events, outbox messages and RESERVE entries:
statements are local calls, and ``BEGIN IMMEDIATE`` holds the single write lock anyway.

A reservation under a policy with a floor (prepaid) is not written inline: after the insert the
tenant is locked and its available credit checked (`ledger.check_and_lock`), then the RESERVE
entry written, in the unit's transaction (never `one_statement`); a refusal raises and the whole
unit rolls back. The group commit sends no such create (`creates`).

The stored task is returned as built here (status QUEUED, version 0, nothing adopted), not read
back: the row is exactly these values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Text,
    bindparam,
    cast,
    column,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY as PG_ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Executable

from controlplane.domain.money import CreditKind, Reservation
from controlplane.domain.outbox import Topic
from controlplane.domain.states import TaskState
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.persistence import _reads, _sql, ledger
from controlplane.persistence.coltypes import JsonDoc
from controlplane.persistence.errors import StoreUnavailable
from controlplane.persistence.models import credit_ledger as C
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import outbox as O
from controlplane.persistence.models import task_events as E
from controlplane.persistence.records import TaskRecord
from vidroute_core.codec import spec_to_dict
from vidroute_core.spec import GenerationSpec

__all__ = ["NewTask", "insert_many", "insert_task"]

_KEY = ["tenant_id", "idempotency_key"]
_QUEUED_EVENT = _sql.state_payload(TaskState.QUEUED, 0)


@dataclass(frozen=True, slots=True)
class NewTask:
    """What CreateTask stores (the unit's clock gives created_at)."""

    spec: GenerationSpec
    idempotency_key: str
    spec_hash: str
    queue_deadline_at: datetime | None
    deadline_at: datetime | None
    trace_context: str | None
    webhook: WebhookSubscription | None = None  # the caller webhook (its own or the default)


_SQLITE_MANY = (
    sqlite.insert(T)
    .on_conflict_do_nothing(index_elements=_KEY)
    .returning(T.c.id, T.c.tenant_id, T.c.idempotency_key)
)


def _task_row(new: NewTask, now: datetime) -> dict[str, Any]:
    """The task's row as stored: every column of ``generation_tasks`` a create writes."""
    spec = new.spec
    return {
        "tenant_id": spec.tenant_id,
        "user_id": spec.user_id,
        "project_id": spec.project_id,
        "idempotency_key": new.idempotency_key,
        "spec": spec_to_dict(spec),
        "normalized_spec_hash": new.spec_hash,
        "service_class": spec.service_class.value,
        "priority": spec.priority,
        "status": TaskState.QUEUED.value,
        "status_version": 0,
        "last_event_seq": 1,
        "queue_deadline_at": new.queue_deadline_at,
        "deadline_at": new.deadline_at,
        "trace_context": new.trace_context,
        "webhook_url": new.webhook.url if new.webhook else None,
        "webhook_events": new.webhook.mask if new.webhook else None,
        "created_at": now,
        "updated_at": now,
    }


def _record(task_id: int, new: NewTask, now: datetime) -> TaskRecord:
    spec = new.spec
    return TaskRecord(
        id=task_id,
        tenant_id=spec.tenant_id,
        user_id=spec.user_id,
        project_id=spec.project_id,
        idempotency_key=new.idempotency_key,
        spec=spec,
        spec_hash=new.spec_hash,
        service_class=spec.service_class,
        priority=spec.priority,
        state=TaskState.QUEUED,
        status_version=0,
        failure=None,
        adopted_attempt_id=None,
        output_asset=None,
        queue_deadline_at=new.queue_deadline_at,
        deadline_at=new.deadline_at,
        created_at=now,
        updated_at=now,
        trace_context=new.trace_context,
        webhook=new.webhook,
    )


def _reason(reservation: Reservation) -> str:
    return f"estimate ({reservation.policy.describe()})"


async def insert_task(
    conn: AsyncConnection, new: NewTask, reservation: Reservation | None, now: datetime
) -> tuple[TaskRecord, bool]:
    """``(task, created)``: the new task, or the one this key already stored (``created`` False;
    another spec hash under the key is `IdempotencyConflict`): `insert_many` of one create."""
    [result] = await insert_many(conn, [(new, reservation, now)])
    if isinstance(result, BaseException):
        raise result
    return result


async def _reserve(
    conn: AsyncConnection, record: TaskRecord, reservation: Reservation, now: datetime
) -> None:
    await conn.execute(
        insert(C).values(
            tenant_id=record.tenant_id,
            kind=CreditKind.RESERVE.value,
            amount_micros=reservation.amount_micros,
            currency=reservation.currency,
            task_id=record.id,
            idempotency_key=f"reserve:{record.id}",
            actor=ledger.SYSTEM_ACTOR,
            reason=_reason(reservation),
            created_at=now,
        )
    )


_ARRAYS: tuple[tuple[str, Any], ...] = (
    ("tenant_id", Text),
    ("user_id", Text),
    ("project_id", Text),
    ("idempotency_key", Text),
    ("spec", Text),  # JSON text, cast to JSONB in the statement
    ("normalized_spec_hash", Text),
    ("service_class", Text),
    ("priority", Integer),
    ("queue_deadline_at", DateTime(timezone=True)),
    ("deadline_at", DateTime(timezone=True)),
    ("trace_context", Text),
    ("webhook_url", Text),
    ("webhook_events", Integer),
    ("created_at", DateTime(timezone=True)),
    ("reserve_amount", BigInteger),  # NULL: no reservation
    ("reserve_currency", Text),
    ("reserve_reason", Text),
)


_TASK_ARRAYS = 14  # the leading arrays that are task columns (created_at last)


def _many_statement() -> Executable:
    """One statement for any number of new tasks (PostgreSQL), built and prepared once: the
    rows arrive as one array per column (``unnest ... WITH ORDINALITY``, so the first of them
    wins a key), and each new task's event, outbox message and RESERVE entry come from the
    CTE of the INSERT, stamped with its own created_at."""
    src = (
        func.unnest(*(bindparam(f"a_{name}", type_=PG_ARRAY(kind)) for name, kind in _ARRAYS))
        .table_valued(*(column(name, kind) for name, kind in _ARRAYS), with_ordinality="ord")
        .render_derived(name="src")
    )
    task_columns = [name for name, _ in _ARRAYS[:_TASK_ARRAYS]]
    picked = [
        cast(src.c.spec, postgresql.JSONB) if name == "spec" else src.c[name]
        for name in task_columns
    ]
    ins = (
        postgresql.insert(T)
        .from_select(
            [*task_columns, "status", "status_version", "last_event_seq", "updated_at"],
            select(
                *picked, literal(TaskState.QUEUED.value), literal(0), literal(1), src.c.created_at
            ).order_by(src.c.ord),
        )
        .on_conflict_do_nothing(index_elements=_KEY)
        .returning(
            T.c.id,
            T.c.tenant_id,
            T.c.idempotency_key,
            T.c.service_class,
            T.c.priority,
            T.c.created_at,
        )
        .cte("ins")
    )
    event = insert(E).from_select(
        ["task_id", "seq", "kind", "payload", "created_at"],
        select(
            ins.c.id,
            literal(1),
            literal("task.queued"),
            literal(_QUEUED_EVENT, JsonDoc),
            ins.c.created_at,
        ),
    )
    message = insert(O).from_select(
        ["topic", "aggregate_id", "payload", "created_at", "available_at", "attempts"],
        select(
            literal(str(Topic.QUEUED)),
            cast(ins.c.id, Text),
            func.jsonb_build_object(
                "task_id",
                ins.c.id,
                "tenant_id",
                ins.c.tenant_id,
                "service_class",
                ins.c.service_class,
                "priority",
                ins.c.priority,
            ),
            ins.c.created_at,
            ins.c.created_at,
            literal(0),
        ),
    )
    wanted = src.alias("wanted")
    entry = insert(C).from_select(
        [
            "tenant_id",
            "kind",
            "amount_micros",
            "currency",
            "task_id",
            "idempotency_key",
            "actor",
            "reason",
            "created_at",
        ],
        select(
            ins.c.tenant_id,
            literal(CreditKind.RESERVE.value),
            wanted.c.reserve_amount,
            wanted.c.reserve_currency,
            ins.c.id,
            literal("reserve:") + cast(ins.c.id, Text),
            literal(ledger.SYSTEM_ACTOR),
            wanted.c.reserve_reason,
            ins.c.created_at,
        )
        .select_from(
            ins.join(
                wanted,
                (wanted.c.tenant_id == ins.c.tenant_id)
                & (wanted.c.idempotency_key == ins.c.idempotency_key),
            )
        )
        .where(wanted.c.reserve_amount.is_not(None)),
    )
    return select(ins.c.id, ins.c.tenant_id, ins.c.idempotency_key).add_cte(
        event.cte("ev"), message.cte("ob"), entry.cte("res")
    )


_PG_MANY = _many_statement()


def _many_params(
    rows: list[dict[str, Any]], reserves: dict[tuple[str, str], tuple[int, str, str]]
) -> dict[str, list[Any]]:
    params: dict[str, list[Any]] = {f"a_{name}": [] for name, _ in _ARRAYS}
    for row in rows:
        for name, _ in _ARRAYS[:_TASK_ARRAYS]:
            value = row[name]
            params[f"a_{name}"].append(json.dumps(value) if name == "spec" else value)
        amount, currency, reason = reserves.get(
            (row["tenant_id"], row["idempotency_key"]), (None, None, None)
        )
        params["a_reserve_amount"].append(amount)
        params["a_reserve_currency"].append(currency)
        params["a_reserve_reason"].append(reason)
    return params


async def insert_many(
    conn: AsyncConnection, items: list[tuple[NewTask, Reservation | None, datetime]]
) -> list[tuple[TaskRecord, bool] | BaseException]:
    """The create write (see the module docstring) of any number of creates: per item
    ``(task, created)`` or its own error (`IdempotencyConflict`); the first of the items
    sharing a key is the one written, the others replay it. A floor's refusal
    (`InsufficientCredit`) is raised: the unit rolls back, every item with it."""
    first: dict[tuple[str, str], int] = {}
    rows: list[dict[str, Any]] = []
    reserves: list[tuple[str, str, int, str, str]] = []
    floors: dict[tuple[str, str], Reservation] = {}
    for i, (new, reservation, now) in enumerate(items):
        key = (new.spec.tenant_id, new.idempotency_key)
        if key in first:
            continue
        first[key] = i
        rows.append(_task_row(new, now))
        if reservation is not None and reservation.policy.floor_micros() is not None:
            floors[key] = reservation  # checked and written after the insert, below
        elif reservation is not None:
            reserves.append(
                (*key, reservation.amount_micros, reservation.currency, _reason(reservation))
            )
    if conn.dialect.name == "postgresql":
        wanted = {(t, k): (amount, cur, why) for t, k, amount, cur, why in reserves}
        found = await conn.execute(_PG_MANY, _many_params(rows, wanted))
        stored = {(row.tenant_id, row.idempotency_key): int(row.id) for row in found}
    else:
        stored = await _sqlite_many(conn, rows, reserves)
    made: dict[tuple[str, str], TaskRecord] = {}
    results: list[tuple[TaskRecord, bool] | BaseException] = []
    for i, (new, _reservation, now) in enumerate(items):
        key = (new.spec.tenant_id, new.idempotency_key)
        try:
            if first[key] == i and key in stored:
                made[key] = _record(stored[key], new, now)
                results.append((made[key], True))
                continue
            existing = made.get(key) or await _reads.task_by_key(conn, *key)
            if existing is None:  # the conflicting creator rolled back between the statements
                raise StoreUnavailable("a concurrent CreateTask of this key rolled back", 0.1)
            results.append((_sql.replay(existing, new.spec_hash), False))
        except Exception as exc:  # this create's own outcome (a conflict), not the batch's
            results.append(exc)
    for key, reservation in floors.items():
        if key in made:  # a replay reserves nothing again
            await _reserve_checked(conn, made[key], reservation, items[first[key]][2])
    return results


async def _reserve_checked(
    conn: AsyncConnection, record: TaskRecord, reservation: Reservation, now: datetime
) -> None:
    """A floor's RESERVE entry: the tenant locked and its credit checked first, last in the
    transaction so the lock is held as little as possible."""
    if conn.sync_connection is not None:
        options = conn.sync_connection.get_execution_options()
        assert options.get("isolation_level") != "AUTOCOMMIT", "a floor needs a transaction"
    await ledger.check_and_lock(conn, record.tenant_id, reservation)
    await _reserve(conn, record, reservation, now)


async def _sqlite_many(
    conn: AsyncConnection,
    rows: list[dict[str, Any]],
    reserves: list[tuple[str, str, int, str, str]],
) -> dict[tuple[str, str], int]:
    """SQLite's `insert_many` writes: the tasks (RETURNING the new ids; rows of keys already
    stored are skipped), then the new ones' events, outbox messages and RESERVE entries."""
    # executemany forms throughout: SQLAlchemy's insertmanyvalues batches them into multi-row
    # INSERTs from one cached compilation (a literal multi-row VALUES compiles per batch).
    found = await conn.execute(_SQLITE_MANY, rows)
    stored = {(r.tenant_id, r.idempotency_key): int(r.id) for r in found}
    new = [
        (stored[k], row)
        for row in rows
        if (k := (row["tenant_id"], row["idempotency_key"])) in stored
    ]
    if not new:
        return stored
    await conn.execute(
        insert(E),
        [
            {
                "task_id": task_id,
                "seq": 1,
                "kind": "task.queued",
                "payload": _QUEUED_EVENT,
                "created_at": row["created_at"],
            }
            for task_id, row in new
        ],
    )
    await conn.execute(
        insert(O),
        [
            {
                "topic": str(Topic.QUEUED),
                "aggregate_id": str(task_id),
                "payload": {
                    "task_id": task_id,
                    "tenant_id": row["tenant_id"],
                    "service_class": row["service_class"],
                    "priority": row["priority"],
                },
                "created_at": row["created_at"],
                "available_at": row["created_at"],
                "attempts": 0,
            }
            for task_id, row in new
        ],
    )
    at = {(row["tenant_id"], row["idempotency_key"]): row["created_at"] for _, row in new}
    entries = [
        {
            "tenant_id": tenant,
            "kind": CreditKind.RESERVE.value,
            "amount_micros": amount,
            "currency": currency,
            "task_id": stored[(tenant, key)],
            "idempotency_key": f"reserve:{stored[(tenant, key)]}",
            "actor": ledger.SYSTEM_ACTOR,
            "reason": reason,
            "created_at": at[(tenant, key)],
        }
        for tenant, key, amount, currency, reason in reserves
        if (tenant, key) in at
    ]
    if entries:
        await conn.execute(insert(C), entries)
    return stored

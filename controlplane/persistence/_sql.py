"""Statements that run inside a unit of work (`unit`), and page-token encoding (internal)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.states import TASK_MACHINE, TaskState
from controlplane.persistence import _rows, explain, webhooks
from controlplane.persistence.errors import InvalidPageToken
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import outbox as O
from controlplane.persistence.models import (
    route_decisions,
    task_attempts,
    task_events,
    webhook_messages,
)
from controlplane.persistence.records import (
    AttemptChanges,
    AttemptRecord,
    Failure,
    NewAttempt,
    NewOutboxMessage,
    NewRouteDecision,
    RouteDecisionRecord,
    TaskRecord,
)
from vidroute_core.exceptions import IdempotencyConflict

A = task_attempts


def replay(existing: TaskRecord, spec_hash: str) -> TaskRecord:
    """The stored task if `spec_hash` matches it, else `IdempotencyConflict`."""
    if existing.spec_hash != spec_hash:
        raise IdempotencyConflict(existing.idempotency_key, existing.spec_hash, spec_hash)
    return existing


async def cas_task(
    conn: AsyncConnection,
    task_id: int,
    expected_version: int,
    target: TaskState,
    *,
    now: datetime,
    events: int,
    extra: Mapping[str, Any] | None = None,
) -> tuple[TaskRecord, int] | None:
    """The 9.8.1 CAS on a task, reserving `events` event numbers: the moved task, from the
    UPDATE's RETURNING, and the last number reserved; None if the CAS lost."""
    allowed = TASK_MACHINE.allowed_from(target)
    if not allowed:
        return None
    values: dict[str, Any] = dict(extra or {})
    values.update(
        status=target.value,
        status_version=T.c.status_version + 1,
        last_event_seq=T.c.last_event_seq + events,
        updated_at=now,
    )
    row = (
        (
            await conn.execute(
                update(T)
                .where(
                    T.c.id == task_id,
                    T.c.status_version == expected_version,
                    T.c.status.in_(sorted(s.value for s in allowed)),
                )
                .values(values)
                .returning(T)
            )
        )
        .mappings()
        .first()
    )
    return None if row is None else (_rows.task(row), int(row["last_event_seq"]))


async def reserve_seqs(conn: AsyncConnection, counts: Mapping[int, int]) -> dict[int, int]:
    """Reserve `counts[task]` event numbers of each task in ONE statement; task -> the last
    number reserved. The row locks order concurrent writers."""
    if not counts:
        return {}
    bump = (
        T.c.last_event_seq + next(iter(counts.values()))
        if len(set(counts.values())) == 1
        else T.c.last_event_seq + case(dict(counts), value=T.c.id)
    )
    rows = await conn.execute(
        update(T)
        .where(T.c.id.in_(sorted(counts)))
        .values(last_event_seq=bump)
        .returning(T.c.id, T.c.last_event_seq)
    )
    return {int(task_id): int(last) for task_id, last in rows}


async def append_event(
    conn: AsyncConnection,
    task_id: int,
    seq: int,
    kind: str,
    payload: Mapping[str, Any],
    *,
    now: datetime,
    outputs: Sequence[Mapping[str, Any]] = (),
) -> bool:
    """Store a task event and, in the same transaction, its caller-webhook message when the task
    is subscribed to it (`webhooks.ENQUEUE`; `outputs` go into that message). On
    PostgreSQL both are one statement, the event an unreferenced data-modifying CTE. True when a
    message was written."""
    event = insert(task_events).values(
        task_id=task_id, seq=seq, kind=kind, payload=dict(payload), created_at=now
    )
    message = webhooks.enqueue_params(task_id, seq, kind, payload, now, outputs)
    if message is None:
        await conn.execute(event)
        return False
    enqueue = webhooks.ENQUEUE.returning(webhook_messages.c.id)
    if conn.dialect.name == "postgresql":
        written = await conn.execute(enqueue.add_cte(event.cte("ev")), message)
    else:
        await conn.execute(event)
        written = await conn.execute(enqueue, message)
    return written.first() is not None


async def enqueue(conn: AsyncConnection, message: NewOutboxMessage, now: datetime) -> int:
    message_id = await conn.scalar(
        insert(O)
        .values(
            topic=message.topic,
            aggregate_id=message.aggregate_id,
            payload=dict(message.payload),
            created_at=now,
            available_at=message.available_at or now,
            attempts=0,
        )
        .returning(O.c.id)
    )
    return int(message_id)


async def insert_decision(
    conn: AsyncConnection, task_id: int, decision: NewRouteDecision, now: datetime
) -> RouteDecisionRecord:
    """Insert the task's next route decision (the caller holds the task row lock)."""
    number = await conn.scalar(
        select(func.coalesce(func.max(route_decisions.c.decision_no), 0) + 1).where(
            route_decisions.c.task_id == task_id
        )
    )
    row = (
        (
            await conn.execute(
                insert(route_decisions)
                .values(
                    task_id=task_id,
                    decision_no=number,
                    policy_version=decision.policy_version,
                    selected_candidate=decision.selected_candidate,
                    candidate_snapshot=explain.as_document(decision.candidate_snapshot),
                    reason_code=decision.reason_code,
                    created_at=now,
                )
                .returning(route_decisions)
            )
        )
        .mappings()
        .one()
    )
    return _rows.route_decision(row)


async def insert_attempt(
    conn: AsyncConnection, task_id: int, attempt: NewAttempt, decision_id: int, now: datetime
) -> AttemptRecord:
    """Insert the task's next attempt (the caller holds the task row lock)."""
    number = await conn.scalar(
        select(func.coalesce(func.max(A.c.attempt_no), 0) + 1).where(A.c.task_id == task_id)
    )
    row = (
        (
            await conn.execute(
                insert(A)
                .values(
                    task_id=task_id,
                    attempt_no=number,
                    provider_account_id=attempt.provider_account_id,
                    provider_model=attempt.provider_model,
                    provider_model_version=attempt.provider_model_version,
                    capability_version=attempt.capability_version,
                    price_version=attempt.price_version,
                    routing_policy_version=attempt.routing_policy_version,
                    client_request_key=attempt.client_request_key,
                    normalized_spec_hash=attempt.normalized_spec_hash,
                    request_hash=attempt.request_hash,
                    compile_plan=dict(attempt.compile_plan),
                    route_decision_id=decision_id,
                    status=attempt.initial_state.value,
                    status_version=0,
                    estimated_cost_micros=attempt.estimated_cost_micros,
                    currency=attempt.currency,
                    lease_token=attempt.lease_token,
                    fencing_token=attempt.fencing_token,
                    created_at=now,
                    updated_at=now,
                )
                .returning(A)
            )
        )
        .mappings()
        .one()
    )
    return _rows.attempt(row)


def task_extra(
    failure: Failure | None,
    adopted_attempt_id: int | None,
    output_asset: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Optional task columns a transition sets alongside the state."""
    values: dict[str, Any] = {}
    if failure is not None:
        values.update(_rows.failure_columns(failure))
    if adopted_attempt_id is not None:
        values["adopted_attempt_id"] = adopted_attempt_id
    if output_asset is not None:
        values["output_asset"] = dict(output_asset)
    return values


def attempt_extra(changes: AttemptChanges | None) -> dict[str, Any]:
    """Optional attempt columns a transition sets alongside the state (None = unchanged)."""
    if changes is None:
        return {}
    values: dict[str, Any] = {}
    if changes.failure is not None:
        values.update(_rows.failure_columns(changes.failure))
    for name in (
        "actual_cost_micros",
        "lease_token",
        "fencing_token",
        "request_hash",
        "request_started_at",
        "request_body_sent_at",
        "transport_error_stage",
        "provider_request_trace",
    ):
        value = getattr(changes, name)
        if value is not None:
            values[name] = value
    return values


def state_payload(
    state: TaskState, version: int, reason: str = "", failure: Failure | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"state": state.value, "status_version": version}
    if reason:
        payload["reason"] = reason
    if failure is not None:
        payload["failure"] = failure_json(failure)
    return payload


def failure_json(failure: Failure) -> dict[str, str]:
    """A failure as an event payload carries it (WatchTask's detail_json)."""
    return {"class": failure.failure_class, "code": failure.code, "message": failure.message}


def attempt_moved_payload(
    attempt: AttemptRecord, reason: str, changes: AttemptChanges | None
) -> dict[str, Any]:
    """An ``attempt.state_changed`` event: the attempt, why, and its failure when it got one
    (an ABANDONED or FAILED attempt's reason is the caller's to read)."""
    payload = {**attempt_payload(attempt), "reason": reason}
    if changes is not None and changes.failure is not None:
        payload["failure"] = failure_json(changes.failure)
    return payload


def attempt_payload(attempt: AttemptRecord) -> dict[str, Any]:
    return {
        "attempt_id": attempt.id,
        "attempt_no": attempt.attempt_no,
        "state": attempt.state.value,
        "status_version": attempt.status_version,
        "provider_account_id": attempt.provider_account_id,
        "provider_model": attempt.provider_model,
    }


# Page tokens: base64url(JSON) carrying the last id served and a fingerprint of the filters,
# so a token cannot silently be reused with different filters.
_TOKEN_VERSION = 1


def filter_fingerprint(tenant_id: str | None, state: TaskState | None) -> str:
    raw = json.dumps([tenant_id, state.value if state else None])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def encode_token(last_id: int, fingerprint: str) -> str:
    raw = json.dumps({"v": _TOKEN_VERSION, "before": last_id, "f": fingerprint})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str, fingerprint: str) -> int:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        before = data["before"]
        ok = data["v"] == _TOKEN_VERSION and data["f"] == fingerprint and isinstance(before, int)
        # a forged id past int64 (or a bool) must not reach the database as a bind parameter
        ok = ok and not isinstance(before, bool) and 0 < before < 2**63
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError) as exc:
        raise InvalidPageToken("malformed page token") from exc
    if not ok:
        raise InvalidPageToken("page token does not belong to this query")
    return int(before)

"""A dispatch round's writes in one transaction (design 9.10, 9.20): claim, CAS, insert in bulk.

The dispatcher routes and leases a whole batch first, then commits it here inside ONE unit of
work (`Database.unit`):

1. `claim`: ``SELECT id, status_version ... WHERE id IN (...) AND status = 'QUEUED' FOR UPDATE
   SKIP LOCKED`` (PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises writers). A task
   is the round's only if its row was free to lock AND its version is still the one the round
   routed: a second dispatcher (two leaders by force, a slow old leader) either skips the locked
   row or finds the version moved, so a task never gets two attempts.
2. `write_selected`: for the claimed SELECTED tasks, the bulk transition of `transitions`
   (QUEUED -> SCHEDULING -> SUBMITTING, each edge asked of `TASK_MACHINE`, one UPDATE, the
   events the single path writes, three event numbers), one multi-row INSERT each into
   route_decisions, task_attempts, task_events (with the caller-webhook messages) and outbox.
   The numbers (attempt_no, decision_no) were read with `numbers` before the round leased: the
   claimed version proves no decision or attempt was added since (both are only ever written
   with a task CAS).

Statements per batch do not grow with the batch: 2 reads + 5 writes, whatever its size; on
PostgreSQL each INSERT binds one array per column (`_bulk`), not one value per cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.outbox import Topic
from controlplane.domain.states import TaskState
from controlplane.persistence import _bulk, explain
from controlplane.persistence.errors import ConcurrentModification
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import outbox as O
from controlplane.persistence.models import route_decisions as D
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.records import NewAttempt, NewRouteDecision
from controlplane.persistence.transitions import TaskMove, TaskStep, cas_many, insert_events

__all__ = ["Numbers", "SelectedTask", "Written", "claim", "numbers", "write_selected"]


@dataclass(frozen=True, slots=True)
class Numbers:
    """A task's highest attempt_no and decision_no so far (0 when none)."""

    attempt_no: int = 0
    decision_no: int = 0


@dataclass(frozen=True, slots=True)
class SelectedTask:
    """One SELECTED task of the batch: its routed version, attempt, decision and submit payload."""

    task_id: int
    expected_version: int
    numbers: Numbers
    attempt: NewAttempt
    decision: NewRouteDecision
    outbox_payload: Mapping[str, Any]


async def numbers(conn: AsyncConnection, task_ids: Iterable[int]) -> dict[int, Numbers]:
    """`Numbers` of every task in one statement (tasks without attempts or decisions: zeros)."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    attempts = (
        select(func.max(A.c.attempt_no)).where(A.c.task_id == T.c.id).correlate(T).scalar_subquery()
    )
    decisions = (
        select(func.max(D.c.decision_no))
        .where(D.c.task_id == T.c.id)
        .correlate(T)
        .scalar_subquery()
    )
    rows = await conn.execute(select(T.c.id, attempts, decisions).where(T.c.id.in_(ids)))
    return {int(i): Numbers(int(a or 0), int(d or 0)) for i, a, d in rows}


async def claim(conn: AsyncConnection, expected: Mapping[int, int]) -> set[int]:
    """Lock the QUEUED rows of `expected` (task id -> routed status_version) that no other
    transaction holds, and return those whose version is still the routed one (see module)."""
    if not expected:
        return set()
    rows = await conn.execute(
        select(T.c.id, T.c.status_version)
        .where(T.c.id.in_(sorted(expected)), T.c.status == TaskState.QUEUED.value)
        .with_for_update(skip_locked=True)
    )
    return {int(i) for i, v in rows if expected.get(int(i)) == int(v)}


@dataclass(frozen=True, slots=True)
class Written:
    """What `write_selected` created for one task."""

    attempt_id: int
    route_decision_id: int
    # Whether a caller-webhook message may have been written (the delivery worker's wake-up).
    announced: bool = False


# A dispatch: the same two steps the single path takes (`move_task`, then `create_attempt`).
DISPATCH = (TaskStep(TaskState.SCHEDULING, "dispatch"), TaskStep(TaskState.SUBMITTING))


async def write_selected(
    conn: AsyncConnection, items: Sequence[SelectedTask], now: datetime
) -> dict[int, Written]:
    """Write the claimed SELECTED tasks (see module); task id -> its new attempt and decision.

    Raises `ConcurrentModification` if a row was not QUEUED at its version after all (the
    caller claimed it in this transaction, so that is a bug or a writer ignoring the locks); the
    unit then rolls back and nothing of the batch is written.
    """
    if not items:
        return {}
    by_id = {i.task_id: i for i in items}
    moves = [TaskMove(i.task_id, TaskState.QUEUED, i.expected_version, DISPATCH) for i in items]
    moved = await cas_many(conn, moves, now, extra_events=1)  # + attempt.created
    if len(moved) != len(by_id):
        raise ConcurrentModification(f"tasks {sorted(set(by_id) - set(moved))} moved")
    decision_rows = await _bulk.insert_rows(
        conn,
        D,
        [
            {
                "task_id": i.task_id,
                "decision_no": i.numbers.decision_no + 1,
                "policy_version": i.decision.policy_version,
                "selected_candidate": i.decision.selected_candidate,
                "candidate_snapshot": explain.as_json(i.decision.candidate_snapshot),
                "reason_code": i.decision.reason_code,
                "created_at": now,
            }
            for i in items
        ],
        returning=("id", "task_id"),
    )
    decision_ids = {int(t): int(d) for d, t in decision_rows}
    attempt_rows = await _bulk.insert_rows(
        conn,
        A,
        [_attempt_row(i, decision_ids[i.task_id], now) for i in items],
        returning=("id", "task_id"),
    )
    attempt_ids = {int(t): int(a) for a, t in attempt_rows}
    events: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for i in items:
        done, attempt_id, a = moved[i.task_id], attempt_ids[i.task_id], i.attempt
        events += done.events
        created = {
            "attempt_id": attempt_id,
            "attempt_no": i.numbers.attempt_no + 1,
            "state": a.initial_state.value,
            "status_version": 0,
            "provider_account_id": a.provider_account_id,
            "provider_model": a.provider_model,
        }
        events.append(
            {
                "task_id": i.task_id,
                "seq": done.last_seq,
                "kind": "attempt.created",
                "payload": created,
                "created_at": now,
            }
        )
        body = {**i.outbox_payload, "task_id": i.task_id, "attempt_id": attempt_id}
        messages.append(
            {
                "topic": Topic.SUBMIT,
                "aggregate_id": str(attempt_id),
                "payload": body,
                "created_at": now,
                "available_at": now,
                "attempts": 0,
            }
        )
    announced = await insert_events(conn, events, now)  # with subscribed tasks' webhooks
    await _bulk.insert_rows(conn, O, messages)
    return {t: Written(a, decision_ids[t], announced) for t, a in attempt_ids.items()}


def _attempt_row(item: SelectedTask, decision_id: int, now: datetime) -> dict[str, Any]:
    a = item.attempt
    return {
        "task_id": item.task_id,
        "attempt_no": item.numbers.attempt_no + 1,
        "provider_account_id": a.provider_account_id,
        "provider_model": a.provider_model,
        "provider_model_version": a.provider_model_version,
        "capability_version": a.capability_version,
        "price_version": a.price_version,
        "routing_policy_version": a.routing_policy_version,
        "client_request_key": a.client_request_key,
        "normalized_spec_hash": a.normalized_spec_hash,
        "request_hash": a.request_hash,
        "compile_plan": dict(a.compile_plan),
        "route_decision_id": decision_id,
        "status": a.initial_state.value,
        "status_version": 0,
        "estimated_cost_micros": a.estimated_cost_micros,
        "currency": a.currency,
        "lease_token": a.lease_token,
        "fencing_token": a.fencing_token,
        "created_at": now,
        "updated_at": now,
    }

"""One create write, single or bulk (issue 22): the same creates written one at a time through
the unit (`create_task`, i.e. `_create.insert_task`) and all at once through `insert_many` (the
group commit's write) give the same results and leave the same rows in every table they touch,
on PostgreSQL and on SQLite: tasks, events, outbox messages, RESERVE entries.

Rows are compared whole, with only what legitimately differs between two runs replaced: row ids
dropped, task ids by the task's position in its run, idempotency keys without the run's prefix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from controlplane.domain.money import BillingPolicy, Reservation
from controlplane.domain.webhooks import WebhookSubscription
from controlplane.persistence import _create, ledger
from controlplane.persistence.database import Database
from controlplane.persistence.models import credit_ledger, generation_tasks, outbox, task_events
from controlplane.persistence.records import TaskRecord
from tests.integration.persistence.builders import NOW, make_spec
from vidroute_core.exceptions import IdempotencyConflict

HOOK = WebhookSubscription("https://hooks.example.com/in", ("task.state_changed",))
POSTPAID = BillingPolicy.parse("postpaid")
PREPAID = BillingPolicy.parse("prepaid")

Item = tuple[_create.NewTask, Reservation | None]


def _items(run: str) -> list[Item]:
    """Creates of every shape: plain; with webhook, trace, deadlines and a postpaid reservation;
    with a prepaid (floor) reservation; a replay of the first key; another spec under the
    second key (a conflict)."""

    def new(key: str, spec_hash: str, **kw: Any) -> _create.NewTask:
        return _create.NewTask(
            make_spec(), f"{run}-{key}", f"{run}-{spec_hash}", None, None, None, **kw
        )

    rich = _create.NewTask(
        make_spec(prompt="a kite"),
        f"{run}-b",
        f"{run}-hb",
        NOW + timedelta(minutes=5),
        NOW + timedelta(hours=1),
        "00-ab-cd-01",
        HOOK,
    )
    return [
        (new("a", "ha"), None),
        (rich, Reservation(1_500_000, "USD", POSTPAID)),
        (new("c", "hc"), Reservation(700_000, "USD", PREPAID)),
        (new("a", "ha"), None),
        (new("b", "other"), Reservation(1_500_000, "USD", POSTPAID)),
    ]


def _outcome(result: tuple[TaskRecord, bool] | BaseException, order: Mapping[int, int]) -> Any:
    """A create's result with its task's id as its position in the run."""
    if isinstance(result, BaseException):
        return type(result).__name__
    task, created = result
    return (order[task.id], created, task.state, task.status_version, task.webhook)


def _value(key: str, value: Any, order: Mapping[int, int], run: str) -> Any:
    if key in ("task_id", "aggregate_id") and value is not None:
        return f"task#{order[int(value)]}"
    if key in ("idempotency_key", "normalized_spec_hash") and isinstance(value, str):
        value = value.removeprefix(f"{run}-")
        if value.startswith("reserve:"):
            return f"reserve:task#{order[int(value.split(':')[1])]}"
        return value
    if key == "payload" and isinstance(value, Mapping) and "task_id" in value:
        return {**value, "task_id": f"task#{order[int(value['task_id'])]}"}
    return value


def _normal(row: Mapping[str, Any], order: Mapping[int, int], run: str) -> dict[str, Any]:
    return {k: _value(k, v, order, run) for k, v in row.items() if k != "id"}


async def _rows(db: Database, task_ids: Sequence[int], run: str) -> dict[str, list[Any]]:
    """Every row the run's creates wrote, normalised (module docstring)."""
    order = {t: i for i, t in enumerate(task_ids)}
    T, E, C = generation_tasks, task_events, credit_ledger
    out: dict[str, list[Any]] = {}
    async with db.reading() as conn:
        for name, query in (
            ("tasks", select(T).where(T.c.id.in_(task_ids)).order_by(T.c.id)),
            ("events", select(E).where(E.c.task_id.in_(task_ids)).order_by(E.c.task_id)),
            ("ledger", select(C).where(C.c.task_id.in_(task_ids)).order_by(C.c.task_id)),
        ):
            out[name] = [
                _normal(dict(r), order, run) for r in (await conn.execute(query)).mappings()
            ]
        rows = (await conn.execute(select(outbox).order_by(outbox.c.id))).mappings()
        out["outbox"] = [
            _normal(dict(r), order, run) for r in rows if r["payload"].get("task_id") in order
        ]
    return out


async def test_a_create_writes_the_same_rows_single_or_bulk(db: Database) -> None:
    """Five creates of every shape: one `create_task` each and one `insert_many` for all return
    the same outcomes (created, replayed, conflicting) and write the same tasks, events,
    outbox messages and RESERVE entries (a floor's after its credit check)."""
    async with db.unit(NOW) as u:  # the prepaid creates' credit
        await ledger.append_credit(u.conn, "tenant-a", 10_000_000, "USD", "c1", "ops", "", NOW)

    single: list[tuple[TaskRecord, bool] | BaseException] = []
    async with db.unit(NOW) as u:
        for new, reservation in _items("single"):
            try:
                single.append(
                    await u.create_task(
                        new.spec,
                        idempotency_key=new.idempotency_key,
                        spec_hash=new.spec_hash,
                        queue_deadline_at=new.queue_deadline_at,
                        deadline_at=new.deadline_at,
                        reservation=reservation,
                        trace_context=new.trace_context,
                        webhook=new.webhook,
                    )
                )
            except IdempotencyConflict as exc:
                single.append(exc)

    async with db.unit(NOW) as u:
        bulk = await _create.insert_many(u.conn, [(n, r, NOW) for n, r in _items("bulk")])

    def made(results: Sequence[tuple[TaskRecord, bool] | BaseException]) -> list[int]:
        return [r[0].id for r in results if not isinstance(r, BaseException) and r[1]]

    one_ids, many_ids = made(single), made(bulk)
    assert len(one_ids) == len(many_ids) == 3
    one_order = {t: i for i, t in enumerate(one_ids)}
    many_order = {t: i for i, t in enumerate(many_ids)}
    assert [_outcome(r, many_order) for r in bulk] == [_outcome(r, one_order) for r in single]
    assert _outcome(single[-1], one_order) == "IdempotencyConflict"

    ones = await _rows(db, one_ids, "single")
    many = await _rows(db, many_ids, "bulk")
    assert [len(ones[t]) for t in ("tasks", "events", "outbox", "ledger")] == [3, 3, 3, 2]
    for table, rows in ones.items():
        assert many[table] == rows, table

"""The output step writes a claimed batch in one unit of work (issue 22), and that changes no row.

The same deliveries, failures, retries and moot messages, judged alike, are written once as one
batch (one unit for the batch, the settlements of its tasks set-based) and once a message at a
time: every row they touch (tasks, attempts, task events, outbox, credit ledger, balances,
runtime rows, usage entries, quality checks) comes out the same, on PostgreSQL and on SQLite.
A batch whose unit raises commits nothing and is written item by item instead: the good items
commit, the bad one alone does not, and no output is fetched twice.

Rows are compared whole, with what legitimately differs between the two runs replaced by its
position in its run: row ids, the tasks' and attempts' ids wherever they appear, the provider
account, the tenant, job ids and idempotency or request keys.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.domain.money import BillingMode, BillingPolicy
from controlplane.domain.outbox import Topic
from controlplane.domain.states import TaskState
from controlplane.execution.engine import ExecutionEngine
from controlplane.execution.output_fetch import (
    FetchRequest,
    FetchResult,
    InvalidReason,
    OutputInvalid,
    TransientFetchError,
)
from controlplane.persistence import ledger
from controlplane.persistence.models import (
    attempt_runtime,
    credit_balances,
    credit_ledger,
    generation_tasks,
    outbox,
    provider_usage_ledger,
    quality_checks,
    task_attempts,
    task_events,
)
from controlplane.persistence.records import AttemptRecord, NewOutboxMessage
from tests.integration.execution.exec_harness import START, Harness
from tests.support.outputs import stored_mp4
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState

POSTPAID = BillingPolicy(BillingMode.POSTPAID, None)
DROPPED = frozenset(
    {
        "id",
        "idempotency_key",
        "spec_hash",
        "client_request_key",
        "lease_token",
        "fencing_token",
        "last_entry_id",
        "route_decision_id",
    }
)
# What each task's output fetch answers, by the task's position in its run.
PLAN: list[str] = ["stored", "stored", "invalid", "transient"]


def _done() -> JobSnapshot:
    output = JobOutput("https://cdn.example/out.mp4", "video/mp4", None)
    return JobSnapshot(
        JobState.SUCCEEDED,
        "SUCCEEDED",
        '{"status":"SUCCEEDED"}',
        outputs=(output,),
        actual_cost_micros=240_000,
    )


@dataclass
class PlannedFetch:
    """A `FetchFn` answering each task by its position (`PLAN`), whatever the call order."""

    positions: dict[str, int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    async def __call__(self, request: FetchRequest) -> FetchResult:
        self.calls.append(request.task_id)
        position = self.positions[request.task_id]
        kind = PLAN[position]
        if kind == "invalid":
            return OutputInvalid(InvalidReason.MEDIA_MISMATCH, "4 s asked, 9 s delivered")
        if kind == "transient":
            return TransientFetchError("503 from the CDN", 503, retry_after_s=3600.0)
        return stored_mp4(f"outputs/{position}.mp4", uri=f"file:///assets/{position}.mp4")


@dataclass
class Run:
    """One run's tasks and attempts (in creation order), its account and tenant."""

    tenant: str
    account_id: int
    attempts: list[AttemptRecord]
    fetch: PlannedFetch

    @property
    def task_ids(self) -> list[int]:
        return [a.task_id for a in self.attempts]


async def _prepared(harness: Harness, tenant: str, *, credited: bool) -> Run:
    """`len(PLAN)` reserved tasks of `tenant` driven to OUTPUT_FETCHING from `START`, plus a
    second ``output.fetch`` for the first one's attempt (a redelivery)."""
    harness.clock.now = START
    if credited:
        async with harness.db.unit(harness.clock()) as u:
            await ledger.append_credit(
                u.conn, tenant, 5_000_000, "USD", f"topup-{tenant}", "ops", "top-up", u.now
            )
    attempts = await harness.reserved_attempts(tenant, len(PLAN))
    account_id = attempts[0].provider_account_id
    for i in range(len(PLAN)):
        harness.fake.script_submit(harness.fake.accepted(f"job-{tenant}-{i}"))
        harness.fake.set_job(f"job-{tenant}-{i}", _done())
    prep = harness.engine()
    await prep.submitter.run_once()
    for _ in range(10):
        harness.clock.advance(30)
        await prep.poller.run_once()
    for a in attempts:
        assert (await harness.detail(a.task_id)).task.state is TaskState.OUTPUT_FETCHING
    first = attempts[0]
    async with harness.db.unit(harness.clock()) as u:
        await u.enqueue(
            NewOutboxMessage(
                Topic.OUTPUT_FETCH,
                str(first.id),
                {"task_id": first.task_id, "attempt_id": first.id},
            )
        )
    positions = {str(a.task_id): i for i, a in enumerate(attempts)}
    return Run(tenant, account_id, attempts, PlannedFetch(positions))


def _output_engine(harness: Harness, run: Run, batch_size: int) -> ExecutionEngine:
    """An engine whose output step claims up to `batch_size` messages and fetches with the
    run's `PlannedFetch` (driven step by step: never started)."""
    return ExecutionEngine(
        harness.db,
        {"runway": harness.fake, "self_hosted": harness.fake},
        config=replace(harness.config, batch_size=batch_size),
        leases=harness.leases,
        fetch=run.fetch,
        clock=harness.clock,
        rng=random.Random(7),
    )


class _Names:
    """Ids replaced by what they are in their run: task #i, attempt #i, the account."""

    def __init__(self, run: Run) -> None:
        self.tasks = {t: f"task#{i}" for i, t in enumerate(run.task_ids)}
        self.attempts = {a.id: f"attempt#{i}" for i, a in enumerate(run.attempts)}
        self.run = run

    def value(self, key: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: self.value(k, v) for k, v in value.items() if k not in DROPPED}
        if isinstance(value, list | tuple):
            return [self.value(key, v) for v in value]
        if isinstance(value, str):
            if value == self.run.tenant:
                return "TENANT"
            if value.startswith(f"job-{self.run.tenant}-"):
                return "JOB"  # submits are answered in call order, not task order
            if key == "aggregate_id" and value.isdigit():
                return self.attempts.get(int(value), value)
            return value
        if key == "task_id":
            return self.tasks.get(value, value)
        if key.endswith("attempt_id") and value is not None:
            return self.attempts.get(value, value)
        if key == "provider_account_id":
            return "ACCOUNT" if value == self.run.account_id else value
        return value


async def _rows(harness: Harness, run: Run) -> dict[str, list[Any]]:
    """Every row of the run's tasks, normalised (module docstring), in a stable order."""
    names = _Names(run)
    tasks, attempts = run.task_ids, [a.id for a in run.attempts]
    queries = {
        "tasks": select(generation_tasks)
        .where(generation_tasks.c.id.in_(tasks))
        .order_by(generation_tasks.c.id),
        "attempts": select(task_attempts)
        .where(task_attempts.c.task_id.in_(tasks))
        .order_by(task_attempts.c.id),
        "events": select(task_events)
        .where(task_events.c.task_id.in_(tasks))
        .order_by(task_events.c.task_id, task_events.c.seq),
        "ledger": select(credit_ledger)
        .where(credit_ledger.c.tenant_id == run.tenant)
        .order_by(credit_ledger.c.task_id, credit_ledger.c.kind),
        "balances": select(credit_balances).where(credit_balances.c.tenant_id == run.tenant),
        "runtime": select(attempt_runtime)
        .where(attempt_runtime.c.attempt_id.in_(attempts))
        .order_by(attempt_runtime.c.attempt_id),
        "usage": select(provider_usage_ledger)
        .where(provider_usage_ledger.c.task_id.in_(tasks))
        .order_by(provider_usage_ledger.c.attempt_id, provider_usage_ledger.c.kind),
        "checks": select(quality_checks)
        .where(quality_checks.c.task_id.in_(tasks))
        .order_by(quality_checks.c.attempt_id, quality_checks.c.sample_index),
        "outbox": select(outbox).order_by(outbox.c.id),
    }
    out: dict[str, list[Any]] = {}
    async with harness.db.reading() as conn:
        for name, query in queries.items():
            rows = [dict(r) for r in (await conn.execute(query)).mappings()]
            if name == "outbox":  # outbox rows name their task in the payload only
                rows = [
                    r
                    for r in rows
                    if isinstance(r["payload"], Mapping) and r["payload"].get("task_id") in tasks
                ]
            out[name] = [names.value("", r) for r in rows]
    # Messages enqueued by one concurrent step (the polls) get their ids in any order.
    out["outbox"].sort(key=repr)
    return out


def _same(batched: dict[str, list[Any]], single: dict[str, list[Any]]) -> None:
    """Every table equal; on a difference, the table, the row and the columns that differ."""
    for table, rows in single.items():
        assert len(batched[table]) == len(rows), table
        for i, (got, want) in enumerate(zip(batched[table], rows, strict=True)):
            diff = {
                k: (got.get(k), want.get(k)) for k in {*got, *want} if got.get(k) != want.get(k)
            }
            assert diff == {}, (table, i)


async def _drain(engine: ExecutionEngine) -> int:
    """Run the output step until it claims nothing; how many claims found work."""
    rounds = 0
    while await engine.output.run_once():
        rounds += 1
    return rounds


@pytest.mark.parametrize("credited", [True, False], ids=["balance-cached", "no-balance-row"])
async def test_a_batch_writes_the_same_rows_as_one_message_at_a_time(
    harness: Harness, credited: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries, a refused output, a retry and a redelivered message written as one batch
    leave the same tasks, attempts, events, outbox, ledger entries, balance, runtime rows,
    usage entries and quality checks as the same messages written one by one."""
    settle_tasks = ledger.settle_tasks
    settled: list[list[int]] = []

    async def spied(conn: Any, items: Sequence[ledger.Settle], now: Any) -> Any:
        settled.append([s.task_id for s in items])
        return await settle_tasks(conn, items, now)

    monkeypatch.setattr(ledger, "settle_tasks", spied)
    batched = await _prepared(harness, "tenant-batch", credited=credited)
    settled.clear()
    assert await _drain(_output_engine(harness, batched, batch_size=32)) == 1
    # The three ended tasks settled together, in the batch's one unit.
    assert [sorted(s) for s in settled] == [batched.task_ids[:3]]

    single = await _prepared(harness, "tenant-single", credited=credited)
    settled.clear()
    assert await _drain(_output_engine(harness, single, batch_size=1)) == len(PLAN) + 1
    assert sorted(settled) == [[t] for t in single.task_ids[:3]]

    ones = await _rows(harness, single)
    many = await _rows(harness, batched)
    assert [t["status"] for t in ones["tasks"]] == [
        "SUCCEEDED",
        "SUCCEEDED",
        "FAILED",
        "OUTPUT_FETCHING",
    ]
    assert sorted(e["kind"] for e in ones["ledger"]) == sorted(
        ["CHARGE", "CHARGE", "RELEASE", *(["CREDIT"] if credited else []), *["RESERVE"] * 4]
    )
    assert ones["balances"]
    assert [r["fetch_attempts"] for r in ones["runtime"]] == [0, 0, 0, 1]
    assert len(ones["checks"]) == 3  # two stored samples and the refused one
    _same(many, ones)
    # Each output fetched once in either run: the redelivery found its task delivered.
    assert sorted(batched.fetch.calls) == sorted(str(t) for t in batched.task_ids)
    assert sorted(single.fetch.calls) == sorted(str(t) for t in single.task_ids)
    assert await harness.used(batched.account_id) == await harness.used(single.account_id)


async def test_a_batch_whose_unit_raises_commits_every_other_item(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When one item's write raises, the batch's unit commits nothing; each item is then
    written alone: the others are delivered and released, the bad one stays claimed and
    undelivered, and no output is fetched twice."""
    run = await _prepared(harness, "tenant-poison", credited=True)
    poisoned = run.task_ids[1]
    settle_tasks = ledger.settle_tasks
    batches: list[list[int]] = []

    async def refusing(conn: Any, items: Sequence[ledger.Settle], now: Any) -> Any:
        batches.append([s.task_id for s in items])
        if any(s.task_id == poisoned for s in items):
            raise RuntimeError("settlement refused")
        return await settle_tasks(conn, items, now)

    monkeypatch.setattr(ledger, "settle_tasks", refusing)
    engine = _output_engine(harness, run, batch_size=32)
    with pytest.raises(RuntimeError, match="settlement refused"):
        await engine.output.run_once()

    first, second, failed = run.task_ids[0], run.task_ids[1], run.task_ids[2]
    assert sorted(batches[0]) == sorted([first, second, failed])  # the batch, rolled back
    assert sorted(batches[1:]) == [[first], [second], [failed]]  # then each alone
    states = [(await harness.detail(t)).task.state for t in run.task_ids]
    assert states == [
        TaskState.SUCCEEDED,
        TaskState.OUTPUT_FETCHING,
        TaskState.FAILED,
        TaskState.OUTPUT_FETCHING,
    ]
    assert sorted(run.fetch.calls) == sorted(str(t) for t in run.task_ids)
    rows = await _rows(harness, run)
    pending = [
        (m["payload"]["task_id"], m["done_at"] is None, m["claimed_by"])
        for m in rows["outbox"]
        if m["topic"] == Topic.OUTPUT_FETCH
    ]
    # The poisoned message is still claimed (its claim expires), the retried one released;
    # the rest, the redelivery included, are done.
    assert sorted(pending, key=str) == sorted(
        [
            ("task#0", False, "w1"),
            ("task#1", True, "w1"),
            ("task#2", False, "w1"),
            ("task#3", True, None),
            ("task#0", False, "w1"),
        ],
        key=str,
    )
    assert [e["kind"] for e in rows["ledger"] if e["task_id"] == "task#1"] == ["RESERVE"]

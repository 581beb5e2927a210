"""A poll round's observations are written in groups (issue 22), and that changes no row.

The same jobs, answering the same snapshots, are polled once as one round (their observations
applied in one unit: one read of the jobs, one INSERT of the raw events, the attempts held in
two reads, the moves, runtime rows, job rows, usage entries and outcomes each set-based at the
unit's end) and once one poll at a time: every row they touch (tasks, attempts, task events,
outbox, credit ledger, balances, runtime rows, usage entries, provider events) comes out the
same, on PostgreSQL and on SQLite. The round's statements do not grow with its size. A group
whose unit raises commits nothing and is applied observation by observation instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import select

from controlplane.domain.observation import IngestOutcome
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.engine import ExecutionEngine
from controlplane.execution.events import EventNormalizer, EventSource, Observation, Then
from controlplane.persistence import transitions
from controlplane.persistence.models import provider_events
from controlplane.persistence.statement_tally import count_statements, labelled
from tests.integration.execution.exec_harness import START, Harness
from tests.integration.execution.test_output_batches import (
    PlannedFetch,
    Run,
    _Names,
    _rows,
)
from vidroute_core.adapter import JobOutput, JobSnapshot, JobState
from vidroute_core.errors import ErrorClass, make_error


def _snapshots(round_no: int) -> list[JobSnapshot]:
    """What each job answers in round `round_no`, by the task's position in its run."""
    done = JobSnapshot(
        JobState.SUCCEEDED,
        "SUCCEEDED",
        '{"status":"SUCCEEDED"}',
        outputs=(JobOutput("https://cdn.example/out.mp4", "video/mp4", None),),
        actual_cost_micros=240_000,
    )
    failed = JobSnapshot(
        JobState.FAILED,
        "FAILED",
        '{"status":"FAILED"}',
        failure=make_error(ErrorClass.SAFETY_OUTPUT, "SAFETY.OUTPUT.VIDEO", "blocked"),
    )
    running = JobSnapshot(JobState.RUNNING, "RUNNING", '{"status":"RUNNING","p":0.4}', 0.4)
    queued = JobSnapshot(JobState.QUEUED, "QUEUED", '{"status":"QUEUED","q":3}', queue_position=3)
    if round_no == 0:
        return [done, done, failed, running, queued]
    return [done, done, failed, done, queued]  # the first three ended; the last says it again


async def _accepted(harness: Harness, tenant: str, *, jobs: int = len(_snapshots(0))) -> Run:
    """`jobs` reserved tasks of `tenant`, each with its job accepted at `START`."""
    harness.clock.now = START
    attempts = await harness.reserved_attempts(tenant, jobs)
    account_id = attempts[0].provider_account_id
    for i in range(len(attempts)):
        harness.fake.script_submit(harness.fake.accepted(f"job-{tenant}-{i}"))
    # Submits are answered in call order: one at a time, job i goes to attempt i.
    await harness.engine(concurrency=1).submitter.run_once()
    for i, a in enumerate(attempts):
        snap = await harness.reads.snapshot(a.id)
        assert snap is not None
        assert snap[0].state is AttemptState.ACCEPTED
        assert snap[1] is not None
        assert snap[1].provider_job_id == f"job-{tenant}-{i}"
    return Run(tenant, account_id, attempts, PlannedFetch())


async def _poll_rounds(harness: Harness, run: Run, batch_size: int) -> None:
    """Two rounds of polls, every job answering `_snapshots(round)`: with `batch_size` 1 one
    poll per claim (each observation its own unit), else the whole round in one claim."""
    engine = harness.engine(batch_size=batch_size)
    for round_no in (0, 1):
        for i, snap in enumerate(_snapshots(round_no)):
            harness.fake.set_job(f"job-{run.tenant}-{i}", snap)
        harness.clock.advance(60)
        while await engine.poller.run_once():
            pass


async def _by_content(harness: Harness, run: Run) -> dict[str, list[Any]]:
    """`_rows`, each table's rows in an order of their own content (row ids, the order the two
    runs' rows were created in, are not compared)."""
    return {table: sorted(rows, key=repr) for table, rows in (await _rows(harness, run)).items()}


def _same_rows(batched: dict[str, list[Any]], single: dict[str, list[Any]]) -> None:
    """Every table holds the same rows; on a difference, the rows only one run has."""
    for table, rows in single.items():
        only_single = [r for r in rows if r not in batched[table]]
        only_batched = [r for r in batched[table] if r not in rows]
        assert (table, only_batched, only_single) == (table, [], [])
        assert len(batched[table]) == len(rows), table


async def _events(harness: Harness, run: Run) -> list[Any]:
    """The run's provider events (observations), normalised like `_rows`."""
    names = _Names(run)
    query = (
        select(provider_events)
        .where(provider_events.c.attempt_id.in_([a.id for a in run.attempts]))
        .order_by(provider_events.c.attempt_id, provider_events.c.id)
    )
    async with harness.db.reading() as conn:
        return [names.value("", dict(r)) for r in (await conn.execute(query)).mappings()]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every group `EventNormalizer.ingest_each` is given."""
    sizes: list[int] = []
    ingest_each = EventNormalizer.ingest_each

    async def spied(
        self: EventNormalizer, items: Sequence[tuple[Observation, Then | None]]
    ) -> list[IngestOutcome | Exception]:
        sizes.append(len(items))
        return await ingest_each(self, items)

    monkeypatch.setattr(EventNormalizer, "ingest_each", spied)
    return sizes


async def test_a_round_writes_the_same_rows_as_one_poll_at_a_time(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries, a failure that ends its task, a job starting, a queued job with its
    position and, in the next round, a repeated reading (a duplicate) and a job ending,
    written per round leave the same rows as written one poll at a time."""
    sizes = _spy(monkeypatch)
    batched = await _accepted(harness, "tenant-round")
    await _poll_rounds(harness, batched, batch_size=32)
    # Seven polls (five, then the two jobs still live) in fewer units than polls.
    assert sum(sizes) == 7, sizes
    assert len(sizes) < 7, sizes

    sizes.clear()
    single = await _accepted(harness, "tenant-single")
    await _poll_rounds(harness, single, batch_size=1)
    assert sizes == [1] * 7

    ones, many = await _by_content(harness, single), await _by_content(harness, batched)
    assert [(await harness.detail(t)).task.state.value for t in single.task_ids] == [
        "OUTPUT_FETCHING",
        "OUTPUT_FETCHING",
        "FAILED",
        "OUTPUT_FETCHING",
        "RUNNING",
    ]
    assert [u["kind"] for u in ones["usage"]].count("ACTUAL") == 3  # the three that succeeded
    assert any(e["kind"] == "provider.progress" for e in ones["events"])
    _same_rows(many, ones)
    single_events, batched_events = await _events(harness, single), await _events(harness, batched)
    # Six observations stored: the second round's repeated QUEUED reading is a duplicate.
    assert [e["outcome"] for e in single_events] == [
        "ADOPTED",
        "ADOPTED",
        "APPLIED",  # the failure: applied to the attempt and its task
        "APPLIED",
        "ADOPTED",
        "APPLIED",
    ]
    assert batched_events == single_events


async def test_a_groups_statements_do_not_grow_with_its_size(harness: Harness) -> None:
    """Five jobs ending in one group cost the statements of one job ending alone: each
    observation's writes (moves, events, runtime and job rows, usage entries, outbox) go out
    set-based."""
    counted: Counter[str] = Counter()
    count_statements(harness.db.engine, lambda stage, kind: counted.update([f"{stage}.{kind}"]))

    async def statements(run: Run) -> int:
        engine = harness.engine()
        done = _snapshots(1)[0]
        group: list[tuple[Observation, Then | None]] = [
            (
                Observation(
                    run.account_id,
                    f"job-{run.tenant}-{i}",
                    done,
                    EventSource.POLL,
                    harness.clock(),
                    a.id,
                ),
                None,
            )
            for i, a in enumerate(run.attempts)
        ]
        counted.clear()
        with labelled("observe"):
            outcomes = await engine.normalizer.ingest_many(group)
        assert outcomes == [IngestOutcome.ADOPTED] * len(group)
        return counted["observe.statement"]

    one = await statements(await _accepted(harness, "tenant-one", jobs=1))
    five = await statements(await _accepted(harness, "tenant-five", jobs=5))
    assert five == one, (one, five)


async def test_a_group_whose_unit_raises_is_applied_one_by_one(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's unit that raises commits nothing; each observation is then applied alone:
    the others move their tasks, the poisoned one does not and is answered its error."""
    run = await _accepted(harness, "tenant-poison")
    poisoned = run.task_ids[0]
    cas_tasks = transitions.cas_tasks
    calls: list[list[int]] = []

    async def refusing(conn: Any, moves: Sequence[transitions.TaskCas], now: Any) -> Any:
        calls.append(sorted(m.task_id for m in moves))
        if any(m.task_id == poisoned for m in moves):
            raise RuntimeError("poisoned")
        return await cas_tasks(conn, moves, now)

    monkeypatch.setattr(transitions, "cas_tasks", refusing)
    engine: ExecutionEngine = harness.engine()
    group: list[tuple[Observation, Then | None]] = [
        (
            Observation(
                run.account_id, f"job-{run.tenant}-{i}", snap, EventSource.POLL, START, a.id
            ),
            None,
        )
        for i, (a, snap) in enumerate(zip(run.attempts, _snapshots(0), strict=True))
    ]
    results = await engine.normalizer.ingest_each(group)
    assert isinstance(results[0], RuntimeError)
    assert results[1:] == [
        IngestOutcome.ADOPTED,
        IngestOutcome.APPLIED,
        IngestOutcome.APPLIED,
        IngestOutcome.APPLIED,
    ]
    # The two deliveries' task moves together first (refused), then each alone (the failed
    # task's end is a terminal move, written at once with its settlement).
    assert calls == [sorted(run.task_ids[:2]), [poisoned], [run.task_ids[1]]]
    states = [(await harness.detail(t)).task.state for t in run.task_ids]
    assert states == [
        TaskState.RUNNING,  # the poisoned one: nothing of it committed
        TaskState.OUTPUT_FETCHING,
        TaskState.FAILED,
        TaskState.RUNNING,
        TaskState.RUNNING,
    ]
    async with harness.db.reading() as conn:
        stored = await conn.execute(
            select(provider_events.c.id).where(provider_events.c.attempt_id == run.attempts[0].id)
        )
        assert list(stored) == []  # the poisoned observation's event rolled back with it

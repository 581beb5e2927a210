"""The output step's units of work over the in-memory fake (no database at all): a claimed batch
is written in one unit besides its claim, whatever its size, and a batch whose unit raises is
written item by item, the good items committed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta

import pytest

from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.events import EventNormalizer
from controlplane.execution.output_fetch import FetchRequest, FetchResult
from controlplane.execution.output_step import OutputStep
from controlplane.persistence.memory import MemoryDatabase, MemoryUnitOfWork
from controlplane.persistence.records import NewOutboxMessage, TaskRecord
from tests.support.memory_deps import NOW, SPEC, memory_deps
from tests.support.outputs import stored_mp4


class CountingDatabase(MemoryDatabase):
    """The fake, counting the units it opens; `refuse` names a task whose move raises."""

    def __init__(self) -> None:
        super().__init__()
        self.units = 0
        self.refuse: int | None = None

    @asynccontextmanager
    async def unit(
        self, now: datetime, *, one_statement: bool = False
    ) -> AsyncIterator[MemoryUnitOfWork]:
        self.units += 1
        async with super().unit(now, one_statement=one_statement) as u:
            if self.refuse is not None:
                refused, move = self.refuse, u.move_task

                async def refusing(record: TaskRecord, *args: object, **kw: object) -> object:
                    if record.id == refused:
                        raise RuntimeError("move refused")
                    return await move(record, *args, **kw)  # type: ignore[arg-type]  # the same call, passed through

                u.move_task = refusing  # type: ignore[method-assign,assignment]  # a fault injected into this one unit
            yield u


async def _stored(request: FetchRequest) -> FetchResult:
    return stored_mp4(request.storage_key)


async def _fetching(mem: CountingDatabase, n: int) -> list[TaskRecord]:
    """`n` tasks in OUTPUT_FETCHING, each adopted attempt's job with an output and an
    ``output.fetch`` message."""
    account = mem.add_account("runway")
    tasks = []
    for i in range(n):
        task = mem.add_task(SPEC, TaskState.RUNNING)
        attempt = mem.add_attempt(task, account, AttemptState.SUCCEEDED, job_id=f"job-{i}")
        async with mem.unit(NOW) as u:
            job = await u.job_of(attempt.id)
            assert job is not None
            locator = {"outputs": [{"uri": f"https://cdn.example/{i}.mp4"}]}
            await u.update_job(job.id, output_locator=locator)
            moved = await u.move_task(
                task, TaskState.OUTPUT_FETCHING, adopted_attempt_id=attempt.id
            )
            assert moved is not None
            payload = {"task_id": task.id, "attempt_id": attempt.id}
            await u.enqueue(NewOutboxMessage(Topic.OUTPUT_FETCH, str(attempt.id), payload))
        tasks.append(moved)
    mem.units = 0
    return tasks


def _step(mem: CountingDatabase) -> OutputStep:
    deps = memory_deps(mem, NOW)
    return OutputStep(deps, _stored, EventNormalizer(deps))


async def _states(mem: CountingDatabase, tasks: list[TaskRecord]) -> list[TaskState]:
    found = await mem.tasks([t.id for t in tasks])
    return [found[t.id].state for t in tasks]


@pytest.mark.parametrize("n", [1, 5])
async def test_a_batch_is_written_in_one_unit_besides_its_claim(n: int) -> None:
    """Every delivery of a claimed batch commits in the same one unit of work."""
    mem = CountingDatabase()
    tasks = await _fetching(mem, n)

    assert await _step(mem).run_once() == n

    assert mem.units == 2  # the claim, then the batch's writes
    assert await _states(mem, tasks) == [TaskState.SUCCEEDED] * n
    async with mem.unit(NOW + timedelta(days=1)) as u:  # every message done: none due again
        assert await u.claim_messages(Topic.OUTPUT_FETCH, "w2", limit=10, lease_seconds=1) == []


async def test_a_batch_whose_unit_raises_is_written_item_by_item() -> None:
    """One item whose write raises rolls the batch's unit back; then each item is written in
    its own unit: the others are delivered, the bad one is not, and the step raises its error."""
    mem = CountingDatabase()
    tasks = await _fetching(mem, 3)
    mem.refuse = tasks[1].id

    with pytest.raises(RuntimeError, match="move refused"):
        await _step(mem).run_once()

    assert mem.units == 1 + 1 + 3  # the claim, the batch rolled back, each item alone
    assert await _states(mem, tasks) == [
        TaskState.SUCCEEDED,
        TaskState.OUTPUT_FETCHING,
        TaskState.SUCCEEDED,
    ]

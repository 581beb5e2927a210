"""Queue and task deadlines, written at CreateTask and enforced by the dispatcher's round."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from controlplane.domain.deadlines import DeadlinePolicy
from controlplane.domain.states import TaskState
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.records import TaskRecord
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.expiry import DEADLINE_FAILURE_CLASS
from controlplane.service.tasks import CreateTaskInput, TaskService
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import NOW, make_spec
from vidroute_core.spec import GenerationSpec, RoutingPolicy

POLICY = DeadlinePolicy(max_task_age_s=600.0, max_queue_delay_s=120.0)


def with_queue_delay(spec: GenerationSpec, ms: int) -> GenerationSpec:
    return replace(spec, routing=replace(spec.routing or RoutingPolicy(), max_queue_delay_ms=ms))


async def create(db: Database, spec: GenerationSpec, key: str) -> TaskRecord:
    service = TaskService(db, clock=lambda: NOW, deadlines=POLICY)
    record, _ = await service.create_task(CreateTaskInput(spec, key))
    return record


async def test_create_task_writes_both_deadlines_from_spec_and_policy(db: Database) -> None:
    """deadline_at is the platform's age limit; queue_deadline_at the user's shorter delay."""
    asked = await create(db, with_queue_delay(make_spec(), 30_000), "k-asked")
    default = await create(db, make_spec(), "k-default")
    longer = await create(db, with_queue_delay(make_spec(), 3_600_000), "k-long")

    assert asked.deadline_at == NOW + timedelta(seconds=600)
    assert asked.queue_deadline_at == NOW + timedelta(seconds=30)
    # 0 asks for the platform default; a longer ask is capped by it and by the task deadline.
    assert default.queue_deadline_at == NOW + timedelta(seconds=120)
    assert longer.queue_deadline_at == NOW + timedelta(seconds=120)
    stored = await TaskQueries(db).get_task(asked.id)
    assert stored is not None
    assert stored.task.queue_deadline_at == asked.queue_deadline_at


async def test_a_task_still_queued_past_its_queue_deadline_fails(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """Past queue_deadline_at without an attempt the task is FAILED, and never dispatched."""
    late = await create(db, with_queue_delay(make_spec("tenant-a"), 1_000), "k-late")
    fresh = await create(db, with_queue_delay(make_spec("tenant-b"), 60_000), "k-fresh")
    dispatcher = make_dispatcher(clock=lambda: NOW + timedelta(seconds=2))

    assert await dispatcher.tick() == 1  # only the fresh task is taken off the queue

    late_detail = await TaskQueries(db).get_task(late.id)
    assert late_detail is not None
    assert late_detail.task.state is TaskState.FAILED
    assert late_detail.attempts == ()
    failure = late_detail.task.failure
    assert failure is not None
    assert (failure.failure_class, failure.code) == (
        DEADLINE_FAILURE_CLASS,
        "QUEUE_DEADLINE_EXCEEDED",
    )
    fresh_detail = await TaskQueries(db).get_task(fresh.id)
    assert fresh_detail is not None
    assert fresh_detail.task.state is TaskState.SUBMITTING
    assert len(fresh_detail.attempts) == 1


async def test_a_task_before_its_queue_deadline_is_dispatched(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """One millisecond before the queue deadline the task is still routed normally."""
    task = await create(db, with_queue_delay(make_spec(), 1_000), "k-edge")
    dispatcher = make_dispatcher(clock=lambda: NOW + timedelta(milliseconds=999))
    assert await dispatcher.tick() == 1
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING


async def requeued(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory, key: str
) -> TaskRecord:
    """A task with a 1 s queue delay that had one attempt at NOW and is QUEUED again."""
    task = await create(db, with_queue_delay(make_spec(), 1_000), key)
    await make_dispatcher().tick()
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    current = detail.task
    # The attempt failed over: back to the queue as `outcomes.requeue` leaves it.
    for target in (TaskState.SCHEDULING, TaskState.QUEUED):
        async with db.unit(NOW) as u:
            assert await u.move_task_at(current.id, current.status_version, target, "FAIL_OVER")
        refreshed = await TaskQueries(db).get_task(current.id)
        assert refreshed is not None
        current = refreshed.task
    assert await catalogs.attempt_count(task.id) == 1
    return current


async def test_a_requeued_task_is_not_bound_by_its_queue_deadline(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """A task that already had an attempt is dispatched again past its queue deadline."""
    task = await requeued(db, catalogs, make_dispatcher, "k-requeued")
    assert await make_dispatcher(clock=lambda: NOW + timedelta(seconds=5)).tick() == 1
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    assert len(detail.attempts) == 2


async def test_a_requeued_task_past_its_task_deadline_fails_without_a_new_attempt(
    db: Database, catalogs: CatalogQueries, make_dispatcher: DispatcherFactory
) -> None:
    """Past deadline_at a queued task is FAILED with TASK_DEADLINE_EXCEEDED, no new attempt."""
    task = await requeued(db, catalogs, make_dispatcher, "k-expired")
    assert await make_dispatcher(clock=lambda: NOW + timedelta(seconds=600)).tick() == 0
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.FAILED
    assert detail.task.failure is not None
    assert detail.task.failure.code == "TASK_DEADLINE_EXCEEDED"
    assert len(detail.attempts) == 1

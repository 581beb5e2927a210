"""A dispatcher routes nothing until its catalog holds what the configured adapters describe:
an empty or partial catalog keeps tasks QUEUED, never fails them."""

from __future__ import annotations

from controlplane.capabilities.publish import documents_from_directory, publish_documents
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from controlplane.domain.states import TaskState
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from controlplane.scheduling.readiness import CatalogReadiness
from tests.integration.scheduling.support import (
    ACCOUNTS,
    CAPABILITY_DIRS,
    NOW,
    CompilingAdapter,
    dispatch_one,
    make_spec,
)
from tests.integration.scheduling.test_dispatcher import new_task


def bare_dispatcher(
    db: Database,
    catalogs: CatalogQueries,
    monitor: HealthMonitor,
    adapter: CompilingAdapter,
    readiness: CatalogReadiness | None = None,
) -> Dispatcher:
    """A dispatcher over a catalog nobody has published into yet."""
    return Dispatcher(
        db=db,
        catalogs=catalogs,
        leases=MemoryLeaseStore(),
        # A compile-only fake: the dispatcher calls nothing else of an AdapterClient.
        adapters=adapter.for_providers(["runway", "google", "self_hosted"]),  # type: ignore[arg-type]  # a compile-only double of AdapterClient
        monitor=monitor,
        router=RouterConfig(policy=example_policy("router-v17")),
        leader=LocalLock("readiness"),
        config=DispatcherConfig(),
        clock=lambda: NOW,
        readiness=readiness,
    )


async def publish_all(db: Database) -> None:
    docs = [d for directory in CAPABILITY_DIRS for d in documents_from_directory(directory)]
    await publish_documents(db, docs, ACCOUNTS, now=NOW, source="sidecars")


async def test_an_empty_catalog_keeps_tasks_queued(
    db: Database, catalogs: CatalogQueries, monitor: HealthMonitor, adapter: CompilingAdapter
) -> None:
    """With nothing published, rounds are skipped and the task stays QUEUED without a decision;
    once the catalog is published, the next round dispatches it."""
    dispatcher = bare_dispatcher(db, catalogs, monitor, adapter)
    task = await new_task(db, make_spec())
    for _ in range(2):
        assert await dispatcher.tick() == 0
    assert dispatcher.skipped_rounds == 2
    assert dispatcher.not_ready() == "capability catalog is empty"
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.QUEUED
    assert detail.route_decisions == ()
    await publish_all(db)
    assert await dispatcher.tick() == 1  # the round re-reads an unready catalog at once
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    assert [d.reason_code for d in detail.route_decisions] == ["SELECTED"]


async def test_the_catalog_must_hold_what_every_configured_adapter_described(
    db: Database, catalogs: CatalogQueries, monitor: HealthMonitor, adapter: CompilingAdapter
) -> None:
    """A published catalog is still not ready while a configured adapter has not described
    itself, or described an entry the catalog lacks; direct dispatches are skipped too."""
    await publish_all(db)
    dispatcher = bare_dispatcher(
        db, catalogs, monitor, adapter, CatalogReadiness(frozenset({"runway", "veo"}))
    )
    await dispatcher.catalog()
    assert dispatcher.not_ready() == "waiting for the capabilities of adapter(s) runway, veo"
    task = await new_task(db, make_spec())
    result = await dispatch_one(dispatcher, task)
    assert result.outcome.value == "SKIPPED"
    dispatcher.readiness.described("runway", [("runway", "prod-us", "gen4.5")])
    dispatcher.readiness.described("veo", [("google", "veo-prod-us", "veo-9-unpublished")])
    problem = dispatcher.not_ready()
    assert problem is not None
    assert "adapter veo describes (first: google/veo-9-unpublished/veo-prod-us)" in problem
    dispatcher.readiness.described("veo", [("google", "veo-prod-us", "veo-3.1-generate-preview")])
    assert dispatcher.not_ready() is None
    assert await dispatcher.tick() == 1
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING

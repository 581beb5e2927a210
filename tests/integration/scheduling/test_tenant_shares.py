"""The published tenants document reaches the real dispatcher (design 9.12.1-9.12.2): per-class
DRR weights, per-class in-flight caps, allowed and preferred regions, live on publish and
rollback; and CreateTask's reservation (a tenant's billing policy)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from controlplane.capabilities.catalog import load_catalog
from controlplane.domain.money import BillingPolicies
from controlplane.domain.states import TaskState
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.records import TaskRecord
from controlplane.scheduling.dispatcher import DispatcherConfig, DispatchOutcome
from controlplane.service.tasks import CreateTaskInput, TaskService
from controlplane.service.tenants import TenantAdmission, TenantBook, TenantConfigService
from controlplane.service.versioned import Release
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import NOW, make_spec
from tests.integration.scheduling.test_fair_dispatch import (
    POSTGRES_ONLY,
    _finish,
    bulk_queue,
    states_by_tenant,
)
from vidroute_core.exceptions import PreconditionFailed

pytestmark = pytest.mark.timeout(300)
WEIGHTS = {"A": 5.0, "B": 2.0, "C": 1.0}


def document(version: str, tenants: dict[str, Any]) -> str:
    return json.dumps(
        {
            "version": version,
            "default": {"service_classes": {"STANDARD": {"weight": 1}}},
            "tenants": tenants,
        }
    )


class Clock:
    """A wall clock the test moves (the tenants service's)."""

    def __init__(self) -> None:
        self.now: datetime = NOW

    def __call__(self) -> datetime:
        return self.now


def weighted(version: str) -> str:
    return document(
        version, {t: {"service_classes": {"STANDARD": {"weight": w}}} for t, w in WEIGHTS.items()}
    )


@POSTGRES_ONLY
async def test_published_weights_give_5_2_1_shares_behind_a_flood(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """Weights 5:2:1 published in a tenants document (nothing in the dispatcher's config), C
    flooding ahead: over 16 rounds of 20 the shares are within 2% of 5:2:1, Jain >= 0.99."""
    book = TenantBook(db)
    await TenantConfigService(db, book).publish(weighted("w-1"))
    await bulk_queue(db, "C", 3_000, users=3)
    await bulk_queue(db, "A", 400, users=3)
    await bulk_queue(db, "B", 200, users=3)
    dispatcher = make_dispatcher(config=DispatcherConfig(batch_size=20), tenants=book)
    dispatched: Counter[str] = Counter()
    running: list[int] = []
    original = dispatcher.dispatch_batch

    async def counting(tasks: list[TaskRecord], *args: Any, **kwargs: Any) -> Any:
        results = await original(tasks, *args, **kwargs)
        tenants = {t.id: t.tenant_id for t in tasks}
        for result in results:
            if result.outcome is DispatchOutcome.SELECTED:
                dispatched[tenants[result.task_id]] += 1
                running.append(result.task_id)
        return results

    dispatcher.dispatch_batch = counting  # type: ignore[method-assign]  # the test swaps in a recording double
    for _ in range(16):
        assert await dispatcher.tick() == 20
        await _finish(db, leases, dispatcher, running)
    total = sum(dispatched.values())
    for tenant, weight in WEIGHTS.items():
        share = dispatched[tenant] / total
        assert share == pytest.approx(weight / sum(WEIGHTS.values()), abs=0.02), dispatched
    normalised = [dispatched[t] / w for t, w in WEIGHTS.items()]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(x * x for x in normalised))
    assert jain >= 0.99, (jain, dispatched)


async def test_a_class_cap_holds_and_lifts_on_rollback_without_a_restart(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A published max_in_flight of 2 for A's STANDARD class lets only 2 of A's tasks out while
    B takes the rest of the round; rolling back to the uncapped version lets A's next ones go
    in the next round of the same dispatcher."""
    book = TenantBook(db)
    service = TenantConfigService(db, book)
    await service.publish(document("open", {}))
    capped = {"A": {"service_classes": {"STANDARD": {"max_in_flight": 2}}}}
    await service.publish(document("capped", capped))
    await bulk_queue(db, "A", 10)
    await bulk_queue(db, "B", 4)
    dispatcher = make_dispatcher(config=DispatcherConfig(batch_size=8), tenants=book)
    assert await dispatcher.tick() == 6
    states = await states_by_tenant(db)
    assert states[("A", TaskState.QUEUED.value)] == 8
    assert states[("B", TaskState.QUEUED.value)] == 0
    assert await dispatcher.tick() == 0  # A at its cap, B empty
    await service.rollback()
    assert await dispatcher.tick() == 8
    assert (await states_by_tenant(db))[("A", TaskState.QUEUED.value)] == 0


async def test_a_scheduled_cap_reaches_the_next_round_at_its_time(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A capped version scheduled for later changes nothing before its time; once the activator
    applies it, the dispatcher's next round (its per-round re-read) holds A to the cap."""
    clock = Clock()
    book = TenantBook(db)
    service = TenantConfigService(db, book, clock=clock)
    await service.publish(document("open", {}))
    capped = {"A": {"service_classes": {"STANDARD": {"max_in_flight": 2}}}}
    at = NOW + timedelta(minutes=5)
    await service.release(document("capped", capped), release=Release(activate_at=at))
    await bulk_queue(db, "A", 10)
    dispatcher = make_dispatcher(config=DispatcherConfig(batch_size=4), tenants=book)
    assert await service.documents.apply_due() == []
    assert await dispatcher.tick() == 4  # still open: a whole batch
    clock.now = at
    assert [a.version for a in await service.documents.apply_due()] == ["capped"]
    assert await dispatcher.tick() == 0  # A holds 4 >= its new cap of 2
    assert book.version == "capped"


async def test_allowed_and_preferred_regions_reach_routing(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A tenant allowed only asia-northeast1 is routed there; one preferring asia-northeast1
    over us has candidates there scored 1 on region and those in us 0.5."""
    book = TenantBook(db)
    tenants = {
        "A": {"allowed_regions": ["asia-northeast1"]},
        "B": {"preferred_regions": ["asia-northeast1", "us"]},
    }
    await TenantConfigService(db, book).publish(document("regions", tenants))
    await bulk_queue(db, "A", 1)
    await bulk_queue(db, "B", 1)
    dispatcher = make_dispatcher(config=DispatcherConfig(batch_size=2), tenants=book)
    decisions: dict[str, Any] = {}
    original = dispatcher.dispatch_batch

    async def keeping(tasks: list[TaskRecord], *args: Any, **kwargs: Any) -> Any:
        results = await original(tasks, *args, **kwargs)
        tenant = {t.id: t.tenant_id for t in tasks}
        decisions.update({tenant[r.task_id]: r.decision for r in results})
        return results

    dispatcher.dispatch_batch = keeping  # type: ignore[method-assign]  # the test swaps in a recording double
    assert await dispatcher.tick() == 2
    selected = decisions["A"].selected
    assert selected is not None
    assert selected.endswith("veo-prod-apac"), selected
    regions = {
        v.candidate.region: v.components["region"]
        for v in decisions["B"].verdicts
        if v.reason is None or v.reason == ""
    }
    assert regions == {"asia-northeast1": 1.0, "us": 0.5}, regions


async def test_a_tenants_billing_policy_replaces_the_configured_one(
    db: Database, catalogs: CatalogQueries, published: None
) -> None:
    """Billing prepaid for everyone and no credit: CreateTask is INSUFFICIENT_CREDIT, nothing
    written; once the tenants document makes the tenant postpaid, the same create goes through
    under that policy."""
    book = TenantBook(db)
    tasks = TaskService(
        db,
        clock=lambda: NOW,
        billing=BillingPolicies.parse("prepaid", []),
        catalog=lambda: load_catalog(catalogs, NOW),
        tenants=TenantAdmission(db, book),
    )
    request = CreateTaskInput(spec=make_spec("A", seconds=4), idempotency_key="k1")
    with pytest.raises(PreconditionFailed) as refused:
        await tasks.create_task(request)
    assert refused.value.reason == "INSUFFICIENT_CREDIT"
    assert await states_by_tenant(db) == Counter()
    postpaid = {"A": {"billing_policy": "postpaid:100000000"}}
    await TenantConfigService(db, book).publish(document("billing", postpaid))
    record, created = await tasks.create_task(request)
    assert created
    assert record.state is TaskState.QUEUED


async def test_a_tenants_routing_scenario_picks_the_policys_weight_set(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """B's routing scenario AD_PRODUCTION (a set of the routing policy) scores its task and is
    recorded on the decision; C names a set the policy lacks and A none: both keep their
    service class's set."""
    book = TenantBook(db)
    tenants = {"B": {"routing_scenario": "AD_PRODUCTION"}, "C": {"routing_scenario": "NOPE"}}
    await TenantConfigService(db, book).publish(document("scenarios", tenants))
    for tenant in "ABC":
        await bulk_queue(db, tenant, 1)
    dispatcher = make_dispatcher(config=DispatcherConfig(batch_size=3), tenants=book)
    decisions: dict[str, Any] = {}
    original = dispatcher.dispatch_batch

    async def keeping(tasks: list[TaskRecord], *args: Any, **kwargs: Any) -> Any:
        results = await original(tasks, *args, **kwargs)
        tenant = {t.id: t.tenant_id for t in tasks}
        decisions.update({tenant[r.task_id]: r.decision for r in results})
        return results

    dispatcher.dispatch_batch = keeping  # type: ignore[method-assign]  # the test swaps in a recording double
    assert await dispatcher.tick() == 3
    scenarios = {t: d.facts.scenario for t, d in decisions.items()}
    assert scenarios == {"A": "STANDARD", "B": "AD_PRODUCTION", "C": "STANDARD"}

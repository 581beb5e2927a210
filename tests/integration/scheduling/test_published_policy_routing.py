"""The real dispatcher follows routing policy publications round by round, on SQLite and
PostgreSQL: decisions record the published version and its shadow pick (9.25.4), a rollback
counts from the next round, and a published canary takes its stage's share of the traffic until
it is rolled back, after which it takes none (9.13.5).

Catalog: the shipped wan2.2-t2v entry twice, "wan-a" at its price and "wan-b" 25% dearer, so the
policies' scores prefer A."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.domain.routing.canary import CanaryStatus
from controlplane.domain.routing.decision import RouteDecisionSnapshot
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence import canaries as canary_store
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig, DispatchOutcome
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from controlplane.scheduling.policy_book import PolicyBook
from controlplane.service.routing_policies import RoutingPolicyService
from tests.integration.scheduling.support import NOW, ROOT, CompilingAdapter, dispatch_one
from vidroute_core.capabilities.loader import expand_for_accounts, parse_entry
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

pytestmark = pytest.mark.timeout(120)
ACCOUNT = AccountConfig("self_hosted", "gpu-a", "us", "kms://gpu/a", "127.0.0.1:7003")
A, B = "self_hosted/wan-a/gpu-a", "self_hosted/wan-b/gpu-a"
WEIGHTS = {
    "quality": 0.28,
    "success": 0.22,
    "latency": 0.18,
    "cost": 0.14,
    "capacity": 0.10,
    "region": 0.04,
    "preference": 0.04,
}
NO_COST = {**WEIGHTS, "cost": 0.0, "quality": 0.42}


def _documents() -> list[dict[str, Any]]:
    shipped = documents_from_directory(ROOT / "adapter_sidecars/selfhosted/capabilities")
    base = next(d for d in shipped if d["model"] == "wan2.2-t2v")
    out = []
    for name, micros in (("wan-a", 2800), ("wan-b", 3500)):
        doc = copy.deepcopy(base)
        doc["model"] = name
        doc["capability_version"] = f"self_hosted/{name}/2026-06-01"
        doc["commercial"]["price_version"] = f"gpu-{name}"
        doc["commercial"]["price_micros_per_output_second"] = micros
        doc["max_concurrency"] = 1000
        doc["native"]["model"] = name
        out.append(doc)
    return out


def policy(version: str, **extra: Any) -> str:
    return json.dumps({"version": version, "weights": {"default": WEIGHTS}, **extra})


class Routing:
    def __init__(self, db: Database, dispatcher: Dispatcher) -> None:
        self.db, self.dispatcher, self.n = db, dispatcher, 0

    async def route(self) -> RouteDecisionSnapshot:
        self.n += 1
        spec = GenerationSpec(
            tenant_id="acme",
            prompt=f"a red fox in snow {self.n}",
            mode=Mode.TEXT_TO_VIDEO,
            output=OutputSpec(width=1280, height=720, duration_ms=4000),
        )
        async with self.db.unit(NOW) as u:
            task, _ = await u.create_task(
                spec, idempotency_key=f"k{self.n}", spec_hash=normalized_spec_hash(spec)
            )
        result = await dispatch_one(self.dispatcher, task)
        assert result.outcome is DispatchOutcome.SELECTED
        assert result.decision is not None
        return result.decision


@pytest.fixture
async def routing(db: Database, catalogs: CatalogQueries, monitor: HealthMonitor) -> Routing:
    docs = _documents()
    await publish_documents(db, docs, [ACCOUNT], now=NOW, source="test")
    caps = expand_for_accounts([parse_entry(d) for d in docs], [("gpu-a", "us")])
    router = RouterConfig(policy=example_policy("builtin"))
    dispatcher = Dispatcher(
        db=db,
        catalogs=catalogs,
        leases=MemoryLeaseStore(),
        adapters=CompilingAdapter(capabilities=caps).for_providers(["self_hosted"]),  # type: ignore[arg-type]  # a compile-only double of AdapterClient
        monitor=monitor,
        router=router,
        leader=LocalLock("published-policy"),
        config=DispatcherConfig(),
        clock=lambda: NOW,
        policies=PolicyBook(db, router),
    )
    return Routing(db, dispatcher)


async def test_decisions_follow_publish_shadow_and_rollback(db: Database, routing: Routing) -> None:
    """Before any publish the built-in policy decides; after one, its version with its shadow
    (named by version) scored and picked; after a rollback, the earlier version, no shadow."""
    service = RoutingPolicyService(db, clock=lambda: NOW)
    first = await routing.route()
    assert (first.policy_version, first.shadow_policy_version) == ("builtin", "")
    await service.publish(json.dumps({"version": "no-cost", "weights": {"default": NO_COST}}))
    await service.publish(policy("v2", shadow="no-cost"))
    shadowed = await routing.route()
    assert (shadowed.policy_version, shadowed.selected) == ("v2", A)
    assert shadowed.shadow_policy_version == "no-cost"
    assert shadowed.shadow_selected in {A, B}
    assert set(shadowed.shadow_scores) == {A, B}
    # No cost weight: the two score alike in the shadow, unlike in the main policy.
    assert shadowed.shadow_scores[A] == pytest.approx(shadowed.shadow_scores[B], abs=1e-6)
    assert shadowed.verdict(A).score != pytest.approx(shadowed.verdict(B).score, abs=1e-6)
    stored = shadowed.to_json()
    assert stored["shadow"]["policy_version"] == "no-cost"
    await service.rollback()
    back = await routing.route()
    assert (back.policy_version, back.shadow_policy_version) == ("no-cost", "")


async def test_a_published_canary_takes_its_share_until_rolled_back(
    db: Database, routing: Routing
) -> None:
    """B as a canary at a 100% stage is chosen over the better-scoring A (admitted); once
    rolled back it is rejected as such and A is chosen."""
    service = RoutingPolicyService(db, clock=lambda: NOW)
    await service.publish(policy("canary-b", canaries={B: {"stages": [100]}}))
    admitted = await routing.route()
    assert (admitted.selected, admitted.selection_reason) == (B, "canary_admitted")
    assert admitted.verdict(B).canary
    async with db.unit(NOW) as u:
        (row,) = await canary_store.canaries(u.conn)
        assert await canary_store.move_canary(
            u.conn, row, stage=0, status=CanaryStatus.ROLLED_BACK, gates={}, now=NOW
        )
    after = await routing.route()
    assert after.selected == A
    verdict = after.verdict(B)
    assert (verdict.eligible, verdict.detail) == (False, "canary rolled back")

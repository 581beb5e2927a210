"""RoutingService.PublishRoutingPolicy / RollbackRoutingPolicy / ListRoutingPolicies /
ListCanaries over a real gRPC server with bearer tokens, on SQLite and PostgreSQL; and the
dispatcher's per-round view of them (`PolicyBook`): the active version, its shadow, its canaries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from controlplane.api.auth import hash_token, new_token
from controlplane.api.routing_servicer import RoutingServicer
from controlplane.domain import scoring
from controlplane.domain.routing.canary import ROLLED_BACK_STAGE, CanaryStatus
from controlplane.domain.routing.selection import RouterConfig
from controlplane.persistence import canaries as canary_store
from controlplane.persistence import routing_policies as store
from controlplane.persistence.database import Database
from controlplane.scheduling.policy_book import PolicyBook
from controlplane.service.replay import ReplayInput, ReplayService
from controlplane.service.routing_policies import RoutingPolicyService
from tests.integration.api.admin_api import api_channel, field_violations, rpc_error
from vidroute.scheduler.v1 import routing_pb2 as rpb
from vidroute.scheduler.v1 import routing_service_pb2 as api
from vidroute.scheduler.v1 import routing_service_pb2_grpc
from vidroute_core.exceptions import PreconditionFailed

pytestmark = pytest.mark.timeout(120)
CLOCK = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DEFAULT = {
    "quality": 0.28,
    "success": 0.22,
    "latency": 0.18,
    "cost": 0.14,
    "capacity": 0.10,
    "region": 0.04,
    "preference": 0.04,
}
CHEAP = {**DEFAULT, "quality": 0.12, "cost": 0.30}
CANARY = "runway/gen4_turbo/default"


def document(version: str, **extra: Any) -> str:
    return json.dumps({"version": version, "weights": {"default": DEFAULT}, **extra}, indent=1)


@dataclass
class Api:
    stub: Any
    tokens: dict[str, str]
    db: Database

    def md(self, who: str = "admin") -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    async def publish(self, text: str, dry_run: bool = False, who: str = "admin") -> Any:
        request = api.PublishRoutingPolicyRequest(document=text, source="test", dry_run=dry_run)
        answer = await self.stub.PublishRoutingPolicy(request, metadata=self.md(who))
        return answer.policy

    async def rollback(self, version: str = "") -> Any:
        request = api.RollbackRoutingPolicyRequest(version=version)
        return (await self.stub.RollbackRoutingPolicy(request, metadata=self.md())).policy

    async def active(self) -> list[tuple[str, bool]]:
        answer = await self.stub.ListRoutingPolicies(
            api.ListRoutingPoliciesRequest(), metadata=self.md()
        )
        return [(p.version, p.active) for p in answer.policies]

    async def canaries(self) -> dict[str, Any]:
        answer = await self.stub.ListCanaries(api.ListCanariesRequest(), metadata=self.md())
        return {c.candidate_id: c for c in answer.canaries}


@pytest.fixture
async def routing(db: Database) -> AsyncIterator[Api]:
    tokens = {"alpha": new_token(), "admin": new_token()}
    entries = [
        f"{hash_token(tokens['alpha'])}=tenant:alpha",
        f"{hash_token(tokens['admin'])}=admin",
    ]

    service = RoutingPolicyService(db, clock=lambda: CLOCK)
    async with api_channel(db, entries, routing=RoutingServicer(policies=service)) as channel:
        yield Api(routing_service_pb2_grpc.RoutingServiceStub(channel), tokens, db)


async def test_publish_versions_one_active_and_rollback_is_one_call(routing: Api) -> None:
    """Each publish is a new active version (the old kept); rollback with no version goes to
    the one published before the active one, with a version to that one."""
    first = await routing.publish(document("v1"))
    assert (first.version, first.active, first.source) == ("v1", True, "test")
    assert first.document == document("v1")
    await routing.publish(document("v2"))
    await routing.publish(document("v3"))
    assert await routing.active() == [("v3", True), ("v2", False), ("v1", False)]
    assert (await routing.rollback()).version == "v2"
    assert await routing.active() == [("v3", False), ("v2", True), ("v1", False)]
    assert (await routing.rollback()).version == "v1"
    exc = await rpc_error(routing.rollback())
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (await routing.rollback("v3")).version == "v3"
    assert await routing.active() == [("v3", True), ("v2", False), ("v1", False)]
    exc = await rpc_error(routing.rollback("v9"))
    assert exc.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_documents_are_refused_and_change_nothing(routing: Api) -> None:
    """A bad document, a reused version with other text, a shadow naming an unknown version
    and a tenant caller are refused; a dry run and a retried publish write nothing."""
    await routing.publish(document("v1"))
    bad = document("v2", hysteresis_delta=3, canaries={CANARY: {"stages": [5, 2]}})
    exc = await rpc_error(routing.publish(bad))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(exc)) == {"hysteresis_delta", f'canaries["{CANARY}"].stages[1]'}
    exc = await rpc_error(routing.publish(document("v1", min_dwell_s=5)))
    assert "immutable" in field_violations(exc)["version"]
    exc = await rpc_error(routing.publish(document("v2", shadow="nope")))
    assert "not published" in field_violations(exc)["shadow"]
    exc = await rpc_error(routing.publish(document("v2"), who="alpha"))
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    dry = await routing.publish(document("v2"), dry_run=True)
    assert (dry.version, dry.active) == ("v2", False)
    again = await routing.publish(document("v1"))
    assert again.version == "v1"
    assert await routing.active() == [("v1", True)]


async def test_canaries_start_keep_and_restart_with_their_config(routing: Api) -> None:
    """A published canary starts ACTIVE at its first stage; a republish with the same config
    keeps its state, a changed config restarts it; every start is in its history."""
    canaries = {CANARY: {"stages": [0.5, 2, 5, 10], "gates": {"min_samples": 5}}}
    await routing.publish(document("v1", canaries=canaries))
    state = (await routing.canaries())[CANARY]
    assert state.status == rpb.CANARY_STATUS_ACTIVE
    assert list(state.stages) == [0.5, 2, 5, 10]
    assert state.traffic_percent == 0.5
    assert [(t.action, t.to_percent) for t in state.history] == [("STARTED", 0.5)]
    async with routing.db.unit(CLOCK) as u:  # as the leader's gatekeeper would
        row = (await canary_store.canaries(u.conn))[0]
        moved = await canary_store.move_canary(
            u.conn,
            row,
            stage=1,
            status=CanaryStatus.ACTIVE,
            gates={"success_rate": True},
            now=CLOCK,
        )
    assert moved
    await routing.publish(document("v2", canaries=canaries))
    state = (await routing.canaries())[CANARY]
    assert (state.traffic_percent, dict(state.gates)) == (2.0, {"success_rate": True})
    canaries[CANARY]["stages"] = [1, 50]
    await routing.publish(document("v3", canaries=canaries))
    state = (await routing.canaries())[CANARY]
    assert (list(state.stages), state.traffic_percent) == ([1.0, 50.0], 1.0)
    assert [t.action for t in state.history] == ["STARTED", "STARTED"]


async def test_policy_book_follows_publish_rollback_and_canaries(db: Database) -> None:
    """The dispatcher's round view: the fallback before any publish, the published policy with
    its shadow (by version) after, the rolled-back-to one after a rollback; canary stages of the
    active document (a rolled back canary is -1, a promoted one is a normal candidate)."""
    service = RoutingPolicyService(db, clock=lambda: CLOCK)
    base = RouterConfig(policy=scoring.example_policy("builtin"))
    book = PolicyBook(db, base)
    router, stages = await book.refresh()
    assert (router.policy.version, router.shadow_policy, dict(stages)) == ("builtin", None, {})
    await service.publish(json.dumps({"version": "cheap", "weights": {"default": CHEAP}}))
    other: dict[str, Any] = {"canaries": {CANARY: {}, "veo/veo-3/default": {}}}
    await service.publish(document("main", shadow="cheap", **other))
    router, stages = await book.refresh()
    assert router.policy.version == "main"
    assert router.shadow_policy is not None
    assert router.shadow_policy.weights_for("default").cost == 0.30
    assert dict(stages) == {CANARY: 0, "veo/veo-3/default": 0}
    assert set(router.policy.canaries) == {CANARY, "veo/veo-3/default"}
    async with db.unit(CLOCK) as u:
        rows = {r.candidate_id: r for r in await canary_store.canaries(u.conn)}
        later = CLOCK + timedelta(minutes=1)
        await canary_store.move_canary(
            u.conn, rows[CANARY], stage=0, status=CanaryStatus.ROLLED_BACK, gates={}, now=later
        )
        await canary_store.move_canary(
            u.conn,
            rows["veo/veo-3/default"],
            stage=0,
            status=CanaryStatus.PROMOTED,
            gates={},
            now=later,
        )
    router, stages = await book.refresh()
    assert dict(stages) == {CANARY: ROLLED_BACK_STAGE}
    await service.rollback()
    router, stages = await book.refresh()
    assert (router.policy.version, router.shadow_policy, dict(stages)) == ("cheap", None, {})


async def test_a_rollback_restarts_a_canary_another_version_reconfigured(routing: Api) -> None:
    """Rolling back to a version whose canary a later one reconfigured (and advanced) restarts
    it at the rolled-back-to version's first stage with its own stages, recorded; rolling back
    to a version with the canary's current config keeps its state."""
    await routing.publish(document("v1", canaries={CANARY: {"stages": [0.5, 2, 5, 10]}}))
    await routing.publish(document("v2", canaries={CANARY: {"stages": [50, 100]}}))
    async with routing.db.unit(CLOCK) as u:  # the leader advances v2's canary
        row = (await canary_store.canaries(u.conn))[0]
        await canary_store.move_canary(
            u.conn, row, stage=1, status=CanaryStatus.ACTIVE, gates={}, now=CLOCK
        )
    await routing.publish(document("v3", canaries={CANARY: {"stages": [50, 100]}}))
    assert (await routing.canaries())[CANARY].traffic_percent == 100.0
    assert (await routing.rollback("v2")).version == "v2"  # same config: kept
    assert (await routing.canaries())[CANARY].traffic_percent == 100.0
    assert (await routing.rollback("v1")).version == "v1"
    state = (await routing.canaries())[CANARY]
    assert (list(state.stages), state.traffic_percent) == ([0.5, 2, 5, 10], 0.5)
    assert state.status == rpb.CANARY_STATUS_ACTIVE
    last = state.history[-1]
    assert (last.action, last.reason, last.to_percent) == ("STARTED", "rollback to v1", 0.5)


async def test_publications_at_the_same_moment_all_land_one_active(db: Database) -> None:
    """Six publishes of different versions, three of one version and a rollback, all at once,
    each succeed (none breaks the one-active index or the version key): eight versions, one of
    them active, the same-version publishes answering one row."""
    service = RoutingPolicyService(db, clock=lambda: CLOCK)
    await service.publish(document("base"))
    results = await asyncio.gather(
        *(service.publish(document(f"c{n}")) for n in range(6)),
        *(service.publish(document("same")) for _ in range(3)),
        service.rollback("base"),
    )
    assert {r.version for r in results[6:9]} == {"same"}
    rows = await service.list_policies()
    assert sorted(r.version for r in rows) == sorted(["base", "same", *(f"c{n}" for n in range(6))])
    assert sum(r.active for r in rows) == 1


async def test_an_api_only_replica_refuses_what_it_cannot_check(db: Database) -> None:
    """Without a scheduler to compile against, a file with samples or canaries is refused as
    FAILED_PRECONDITION POLICY_CHECK_UNAVAILABLE (published or replayed), nothing written; a
    file with neither publishes."""
    service = RoutingPolicyService(db, clock=lambda: CLOCK, require_check=True)
    output = {"width": 1280, "height": 720, "duration_ms": 4000}
    sample: dict[str, Any] = {"tenant_id": "t", "prompt": "p", "mode": "TEXT_TO_VIDEO"}
    sample["output"] = output
    extras: list[dict[str, Any]] = [{"canaries": {CANARY: {}}}, {"samples": [sample]}]
    for extra in extras:
        with pytest.raises(PreconditionFailed) as refused:
            await service.publish(document("v1", **extra))
        assert refused.value.reason == "POLICY_CHECK_UNAVAILABLE"
        with pytest.raises(PreconditionFailed):
            await ReplayService(db, validate=service.validate).replay(
                ReplayInput(document("v1", **extra))
            )
    assert await service.list_policies() == []
    assert (await service.publish(document("v1"))).version == "v1"


async def test_every_activation_is_recorded_with_its_caller(routing: Api) -> None:
    """Publications and rollbacks each leave an activation row (version, the one it replaced,
    PUBLISHED or ROLLED_BACK, the caller, the time), also when a version is activated twice; a
    rollback to the active version and a retried publish record nothing."""
    await routing.publish(document("v1"))
    await routing.publish(document("v2"))
    await routing.rollback()
    await routing.rollback("v2")
    await routing.rollback("v2")  # already active: nothing changes
    await routing.publish(document("v2"))  # a retried publish
    async with routing.db.reading() as conn:
        rows = await store.activations(conn)
    assert [(r.version, r.previous_version, r.action) for r in rows] == [
        ("v1", None, "PUBLISHED"),
        ("v2", "v1", "PUBLISHED"),
        ("v1", "v2", "ROLLED_BACK"),
        ("v2", "v1", "ROLLED_BACK"),
    ]
    assert all(r.actor.startswith("admin:") for r in rows), rows  # the token's admin
    assert {r.at for r in rows} == {CLOCK}

"""TenantService (Get / Publish / Rollback / ListTenantConfigHistory) and CreateTask's tenant
gate over a real gRPC server with bearer tokens, on SQLite and PostgreSQL: versions, audit,
field violations, entitlement, the CreateTask rate limit and the queued cap, each refusal
leaving nothing written, each publication used without a restart."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from sqlalchemy import func, select

from controlplane.api.auth import hash_token, new_token
from controlplane.api.servicer import SchedulerServicer
from controlplane.api.tenant_servicer import TenantServicer
from controlplane.domain.safety import SafetyPolicy
from controlplane.persistence.database import Database
from controlplane.persistence.models import generation_tasks
from controlplane.rate_limits import InProcessRateLimiter
from controlplane.service.tasks import TaskService
from controlplane.service.tenants import TenantAdmission, TenantBook, TenantConfigService
from tests.integration.api.admin_api import api_channel, rpc_error
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_service_pb2 as sapi
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc, tenant_service_pb2_grpc
from vidroute.scheduler.v1 import tenant_pb2 as tpb
from vidroute.scheduler.v1 import tenant_service_pb2 as api

pytestmark = pytest.mark.timeout(120)
CLOCK = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
SAFETY = SafetyPolicy.from_mapping(
    {"version": "safety-1", "profiles": {"strict": {"max_duration_ms": 2000}}}
)


def document(version: str, **tenants: Any) -> str:
    body = {
        "version": version,
        "default": {"service_classes": {"STANDARD": {"weight": 1}, "BATCH": {"weight": 1}}},
        "tenants": tenants,
    }
    return json.dumps(body, indent=1)


class Clock:
    """A monotonic clock the test moves (the rate limiter's)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Api:
    tenants: Any
    tasks: Any
    tokens: dict[str, str]
    db: Database
    clock: Clock

    def md(self, who: str = "admin") -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    async def publish(self, text: str, dry_run: bool = False, who: str = "admin") -> Any:
        request = api.PublishTenantConfigRequest(document=text, source="t.yaml", dry_run=dry_run)
        return (await self.tenants.PublishTenantConfig(request, metadata=self.md(who))).config

    async def rollback(self, version: str = "") -> Any:
        request = api.RollbackTenantConfigRequest(version=version)
        return (await self.tenants.RollbackTenantConfig(request, metadata=self.md())).config

    async def get(self, version: str = "") -> Any:
        request = api.GetTenantConfigRequest(version=version)
        return (await self.tenants.GetTenantConfig(request, metadata=self.md())).config

    async def history(self) -> Any:
        request = api.ListTenantConfigHistoryRequest()
        return await self.tenants.ListTenantConfigHistory(request, metadata=self.md())

    async def create(
        self, who: str, key: str, cls: gen.ServiceClass.ValueType = gen.SERVICE_CLASS_STANDARD
    ) -> Any:
        spec = gen.GenerationSpec(
            tenant_id=who,
            prompt="a red kite",
            mode=gen.MODE_TEXT_TO_VIDEO,
            output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
            service_class=cls,
        )
        request = sapi.CreateTaskRequest(spec=spec, idempotency_key=key)
        return await self.tasks.CreateTask(request, metadata=self.md(who))

    async def rows(self) -> int:
        async with self.db.reading() as conn:
            return int(
                (
                    await conn.execute(select(func.count()).select_from(generation_tasks))
                ).scalar_one()
            )


@pytest.fixture
async def stack(db: Database) -> AsyncIterator[Api]:
    tokens = {name: new_token() for name in ("greedy", "honest", "vip", "admin")}
    entries = [f"{hash_token(tokens[t])}=tenant:{t}" for t in ("greedy", "honest", "vip")]
    entries.append(f"{hash_token(tokens['admin'])}=admin")

    clock = Clock()
    book = TenantBook(db)
    admission = TenantAdmission(db, book, limiter=InProcessRateLimiter(clock=clock))
    async with api_channel(
        db,
        entries,
        scheduler=SchedulerServicer(TaskService(db, safety=SAFETY, tenants=admission)),
        tenants=TenantServicer(TenantConfigService(db, book, clock=lambda: CLOCK, safety=SAFETY)),
    ) as channel:
        yield Api(
            tenant_service_pb2_grpc.TenantServiceStub(channel),
            scheduler_service_pb2_grpc.SchedulerServiceStub(channel),
            tokens,
            db,
            clock,
        )


def _details(exc: grpc.aio.AioRpcError) -> list[Any]:
    raw = dict(exc.trailing_metadata() or ())["grpc-status-details-bin"]
    return list(status_pb2.Status.FromString(raw).details)


def _unpack(exc: grpc.aio.AioRpcError, kind: type[Any]) -> Any:
    for detail in _details(exc):
        out = kind()
        if detail.Unpack(out):
            return out
    raise AssertionError(f"no {kind.__name__} in {exc}")


async def test_builtin_then_publish_rollback_and_an_audited_history(stack: Api) -> None:
    """Before any publish Get shows the built-in document; each publish is a new active
    version; a rollback is one call; the history names who replaced what, when."""
    builtin = await stack.get()
    assert (builtin.version, builtin.active) == ("tenants-builtin", True)
    assert "INTERACTIVE" in builtin.document
    first = await stack.publish(document("t1"))
    assert (first.version, first.active, first.source) == ("t1", True, "t.yaml")
    await stack.publish(document("t2"))
    assert (await stack.get()).version == "t2"
    assert (await stack.get("t1")).document == document("t1")
    assert (await stack.rollback()).version == "t1"
    assert (await stack.get()).version == "t1"
    assert (await stack.rollback("t2")).version == "t2"
    history = await stack.history()
    assert [(v.version, v.active) for v in history.versions] == [("t2", True), ("t1", False)]
    assert [(a.version, a.previous_version, a.action) for a in history.activations] == [
        ("t1", "", tpb.TENANT_CONFIG_ACTION_PUBLISHED),
        ("t2", "t1", tpb.TENANT_CONFIG_ACTION_PUBLISHED),
        ("t1", "t2", tpb.TENANT_CONFIG_ACTION_ROLLED_BACK),
        ("t2", "t1", tpb.TENANT_CONFIG_ACTION_ROLLED_BACK),
    ]
    assert {a.actor.partition(":")[0] for a in history.activations} == {"admin"}
    assert history.activations[0].at.ToDatetime(UTC) == CLOCK
    assert (await rpc_error(stack.rollback("t9"))).code() == grpc.StatusCode.NOT_FOUND
    assert (await rpc_error(stack.get("t9"))).code() == grpc.StatusCode.NOT_FOUND


async def test_bad_documents_and_callers_are_refused_and_change_nothing(stack: Api) -> None:
    """Field violations by path, an immutable version, a tenant caller and an empty rollback
    are refused; a dry run and a retried publish write nothing."""
    exc = await rpc_error(stack.rollback())
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    await stack.publish(document("t1"))
    bad = document("t2", acme={"service_classes": {"STANDARD": {"weight": -1}}, "colour": 1})
    exc = await rpc_error(stack.publish(bad))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    fields = {v.field for v in _unpack(exc, error_details_pb2.BadRequest).field_violations}
    assert fields == {"tenants.acme.service_classes.STANDARD.weight", "tenants.acme.colour"}
    exc = await rpc_error(stack.publish(document("t1", acme={})))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "immutable" in (exc.details() or "")
    exc = await rpc_error(stack.publish(document("t2"), who="greedy"))
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    dry = await stack.publish(document("t2"), dry_run=True)
    assert (dry.version, dry.active) == ("t2", False)
    assert (await stack.publish(document("t1"))).active
    history = await stack.history()
    assert [v.version for v in history.versions] == ["t1"]
    assert len(history.activations) == 1


async def test_a_class_the_tenant_is_not_entitled_to_is_refused_with_nothing_written(
    stack: Api,
) -> None:
    """With only vip entitled to INTERACTIVE, greedy's INTERACTIVE task is PERMISSION_DENIED
    naming the classes it may use, and no row is written; vip's goes through; a publication
    that entitles greedy lets its next request through without a restart."""
    assert (await stack.create("greedy", "k0", gen.SERVICE_CLASS_INTERACTIVE)).created
    vip = {"service_classes": {"INTERACTIVE": {"weight": 4}, "STANDARD": {"weight": 4}}}
    await stack.publish(document("t1", vip=vip))
    exc = await rpc_error(stack.create("greedy", "k1", gen.SERVICE_CLASS_INTERACTIVE))
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "entitled: STANDARD, BATCH" in (exc.details() or "")
    info = _unpack(exc, error_details_pb2.ErrorInfo)
    assert info.reason == "SERVICE_CLASS_NOT_ENTITLED"
    assert info.metadata["entitled_service_classes"] == "STANDARD,BATCH"
    assert await stack.rows() == 1
    assert (await stack.create("greedy", "k2", gen.SERVICE_CLASS_STANDARD)).created
    assert (await stack.create("vip", "k3", gen.SERVICE_CLASS_INTERACTIVE)).created
    await stack.publish(document("t2", vip=vip, greedy=vip))
    assert (await stack.create("greedy", "k1", gen.SERVICE_CLASS_INTERACTIVE)).created
    assert await stack.rows() == 4


async def test_a_flooding_tenant_is_rate_limited_and_others_are_not(stack: Api) -> None:
    """greedy's CreateTask rate (burst 3, 1/s): its 4th create is RESOURCE_EXHAUSTED with
    RetryInfo and writes nothing, honest creates on, and greedy may create again a second
    later."""
    rate = {"create_rate": {"per_second": 1, "burst": 3}}
    await stack.publish(document("t1", greedy=rate))
    for i in range(3):
        assert (await stack.create("greedy", f"g{i}")).created
    exc = await rpc_error(stack.create("greedy", "g3"))
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    retry = _unpack(exc, error_details_pb2.RetryInfo)
    assert retry.retry_delay.ToNanoseconds() == 1_000_000_000
    assert _unpack(exc, error_details_pb2.ErrorInfo).reason == "RATE_LIMITED"
    assert await stack.rows() == 3
    for i in range(5):
        assert (await stack.create("honest", f"h{i}")).created
    stack.clock.now += 1.0
    assert (await stack.create("greedy", "g3")).created
    assert await stack.rows() == 9


async def test_a_full_class_queue_is_failed_precondition_with_the_numbers(stack: Api) -> None:
    """At its max_queued of 2 STANDARD tasks, greedy's third is FAILED_PRECONDITION with the
    queued count and the cap, nothing written; its BATCH class has no cap."""
    capped = {"service_classes": {"STANDARD": {"max_queued": 2}, "BATCH": {}}}
    await stack.publish(document("t1", greedy=capped))
    for i in range(2):
        assert (await stack.create("greedy", f"g{i}")).created
    exc = await rpc_error(stack.create("greedy", "g2"))
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = _unpack(exc, error_details_pb2.ErrorInfo)
    assert (info.reason, info.metadata["queued"], info.metadata["max_queued"]) == (
        "TENANT_QUEUE_FULL",
        "2",
        "2",
    )
    assert await stack.rows() == 2
    assert (await stack.create("greedy", "b0", gen.SERVICE_CLASS_BATCH)).created


async def test_a_safety_profile_tightens_a_tenants_rules(stack: Api) -> None:
    """A profile the safety policy lacks is refused at publication by its path; with greedy on
    the strict profile (2 s at most) its 4 s task is SAFETY_POLICY_VIOLATION, nothing written,
    while honest's 4 s task is created."""
    exc = await rpc_error(stack.publish(document("t1", greedy={"safety_profile": "lenient"})))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    fields = {v.field for v in _unpack(exc, error_details_pb2.BadRequest).field_violations}
    assert fields == {"tenants.greedy.safety_profile"}
    await stack.publish(document("t2", greedy={"safety_profile": "strict"}))
    exc = await rpc_error(stack.create("greedy", "g0"))
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _unpack(exc, error_details_pb2.ErrorInfo).reason == "SAFETY_POLICY_VIOLATION"
    assert await stack.rows() == 0
    assert (await stack.create("honest", "h0")).created


async def test_the_release_options_over_grpc(stack: Api) -> None:
    """Publish returns the diff by path; staged is activated by ActivateTenantConfig with its
    reason; activate_at schedules (a pending SCHEDULED activation in the history); a past
    activate_at is INVALID_ARGUMENT naming it; a tenant caller may not activate."""
    await stack.publish(document("t1", acme={"service_classes": {"STANDARD": {"weight": 2}}}))
    staged = api.PublishTenantConfigRequest(
        document=document("t2", acme={"service_classes": {"STANDARD": {"weight": 5}}}),
        staged=True,
        reason="heavier acme",
    )
    reply = await stack.tenants.PublishTenantConfig(staged, metadata=stack.md())
    assert not reply.config.active
    assert not reply.HasField("activate_at")
    assert [(c.path, c.before, c.after) for c in reply.changes] == [
        ("tenants.acme.service_classes.STANDARD.weight", "2", "5"),
        ("version", "t1", "t2"),
    ]
    activate = api.ActivateTenantConfigRequest(version="t2", reason="go")
    denied = await rpc_error(stack.tenants.ActivateTenantConfig(activate, metadata=stack.md("vip")))
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
    done = await stack.tenants.ActivateTenantConfig(activate, metadata=stack.md())
    assert done.config.active
    later = api.PublishTenantConfigRequest(document=document("t3"))
    later.activate_at.FromDatetime(CLOCK + timedelta(hours=1))
    reply = await stack.tenants.PublishTenantConfig(later, metadata=stack.md())
    assert reply.activate_at.ToDatetime(UTC) == CLOCK + timedelta(hours=1)
    assert not reply.config.active
    past = api.PublishTenantConfigRequest(document=document("t4"))
    past.activate_at.FromDatetime(CLOCK - timedelta(seconds=1))
    refused = await rpc_error(stack.tenants.PublishTenantConfig(past, metadata=stack.md()))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = _unpack(refused, error_details_pb2.BadRequest).field_violations
    assert [v.field for v in violations] == ["activate_at"]
    history = await stack.history()
    assert [(a.version, a.action, a.pending, a.reason) for a in history.activations] == [
        ("t1", tpb.TENANT_CONFIG_ACTION_PUBLISHED, False, ""),
        ("t2", tpb.TENANT_CONFIG_ACTION_ACTIVATED, False, "go"),
        ("t3", tpb.TENANT_CONFIG_ACTION_SCHEDULED, True, ""),
    ]
    assert history.activations[2].requested_at.ToDatetime(UTC) == CLOCK
    assert (await stack.get()).version == "t2"

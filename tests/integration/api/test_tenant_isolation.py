"""The attack suite of the public API: two tenants and an admin against a real gRPC server.

Task ids are sequential integers, so the scoping itself must be the defence: a tenant that walks
every id, watches, cancels, explains and lists sees none of the other tenant's tasks (NOT_FOUND,
worded as for an id that never existed), admin RPCs need the admin role, and a call without a
valid bearer token is UNAUTHENTICATED before any handler runs. Health and reflection stay open.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.api.servicer import SchedulerServicer
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.access import Caller
from controlplane.service.outputs import OutputService
from controlplane.service.providers import ForceBreakerInput, ProviderAdminService
from controlplane.service.tasks import TaskService
from controlplane.storage.filesystem import FilesystemObjectStore
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc
from vidroute_core.exceptions import PermissionDenied

pytestmark = pytest.mark.timeout(120)
TASKS_PER_TENANT = 6


@dataclass
class Api:
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub  # the .pyi's name, typing only
    channel: grpc.aio.Channel
    tokens: dict[str, str]  # who -> token

    def md(self, who: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)


@pytest.fixture
async def attack(tmp_path: Path) -> AsyncIterator[Api]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    await upgrade(url)
    db = Database.from_url(url)
    tokens = {"alpha": new_token(), "beta": new_token(), "admin": new_token()}
    entries = parse_entries(
        [
            f"{hash_token(tokens['alpha'])}=tenant:alpha",
            f"{hash_token(tokens['beta'])}=tenant:beta,{hash_token(tokens['admin'])}=admin",
        ]
    )

    async def probe() -> bool:
        await db.ping()
        return True

    tasks = TaskService(db, watch_poll_interval_s=0.05)
    outputs = OutputService(tasks, FilesystemObjectStore(tmp_path / "objects"))
    running: ControlPlaneServer = await start_server(
        SchedulerServicer(tasks, outputs=outputs),
        listen="127.0.0.1:0",
        probe=probe,
        cleanup=[db.dispose],
        auth=Authenticator(entries),
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield Api(scheduler_service_pb2_grpc.SchedulerServiceStub(channel), channel, tokens)
    await running.stop(grace=1)


def _spec(tenant: str) -> gen.GenerationSpec:
    return gen.GenerationSpec(
        tenant_id=tenant,
        prompt="a red kite",
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
    )


async def _code(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]  # any stub call's awaitable, typed object
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _error(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]  # any stub call's awaitable, typed object
    return info.value


async def _create(a: Api, who: str, tenant: str, key: str) -> str:
    reply = await a.stub.CreateTask(
        api.CreateTaskRequest(spec=_spec(tenant), idempotency_key=key), metadata=a.md(who)
    )
    return str(reply.task.task_id)


async def _populate(a: Api) -> dict[str, list[str]]:
    owned: dict[str, list[str]] = {"alpha": [], "beta": []}
    for n in range(TASKS_PER_TENANT):  # interleaved: the ids of the two tenants alternate
        for tenant, ids in owned.items():
            # The same key in both tenants: keys are per tenant, neither sees the other's.
            ids.append(await _create(a, tenant, tenant, f"key-{n}"))
    return owned


async def _list_all(a: Api, who: str, tenant: str = "") -> list[pb.Task]:
    seen: list[pb.Task] = []
    token = ""
    while True:
        page = await a.stub.ListTasks(
            api.ListTasksRequest(tenant_id=tenant, page_size=4, page_token=token),
            metadata=a.md(who),
        )
        seen.extend(page.tasks)
        token = page.next_page_token
        if not token:
            return seen


def _shape(text: str) -> str:
    return re.sub(r"\d+", "N", text)


async def test_no_cross_tenant_read_watch_cancel_explain_or_list(attack: Api) -> None:
    """Walking every id, each tenant reaches only its own tasks (read, watch, cancel, explain,
    outputs and their URLs, webhook deliveries); the rest read as nonexistent."""
    a = attack
    owned = await _populate(a)
    highest = max(int(t) for ids in owned.values() for t in ids)
    never = str(highest + 1000)
    leaks = 0
    for who, other in (("alpha", "beta"), ("beta", "alpha")):
        missing = await _error(
            a.stub.GetTask(api.GetTaskRequest(task_id=never), metadata=a.md(who))
        )
        for task_id in map(str, range(1, highest + 1)):
            mine = task_id in owned[who]
            for call in (
                a.stub.GetTask(api.GetTaskRequest(task_id=task_id), metadata=a.md(who)),
                a.stub.ExplainRoute(api.ExplainRouteRequest(task_id=task_id), metadata=a.md(who)),
            ):
                code = await _code(call)
                leaks += code is not (grpc.StatusCode.OK if mine else grpc.StatusCode.NOT_FOUND)
            if mine:
                continue
            err = await _error(
                a.stub.GetTask(api.GetTaskRequest(task_id=task_id), metadata=a.md(who))
            )
            assert (err.code(), _shape(err.details() or "")) == (
                missing.code(),
                _shape(missing.details() or ""),
            )
            watch = a.stub.WatchTask(api.WatchTaskRequest(task_id=task_id), metadata=a.md(who))
            try:
                events = [reply async for reply in watch]
                leaks += 1 + len(events)
            except grpc.aio.AioRpcError as exc:
                leaks += exc.code() is not grpc.StatusCode.NOT_FOUND
            cancel = a.stub.CancelTask(
                api.CancelTaskRequest(task_id=task_id, reason="hostile"), metadata=a.md(who)
            )
            leaks += await _code(cancel) is not grpc.StatusCode.NOT_FOUND
            output = a.stub.GetOutput(api.GetOutputRequest(task_id=task_id), metadata=a.md(who))
            try:
                chunks = [reply async for reply in output]
                leaks += 1 + len(chunks)
            except grpc.aio.AioRpcError as exc:
                leaks += exc.code() is not grpc.StatusCode.NOT_FOUND
            for unary in (
                a.stub.GetOutputUrl(api.GetOutputUrlRequest(task_id=task_id), metadata=a.md(who)),
                a.stub.ListWebhookDeliveries(
                    api.ListWebhookDeliveriesRequest(task_id=task_id), metadata=a.md(who)
                ),
            ):
                leaks += await _code(unary) is not grpc.StatusCode.NOT_FOUND
        listed = await _list_all(a, who)
        assert sorted(t.task_id for t in listed) == sorted(owned[who])
        leaks += sum(t.spec.tenant_id != who for t in listed)
        asked_other = a.stub.ListTasks(api.ListTasksRequest(tenant_id=other), metadata=a.md(who))
        assert await _code(asked_other) is grpc.StatusCode.PERMISSION_DENIED
    assert leaks == 0
    # The hostile cancels changed nothing: every task is still queued, as the admin sees.
    everything = await _list_all(a, "admin")
    assert len(everything) == 2 * TASKS_PER_TENANT
    assert {t.state for t in everything} == {pb.TASK_STATE_QUEUED}
    assert len(await _list_all(a, "admin", "beta")) == TASKS_PER_TENANT


async def test_create_only_in_the_callers_own_tenant_unless_admin(attack: Api) -> None:
    """A tenant creating in another tenant is PERMISSION_DENIED and writes nothing; an admin may."""
    a = attack
    foreign = a.stub.CreateTask(
        api.CreateTaskRequest(spec=_spec("beta"), idempotency_key="x1"), metadata=a.md("alpha")
    )
    assert await _code(foreign) is grpc.StatusCode.PERMISSION_DENIED
    assert await _list_all(a, "admin") == []
    task_id = await _create(a, "admin", "beta", "x1")
    assert [t.task_id for t in await _list_all(a, "beta")] == [task_id]
    got = await a.stub.GetTask(api.GetTaskRequest(task_id=task_id), metadata=a.md("admin"))
    assert got.task.spec.tenant_id == "beta"


async def test_admin_rpcs_need_the_admin_role(attack: Api) -> None:
    """ListProviders, GetProviderHealth and ForceBreaker are PERMISSION_DENIED for tenants."""
    a = attack
    calls: dict[str, Callable[[tuple[tuple[str, str], ...]], object]] = {
        "ListProviders": lambda md: a.stub.ListProviders(api.ListProvidersRequest(), metadata=md),
        "GetProviderHealth": lambda md: a.stub.GetProviderHealth(
            api.GetProviderHealthRequest(provider="runway"), metadata=md
        ),
        "ForceBreaker": lambda md: a.stub.ForceBreaker(
            api.ForceBreakerRequest(
                provider="runway", account="a", region="r", state=pb.BREAKER_STATE_OPEN, reason="x"
            ),
            metadata=md,
        ),
    }
    for name, call in calls.items():
        for tenant in ("alpha", "beta"):
            assert await _code(call(a.md(tenant))) is grpc.StatusCode.PERMISSION_DENIED, name
        # This server runs no scheduler: past the role check the admin meets UNIMPLEMENTED.
        assert await _code(call(a.md("admin"))) is grpc.StatusCode.UNIMPLEMENTED, name


async def test_the_admin_service_itself_refuses_tenant_callers() -> None:
    """The role check lives in the service, so no other entry point can skip it."""
    admin = ProviderAdminService(catalog=None, monitor=None)  # type: ignore[arg-type]  # the role check refuses before either is used
    tenant = Caller.tenant("alpha")
    for attempt in (
        admin.list_providers(tenant),
        admin.provider_health("runway", tenant),
        admin.force_breaker(ForceBreakerInput("p", "a", "r", "", "SUBMIT", None, "x"), tenant),
    ):
        with pytest.raises(PermissionDenied):
            await attempt


async def test_calls_without_a_valid_token_are_unauthenticated(attack: Api) -> None:
    """No token, a wrong one, another scheme or a bare digest: UNAUTHENTICATED on every RPC."""
    a = attack
    task_id = await _create(a, "alpha", "alpha", "k")
    bad_metadata: list[tuple[tuple[str, str], ...]] = [
        (),
        (("authorization", f"Bearer {new_token()}"),),
        (("authorization", f"Basic {a.tokens['admin']}"),),
        (("authorization", "Bearer"),),
        (("authorization", f"Bearer {hash_token(a.tokens['admin'])}"),),
        (("x-api-key", a.tokens["admin"]),),
    ]
    for md in bad_metadata:
        calls = [
            a.stub.CreateTask(
                api.CreateTaskRequest(spec=_spec("alpha"), idempotency_key="u"), metadata=md
            ),
            a.stub.GetTask(api.GetTaskRequest(task_id=task_id), metadata=md),
            a.stub.ListTasks(api.ListTasksRequest(), metadata=md),
            a.stub.CancelTask(api.CancelTaskRequest(task_id=task_id), metadata=md),
            a.stub.ExplainRoute(api.ExplainRouteRequest(task_id=task_id), metadata=md),
            a.stub.ListProviders(api.ListProvidersRequest(), metadata=md),
            a.stub.GetProviderHealth(api.GetProviderHealthRequest(), metadata=md),
            a.stub.ForceBreaker(api.ForceBreakerRequest(), metadata=md),
        ]
        for call in calls:
            assert await _code(call) is grpc.StatusCode.UNAUTHENTICATED, md
        watch = a.stub.WatchTask(api.WatchTaskRequest(task_id=task_id), metadata=md)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [reply async for reply in watch]
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    # Malformed request bytes without a token: refused as unauthenticated, never decoded first.
    raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = a.channel.unary_unary(
        "/vidroute.scheduler.v1.SchedulerService/GetTask"
    )
    assert await _code(raw(b"\xff\xff\xff")) is grpc.StatusCode.UNAUTHENTICATED
    got = await a.stub.GetTask(api.GetTaskRequest(task_id=task_id), metadata=a.md("alpha"))
    assert got.task.state == pb.TASK_STATE_QUEUED  # nothing the refused calls did stuck


async def test_health_and_reflection_need_no_token(attack: Api) -> None:
    """Probes and grpcurl work without credentials."""
    health = health_pb2_grpc.HealthStub(attack.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(attack.channel)
    replies = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = [s.name async for r in replies for s in r.list_services_response.service]
    assert "vidroute.scheduler.v1.SchedulerService" in names


async def test_without_tokens_the_server_says_so_and_runs_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No tokens configured: a WARNING at start, and every caller is an (unscoped) admin."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'open.db'}"
    await upgrade(url)
    db = Database.from_url(url)

    async def probe() -> bool:
        return True

    with caplog.at_level(logging.WARNING, logger="controlplane.server"):
        running = await start_server(
            SchedulerServicer(TaskService(db)),
            listen="127.0.0.1:0",
            probe=probe,
            cleanup=[db.dispose],
        )
    try:
        assert any("AUTHENTICATION IS OFF" in r.getMessage() for r in caplog.records)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
            await stub.CreateTask(api.CreateTaskRequest(spec=_spec("beta"), idempotency_key="o"))
            listed = await stub.ListTasks(api.ListTasksRequest())
            assert [t.spec.tenant_id for t in listed.tasks] == ["beta"]
            providers = stub.ListProviders(api.ListProvidersRequest())
            assert await _code(providers) is grpc.StatusCode.UNIMPLEMENTED  # not refused
    finally:
        await running.stop(grace=1)

"""A Redis outage is UNAVAILABLE with a retry hint, never INTERNAL: the lease store and the API.

The test starts its own redis-server (no persistence) so it can kill it mid-life, as a crash
would: the pooled connections die, new ones are refused. The lease store (the shipped client
factory and its retries, compressed) then raises `LeaseStoreUnavailable`, which is both the
lease package's `LeaseBackendError` and the kernel's `Unavailable` (UNAVAILABLE + RetryInfo at
the edge). The control plane built by its composition root on that Redis answers every RPC
without an INTERNAL or UNKNOWN; the admin RPCs that need the shared breaker state answer
UNAVAILABLE with RetryInfo. When Redis is back, both answer again without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.leases.base import (
    Dimension,
    LeaseBackendError,
    LeaseRequest,
    LeaseStoreUnavailable,
)
from controlplane.leases.redis_store import RedisClientConfig, RedisLeaseStore, redis_client
from controlplane.server import SCHEDULER_SERVICE
from tests.e2e.test_redis_loss import PrivateRedis, private_redis
from tests.integration.api.test_stack_readiness_and_accounts import free_port, runway_sidecar
from tests.support.stack import spec_for
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc
from vidroute_core.exceptions import Unavailable
from vidroute_core.timescale import scale_durations
from vidroute_core.wire.status import to_status

__all__ = ["private_redis"]  # a fixture, used by name

pytestmark = [pytest.mark.timeout(180), pytest.mark.postgres]

TIME_SCALE = 0.25
KEY = "key-good"
NEVER = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})


def _retry_info(status: grpc.Status) -> error_details_pb2.RetryInfo | None:
    """The RetryInfo detail of a status, read from its trailer as a client would."""
    raw = dict(status.trailing_metadata).get("grpc-status-details-bin")
    if raw is None:
        return None
    for detail in status_pb2.Status.FromString(raw).details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info
    return None


def _request(attempt_id: str) -> LeaseRequest:
    return LeaseRequest(attempt_id, "runway:prod-us", (Dimension("all-video", 4),))


async def test_the_lease_store_raises_unavailable_while_redis_is_down(
    private_redis: PrivateRedis,
) -> None:
    """Every lease operation on a killed Redis raises LeaseStoreUnavailable (a LeaseBackendError
    and the kernel's Unavailable, UNAVAILABLE with RetryInfo at the edge); after a restart the
    same store object serves again."""
    client = redis_client(private_redis.url, scale_durations(RedisClientConfig(), TIME_SCALE))
    store = RedisLeaseStore(client, namespace=f"outage-{secrets.token_hex(4)}:")
    try:
        lease = await store.acquire(_request("attempt-1"))
        assert lease is not None
        private_redis.kill()
        operations: dict[str, Callable[[], Awaitable[Any]]] = {
            "acquire": lambda: store.acquire(_request("attempt-2")),
            "renew": lambda: store.renew(lease),
            "release": lambda: store.release(lease),
            "snapshot": lambda: store.snapshot("runway:prod-us"),
            "accounts": store.accounts,
            "now_ms": store.now_ms,
        }
        for name, operation in operations.items():
            with pytest.raises(LeaseStoreUnavailable) as raised:
                await operation()
            assert isinstance(raised.value, Unavailable), name
            assert isinstance(raised.value, LeaseBackendError), name
            status = to_status(raised.value)
            assert status.code is grpc.StatusCode.UNAVAILABLE, name
            info = _retry_info(status)
            assert info is not None, name
            assert info.retry_delay.seconds + info.retry_delay.nanos > 0, name
        private_redis.start()  # back, empty (no persistence)
        assert await store.acquire(_request("attempt-3")) is not None
    finally:
        await client.aclose()


async def eventually(check: Callable[[], Awaitable[Any]], deadline_s: float, what: str) -> Any:
    """Poll `check` until it returns something truthy; fail after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
async def stub(
    private_redis: PrivateRedis, fresh_postgres_url: str, tmp_path: Path
) -> AsyncIterator[api_grpc.SchedulerServiceAsyncStub]:
    """The control plane on the private Redis, one Runway sidecar, SERVING."""
    port = free_port()
    async with RunwayEmulator(RunwayConfig(api_key=KEY)) as emulator:
        sidecar = runway_sidecar(emulator, port, ("prod-us", KEY))
        await sidecar.start()
        server = await start_control_plane(
            Settings(
                database_url=fresh_postgres_url,
                redis_url=private_redis.url,
                listen="127.0.0.1:0",
                adapters={"runway": f"127.0.0.1:{port}"},
                object_store_url=(tmp_path / "objects").as_uri(),
                worker_id="redis-outage-test",
                time_scale=TIME_SCALE,
            )
        )
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)

                async def serving() -> bool:
                    reply = await health.Check(
                        health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE), timeout=5
                    )
                    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

                await eventually(serving, 60, "the control plane turns SERVING")
                yield api_grpc.SchedulerServiceStub(channel)
        finally:
            await server.stop(grace=1.0)
            await sidecar.stop()


async def _code(call: Awaitable[Any]) -> tuple[grpc.StatusCode, grpc.aio.AioRpcError | None]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc
    return grpc.StatusCode.OK, None


async def _first_event(stub: api_grpc.SchedulerServiceAsyncStub, task_id: str) -> None:
    call = stub.WatchTask(api.WatchTaskRequest(task_id=task_id), timeout=20)
    try:
        async for _event in call:
            return
    finally:
        call.cancel()


async def test_every_rpc_answers_without_internal_while_redis_is_down(
    private_redis: PrivateRedis,
    stub: api_grpc.SchedulerServiceAsyncStub,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis killed under a running control plane: no RPC answers INTERNAL or UNKNOWN and none
    logs an unhandled error; the task RPCs (PostgreSQL only) still work, GetProviderHealth and
    ForceBreaker (shared breaker state) are UNAVAILABLE with RetryInfo; Redis back, they
    answer again."""
    created = await stub.CreateTask(
        api.CreateTaskRequest(spec=spec_for("runway"), idempotency_key=uuid.uuid4().hex),
        timeout=10,
    )
    task_id = created.task.task_id
    private_redis.kill()
    caplog.set_level(logging.ERROR, logger="vidroute_core.wire.status")
    force = api.ForceBreakerRequest(
        provider="runway", account="prod-us", region="us", state=pb.BREAKER_STATE_OPEN, reason="x"
    )
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "CreateTask": lambda: stub.CreateTask(
            api.CreateTaskRequest(spec=spec_for("runway"), idempotency_key=uuid.uuid4().hex),
            timeout=20,
        ),
        "GetTask": lambda: stub.GetTask(api.GetTaskRequest(task_id=task_id), timeout=20),
        "ListTasks": lambda: stub.ListTasks(api.ListTasksRequest(), timeout=20),
        "ExplainRoute": lambda: stub.ExplainRoute(
            api.ExplainRouteRequest(task_id=task_id), timeout=20
        ),
        "WatchTask": lambda: _first_event(stub, task_id),
        "ListProviders": lambda: stub.ListProviders(api.ListProvidersRequest(), timeout=20),
        "GetProviderHealth": lambda: stub.GetProviderHealth(
            api.GetProviderHealthRequest(), timeout=20
        ),
        "ForceBreaker": lambda: stub.ForceBreaker(force, timeout=20),
        "CancelTask": lambda: stub.CancelTask(api.CancelTaskRequest(task_id=task_id), timeout=20),
    }
    answers = {name: await _code(call()) for name, call in calls.items()}
    codes = {name: code for name, (code, _) in answers.items()}
    assert not {n: c for n, c in codes.items() if c in NEVER}, codes
    for name in ("GetProviderHealth", "ForceBreaker"):
        code, error = answers[name]
        assert code is grpc.StatusCode.UNAVAILABLE, (name, codes)
        assert error is not None
        status = rpc_status.from_call(error)
        assert status is not None
        assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details), name
    for name in ("CreateTask", "GetTask", "ListTasks", "WatchTask"):
        assert codes[name] is grpc.StatusCode.OK, (name, codes)
    assert not [r for r in caplog.records if "unhandled error" in r.getMessage()]

    private_redis.start()

    async def answers_again() -> bool:
        code, _ = await _code(stub.GetProviderHealth(api.GetProviderHealthRequest(), timeout=20))
        return code is grpc.StatusCode.OK

    await eventually(answers_again, 30, "GetProviderHealth answers once Redis is back")

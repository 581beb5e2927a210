"""Readiness follows PostgreSQL and Redis in the control plane the composition root builds.

`start_control_plane` with one Runway sidecar (emulator behind it), a private PostgreSQL and a
private redis-server this test starts, so it may stop them: while either is down, the overall
health ("") and the scheduler service are NOT_SERVING -- what the Kubernetes readiness probe
reads -- and liveness stays SERVING; when it is back, readiness returns without a restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from controlplane.bootstrap import Settings, start_control_plane
from controlplane.server import LIVENESS_SERVICE, SCHEDULER_SERVICE
from tests.e2e.test_redis_loss import PrivateRedis, private_redis
from tests.integration.api.test_database_outage import PrivatePostgres, private_postgres
from tests.integration.api.test_stack_readiness_and_accounts import free_port, runway_sidecar

__all__ = ["private_postgres", "private_redis"]  # fixtures, used by name

pytestmark = [pytest.mark.timeout(180)]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READINESS = ("", SCHEDULER_SERVICE)
TIME_SCALE = 0.25
KEY = "key-good"


@pytest.fixture
async def health(
    private_postgres: PrivatePostgres, private_redis: PrivateRedis, tmp_path: Path
) -> AsyncIterator[health_pb2_grpc.HealthStub]:
    port = free_port()
    async with RunwayEmulator(RunwayConfig(api_key=KEY)) as emulator:
        sidecar = runway_sidecar(emulator, port, ("prod-us", KEY))
        await sidecar.start()
        server = await start_control_plane(
            Settings(
                database_url=private_postgres.url,
                redis_url=private_redis.url,
                listen="127.0.0.1:0",
                adapters={"runway": f"127.0.0.1:{port}"},
                object_store_url=(tmp_path / "objects").as_uri(),
                worker_id="readiness-test",
                time_scale=TIME_SCALE,
            )
        )
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                yield health_pb2_grpc.HealthStub(channel)
        finally:
            await server.stop(grace=1.0)
            await sidecar.stop()


async def statuses(stub: health_pb2_grpc.HealthStub) -> dict[str, int]:
    out = {}
    for service in (*READINESS, LIVENESS_SERVICE):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        out[service] = int(reply.status)
    return out


async def until(stub: health_pb2_grpc.HealthStub, readiness: int, what: str) -> None:
    """Wait (deadline 30 s) until both readiness services report `readiness`; liveness is
    SERVING throughout."""
    deadline = time.monotonic() + 30
    while True:
        seen = await statuses(stub)
        assert seen[LIVENESS_SERVICE] == SERVING, seen
        if all(seen[s] == readiness for s in READINESS):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within 30 s: {what} ({seen})")
        await asyncio.sleep(0.1)


async def test_readiness_follows_redis_and_postgres(
    health: health_pb2_grpc.HealthStub,
    private_postgres: PrivatePostgres,
    private_redis: PrivateRedis,
) -> None:
    await until(health, SERVING, "ready once the sidecar described")

    private_redis.kill()
    await until(health, NOT_SERVING, "NOT_SERVING while Redis is down")
    private_redis.start()
    await until(health, SERVING, "ready again once Redis answers")

    await asyncio.to_thread(private_postgres.stop)
    await until(health, NOT_SERVING, "NOT_SERVING while PostgreSQL is down")
    await asyncio.to_thread(private_postgres.start)
    await until(health, SERVING, "ready again once PostgreSQL answers")

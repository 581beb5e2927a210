"""Health follows the database for readiness while "liveness" only reports the process; Watch
works on every server, so clients with gRPC client-side health checking can call them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapter_sidecars.common.config import parse_config
from adapter_sidecars.common.server import ADAPTER_SERVICE, SidecarServer
from adapter_sidecars.emulators import RunwayConfig, RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from controlplane.api.servicer import SchedulerServicer
from controlplane.server import LIVENESS_SERVICE, SCHEDULER_SERVICE, start_server
from controlplane.service.tasks import TaskService
from vidroute.adapter.v1 import adapter_service_pb2, adapter_service_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_checked_channel(port: int, service: str) -> grpc.aio.Channel:
    """A channel that routes calls only to backends whose health `service` is SERVING.

    grpcio runs client-side health checks for LB policies that support them (round_robin) when
    the service config names a ``healthCheckConfig``; the checks are Health/Watch streams.
    """
    config = {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": service},
    }
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.service_config", json.dumps(config))]
    )


async def first_watch_status(channel: grpc.aio.Channel, service: str) -> int:
    """The first status a Health/Watch stream reports."""
    stream = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=service), timeout=10
    )
    async for reply in stream:
        stream.cancel()
        return int(reply.status)
    raise AssertionError("Watch ended without a status")


async def test_database_outage_is_not_ready_but_alive() -> None:
    """With the dependency probe failing, "" and the scheduler are NOT_SERVING, liveness SERVING;
    when the probe recovers, readiness returns."""
    database_up = False

    async def probe() -> bool:
        if not database_up:
            raise ConnectionRefusedError("database down")
        return True

    running = await start_server(
        SchedulerServicer(TaskService(db=None)),  # type: ignore[arg-type]  # no database: health never reaches it
        listen="127.0.0.1:0",
        probe=probe,
        probe_interval=3600,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                return int(reply.status)

            assert await status("") == NOT_SERVING
            assert await status(SCHEDULER_SERVICE) == NOT_SERVING
            assert await status(LIVENESS_SERVICE) == SERVING
            database_up = True
            assert await running.refresh_health()
            assert await status(SCHEDULER_SERVICE) == SERVING
    finally:
        await running.stop(grace=1)


async def test_control_plane_serves_a_client_side_health_checked_channel() -> None:
    """Watch streams the control plane's status, and a channel with client-side health checking
    reaches the scheduler service (its calls would fail UNAVAILABLE if Watch broke)."""

    async def probe() -> bool:
        return True

    running = await start_server(
        SchedulerServicer(TaskService(db=None)),  # type: ignore[arg-type]  # no database: health never reaches it
        listen="127.0.0.1:0",
        probe=probe,
        probe_interval=3600,
    )
    try:
        async with health_checked_channel(running.port, SCHEDULER_SERVICE) as channel:
            assert await first_watch_status(channel, SCHEDULER_SERVICE) == SERVING
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE), timeout=10
            )
            assert reply.status == SERVING
    finally:
        await running.stop(grace=1)


async def test_watch_reports_a_readiness_change() -> None:
    """A Watch stream opened while NOT_SERVING receives SERVING once the probe recovers."""
    database_up = False

    async def probe() -> bool:
        return database_up

    running = await start_server(
        SchedulerServicer(TaskService(db=None)),  # type: ignore[arg-type]  # no database: health never reaches it
        listen="127.0.0.1:0",
        probe=probe,
        probe_interval=3600,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stream = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
            seen = []
            async for reply in stream:
                seen.append(int(reply.status))
                if reply.status == NOT_SERVING:
                    database_up = True
                    await running.refresh_health()
                if reply.status == SERVING:
                    stream.cancel()
                    break
            assert seen == [NOT_SERVING, SERVING]
    finally:
        await running.stop(grace=1)


@pytest.fixture
async def runway_sidecar() -> AsyncIterator[SidecarServer]:
    """An in-process Runway sidecar in front of the Runway emulator."""
    async with RunwayEmulator(RunwayConfig()) as emulator:
        config = parse_config(
            {
                "provider": {"base_url": emulator.url, "options": {}},
                "health": {"probe_interval_seconds": 0.2},
                "shutdown_grace_seconds": 1,
                "accounts": [
                    {"name": "prod-us", "region": "us", "credential_ref": "env:RUNWAY_KEY:-k"}
                ],
            },
            {},
        )
        server = SidecarServer(
            RunwayAdapter.from_config(config),
            "127.0.0.1:0",
            probe_interval_seconds=0.2,
            shutdown_grace_seconds=1,
        )
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


async def test_sidecar_serves_a_client_side_health_checked_channel(
    runway_sidecar: SidecarServer,
) -> None:
    """Watch streams a sidecar's status, and Describe works over a channel that health-checks
    the adapter service on the client side."""
    async with health_checked_channel(runway_sidecar.port, ADAPTER_SERVICE) as channel:
        assert await first_watch_status(channel, ADAPTER_SERVICE) == SERVING
        stub = adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)
        reply = await asyncio.wait_for(stub.Describe(adapter_service_pb2.DescribeRequest()), 10)
        assert reply.capabilities

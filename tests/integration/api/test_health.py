"""Health follows the database for readiness while "liveness" only reports the process."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.api.servicer import SchedulerServicer
from controlplane.server import LIVENESS_SERVICE, SCHEDULER_SERVICE, start_server
from controlplane.service.tasks import TaskService


async def test_database_outage_is_not_ready_but_alive() -> None:
    """With the dependency probe failing, "" and the scheduler are NOT_SERVING, liveness SERVING;
    when the probe recovers, readiness returns."""
    database_up = False

    async def probe() -> bool:
        if not database_up:
            raise ConnectionRefusedError("database down")
        return True

    running = await start_server(
        SchedulerServicer(TaskService(store=None)),  # type: ignore[arg-type]
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

            serving = health_pb2.HealthCheckResponse.SERVING
            not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
            assert await status("") == not_serving
            assert await status(SCHEDULER_SERVICE) == not_serving
            assert await status(LIVENESS_SERVICE) == serving
            database_up = True
            assert await running.refresh_health()
            assert await status(SCHEDULER_SERVICE) == serving
    finally:
        await running.stop(grace=1)

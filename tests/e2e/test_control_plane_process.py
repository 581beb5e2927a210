"""The control plane as a real process: reflection, health, CreateTask and restart survival.

Runs `python -m clients.cli serve` exactly as `make up` does, on SQLite and on PostgreSQL, and
talks to it over a real gRPC channel the way grpcurl would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_status import rpc_status
from sqlalchemy import text

from controlplane.persistence.db import create_engine
from tests.support import processes
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2, scheduler_service_pb2_grpc
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = pytest.mark.e2e
SCHEDULER = "vidroute.scheduler.v1.SchedulerService"


@pytest.fixture
def start_server(tmp_path: Path, database_url: str) -> Iterator[object]:
    started: list[processes.Proc] = []

    def start() -> processes.Proc:
        proc = processes.start(
            ["-m", "clients.cli", "serve", "--listen", "127.0.0.1:0"],
            workdir=tmp_path,
            name=f"controlplane-{len(started)}",
            env={"VIDROUTE_DATABASE_URL": database_url, "VIDROUTE_API_ONLY": "1"},
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def _spec(prompt: str = "a red kite over a green hill") -> gen.GenerationSpec:
    return gen.GenerationSpec(
        tenant_id="acme",
        prompt=prompt,
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
    )


async def _row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return {
                table: int(await conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)
                for table in ("generation_tasks", "outbox", "task_events")
            }
    finally:
        await engine.dispose()


def test_reflection_lists_services_and_health_is_serving(start_server: object) -> None:
    """A reflection client (as grpcurl uses) lists the scheduler and health services; SERVING."""
    proc = start_server()  # type: ignore[operator]  # the fixture is a factory typed object
    with grpc.insecure_channel(proc.address) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
        assert {SCHEDULER, "grpc.health.v1.Health"} <= services
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SCHEDULER):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_invalid_spec_writes_nothing_and_valid_task_survives_restart(
    start_server: object, database_url: str
) -> None:
    """INVALID_ARGUMENT with field violations leaves no row; a QUEUED task outlives a restart."""
    proc = start_server()  # type: ignore[operator]  # the fixture is a factory typed object
    with grpc.insecure_channel(proc.address) as channel:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        bad = gen.GenerationSpec(
            tenant_id="acme",
            prompt="",
            mode=gen.MODE_IMAGE_TO_VIDEO,
            output=gen.OutputSpec(width=1280, height=720),
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.CreateTask(api.CreateTaskRequest(spec=bad, idempotency_key="k"), timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        status = rpc_status.from_call(err.value)
        assert status is not None
        violations = error_details_pb2.BadRequest()
        assert status.details[0].Unpack(violations)
        fields = {v.field for v in violations.field_violations}
        assert {"prompt", "first_frame", "output.duration_ms"} <= fields
        assert asyncio.run(_row_counts(database_url)) == {
            "generation_tasks": 0,
            "outbox": 0,
            "task_events": 0,
        }
        created = stub.CreateTask(
            api.CreateTaskRequest(spec=_spec(), idempotency_key="k"), timeout=10
        )
        assert created.task.state == scheduler_pb2.TASK_STATE_QUEUED
    assert proc.stop() == 0, proc.log()

    restarted = start_server()  # type: ignore[operator]  # the fixture is a factory typed object
    with grpc.insecure_channel(restarted.address) as channel:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        got = stub.GetTask(api.GetTaskRequest(task_id=created.task.task_id), timeout=10)
        assert got.task.state == scheduler_pb2.TASK_STATE_QUEUED
        assert got.task.spec == created.task.spec
        assert got.task.normalized_spec_hash == created.task.normalized_spec_hash

"""The platform safety policy refuses at CreateTask: nothing written, no provider called (9.9.2).

A real control plane (in process, started by the composition root with a policy file of this
test's own) routes to the Runway sidecar (a process) and its emulator. The emulator's request
counters and job truth are the proof that a refused request never reached a provider; a
compliant task through the same stack shows the counters do move when a task gets through.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from google.rpc import error_details_pb2, status_pb2
from sqlalchemy import func, select

from controlplane.bootstrap import Settings, start_control_plane
from controlplane.persistence.db import create_engine
from controlplane.persistence.models import generation_tasks
from controlplane.server import ControlPlaneServer
from tests.support.stack import ProviderFarm, spec_for
from vidroute.scheduler.v1 import scheduler_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

pytestmark = [pytest.mark.timeout(120)]

POLICY = {
    "version": "test-policy-1",
    "rules": {"blocked": [{"name": "no-dragons", "terms": ["dragon"], "fields": ["prompt"]}]},
}
# The sidecar's health probe reads the organization; everything else is a provider call.
PROBE_PATHS = frozenset({"GET /v1/organization"})


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderFarm]:
    with ProviderFarm(tmp_path_factory.mktemp("farm"), providers=["runway"]) as started:
        yield started


@pytest.fixture
async def control_plane(
    farm: ProviderFarm, tmp_path: Path
) -> AsyncIterator[tuple[ControlPlaneServer, str]]:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(POLICY), encoding="utf-8")
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    farm.reset()
    server = await start_control_plane(
        Settings(
            database_url=database_url,
            listen="127.0.0.1:0",
            adapters={"runway": farm.sidecars["runway"].address},
            object_store_url=(tmp_path / "objects").as_uri(),
            worker_id="safety-test",
            safety_policy_path=str(policy_path),
        )
    )
    try:
        yield server, database_url
    finally:
        await server.stop(grace=1.0)


def provider_calls(farm: ProviderFarm) -> dict[str, int]:
    emulator = farm.emulator("runway")
    counts = emulator.call(lambda: dict(emulator.emulator.counters))
    return {path: n for path, n in counts.items() if path not in PROBE_PATHS}


async def task_rows(database_url: str) -> int:
    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            return int(
                (
                    await conn.execute(select(func.count()).select_from(generation_tasks))
                ).scalar_one()
            )
    finally:
        await engine.dispose()


async def test_a_refused_create_task_writes_nothing_and_calls_no_provider(
    control_plane: tuple[ControlPlaneServer, str], farm: ProviderFarm
) -> None:
    """A prompt the policy blocks is FAILED_PRECONDITION naming rule and field; no row, no call."""
    server, database_url = control_plane
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = api_grpc.SchedulerServiceStub(channel)
        refused = api.CreateTaskRequest(
            spec=spec_for("runway", prompt="a red dragon over a green hill"),
            idempotency_key=uuid.uuid4().hex,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateTask(refused, timeout=10)
        error = caught.value
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
        raw = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
        info = error_details_pb2.ErrorInfo()
        assert status_pb2.Status.FromString(raw).details[0].Unpack(info)
        assert info.reason == "SAFETY_POLICY_VIOLATION"
        assert dict(info.metadata) == {
            "rule": "no-dragons",
            "field": "prompt",
            "policy_version": "test-policy-1",
            "violations": "1",
        }
        assert await task_rows(database_url) == 0

        # The same stack does reach the provider for a request the policy allows ...
        allowed = api.CreateTaskRequest(spec=spec_for("runway"), idempotency_key=uuid.uuid4().hex)
        task_id = (await stub.CreateTask(allowed, timeout=10)).task.task_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not farm.truth("runway"):
            assert loop.time() < deadline, "the allowed task never reached the provider"
            await asyncio.sleep(0.1)
        got = await stub.GetTask(api.GetTaskRequest(task_id=task_id), timeout=10)
        assert got.task.state != scheduler_pb2.TASK_STATE_FAILED

    # ... and the refused one never did: one job, the allowed prompt's, one task row.
    jobs = farm.truth("runway")
    assert len(jobs) == 1, jobs
    assert "kite" in repr(jobs[0]["body"])
    assert "dragon" not in repr(jobs[0]["body"])
    assert sum(n for path, n in provider_calls(farm).items() if path.startswith("POST")) == 1
    assert await task_rows(database_url) == 1


async def test_a_safety_profile_the_platform_does_not_define_is_invalid(
    control_plane: tuple[ControlPlaneServer, str], farm: ProviderFarm
) -> None:
    """`safety_profile` names no profile this platform defines: INVALID_ARGUMENT with a field
    violation on safety_profile, no row, no provider call, never accepted and ignored."""
    server, database_url = control_plane
    spec = spec_for("runway")
    spec.safety_profile = "strict"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = api_grpc.SchedulerServiceStub(channel)
        request = api.CreateTaskRequest(spec=spec, idempotency_key=uuid.uuid4().hex)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateTask(request, timeout=10)
    error = caught.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    raw = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    bad = error_details_pb2.BadRequest()
    assert status_pb2.Status.FromString(raw).details[0].Unpack(bad)
    assert [v.field for v in bad.field_violations] == ["safety_profile"]
    assert "strict" in bad.field_violations[0].description
    assert await task_rows(database_url) == 0
    assert not farm.truth("runway")

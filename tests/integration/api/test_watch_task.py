"""WatchTask streams a task's persisted history over a real gRPC channel and resumes by cursor."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controlplane.api.servicer import SchedulerServicer
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.tasks import TaskService
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc


@pytest.fixture
async def stub(
    tmp_path: Path,
) -> AsyncIterator[scheduler_service_pb2_grpc.SchedulerServiceAsyncStub]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    await upgrade(url)
    db = Database.from_url(url)

    async def probe() -> bool:
        await db.ping()
        return True

    running: ControlPlaneServer = await start_server(
        SchedulerServicer(TaskService(db, watch_poll_interval_s=0.05)),
        listen="127.0.0.1:0",
        probe=probe,
        cleanup=[db.dispose],
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
    await running.stop(grace=1)


def _spec() -> gen.GenerationSpec:
    return gen.GenerationSpec(
        tenant_id="acme",
        prompt="a red kite",
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
    )


async def _events(
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub, task_id: str, cursor: str = ""
) -> list[pb.TaskEvent]:
    call = stub.WatchTask(api.WatchTaskRequest(task_id=task_id, after_cursor=cursor), timeout=10)
    return [reply.event async for reply in call]


async def test_watch_replays_history_and_ends_at_terminal_state(
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    """A cancelled task's stream holds its creation and its cancellation, then closes."""
    created = await stub.CreateTask(api.CreateTaskRequest(spec=_spec(), idempotency_key="w1"))
    task_id = created.task.task_id
    await stub.CancelTask(api.CancelTaskRequest(task_id=task_id))
    events = await _events(stub, task_id)
    assert [e.kind for e in events] == [
        pb.TASK_EVENT_KIND_CREATED,
        pb.TASK_EVENT_KIND_TASK_STATE_CHANGED,
    ]
    assert [e.task_state for e in events] == [pb.TASK_STATE_QUEUED, pb.TASK_STATE_CANCELLED]


async def test_watch_resumes_after_a_cursor(
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    """Passing the cursor of the first event streams only what came after it."""
    created = await stub.CreateTask(api.CreateTaskRequest(spec=_spec(), idempotency_key="w2"))
    task_id = created.task.task_id
    await stub.CancelTask(api.CancelTaskRequest(task_id=task_id))
    first, second = await _events(stub, task_id)
    assert await _events(stub, task_id, first.cursor) == [second]


async def test_watch_delivers_events_written_while_streaming(
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    """An open stream receives a state change made after it started, then ends."""
    created = await stub.CreateTask(api.CreateTaskRequest(spec=_spec(), idempotency_key="w3"))
    task_id = created.task.task_id
    call = stub.WatchTask(api.WatchTaskRequest(task_id=task_id), timeout=10)
    first = await call.read()
    assert isinstance(first, api.WatchTaskResponse)
    assert first.event.kind == pb.TASK_EVENT_KIND_CREATED
    await stub.CancelTask(api.CancelTaskRequest(task_id=task_id))
    second = await call.read()
    assert isinstance(second, api.WatchTaskResponse)
    assert second.event.task_state == pb.TASK_STATE_CANCELLED
    assert await call.read() == grpc.aio.EOF


async def test_watch_unknown_task_is_not_found(
    stub: scheduler_service_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    """Watching a task that does not exist fails with NOT_FOUND before any event."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _events(stub, "424242")
    assert err.value.code() is grpc.StatusCode.NOT_FOUND

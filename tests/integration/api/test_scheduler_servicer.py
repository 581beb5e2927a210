"""The scheduler servicer, in process with grpcio-testing, on a real SQLite database.

grpcio-testing drives servicers synchronously, so a small bridge runs our async servicer on an
event loop in a background thread and applies the same error mapping the server's interceptor
applies (`vidroute_core.wire.status.to_status`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import grpc_testing
import pytest
from google.rpc import error_details_pb2, status_pb2

from controlplane.api.servicer import SchedulerServicer
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.service.access import SYSTEM
from controlplane.service.tasks import TaskService
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute_core.exceptions import DomainError
from vidroute_core.wire.status import to_status

SERVICE = api.DESCRIPTOR.services_by_name["SchedulerService"]


class _Bridge:
    """Exposes each async servicer method as a blocking call, mapping domain errors."""

    def __init__(self, servicer: SchedulerServicer, loop: asyncio.AbstractEventLoop) -> None:
        self._servicer = servicer
        self._loop = loop

    def __getattr__(self, name: str) -> Callable[[Any, Any], Any]:
        method = getattr(self._servicer, name)

        def call(request: Any, context: Any) -> Any:
            future: Future[Any] = asyncio.run_coroutine_threadsafe(
                method(request, context), self._loop
            )
            try:
                return future.result(timeout=30)
            except DomainError as exc:
                # grpcio-testing's abort drops trailing metadata, so end the call with the
                # status set piecewise, as a real server's abort_with_status would.
                status = to_status(exc)
                context.set_trailing_metadata(status.trailing_metadata)
                context.set_code(status.code)
                context.set_details(status.details)
                return None

        return call


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.fixture
def db(tmp_path: Path, loop: asyncio.AbstractEventLoop) -> Iterator[Database]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    asyncio.run_coroutine_threadsafe(upgrade(url), loop).result(30)
    database = Database.from_url(url)
    yield database
    asyncio.run_coroutine_threadsafe(database.dispose(), loop).result(30)


@pytest.fixture
def server(db: Database, loop: asyncio.AbstractEventLoop) -> grpc_testing.Server:
    # Driven without the server, so without its authentication: an unscoped caller.
    servicer = SchedulerServicer(TaskService(db), default_caller=SYSTEM)
    return grpc_testing.server_from_dictionary(
        {SERVICE: _Bridge(servicer, loop)}, grpc_testing.strict_real_time()
    )


def _unary(server: grpc_testing.Server, method: str, request: Any) -> tuple[Any, Any, Any, str]:
    rpc = server.invoke_unary_unary(SERVICE.methods_by_name[method], (), request, None)
    response, trailing, code, details = rpc.termination()
    return response, trailing, code, details


def _valid_spec(prompt: str = "a red kite over a green hill") -> gen.GenerationSpec:
    return gen.GenerationSpec(
        tenant_id="acme",
        prompt=prompt,
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
    )


def _violations(trailing: Any) -> dict[str, str]:
    raw = dict(trailing)["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    return {v.field: v.description for v in bad.field_violations}


def test_create_task_persists_a_queued_task(server: grpc_testing.Server) -> None:
    """A valid CreateTask returns a new QUEUED task that GetTask then finds."""
    response, _, code, _ = _unary(
        server, "CreateTask", api.CreateTaskRequest(spec=_valid_spec(), idempotency_key="k1")
    )
    assert code is grpc.StatusCode.OK
    assert response.created
    assert response.task.state == scheduler_pb2.TASK_STATE_QUEUED
    got, _, code, _ = _unary(server, "GetTask", api.GetTaskRequest(task_id=response.task.task_id))
    assert code is grpc.StatusCode.OK
    assert got.task.spec.prompt == "a red kite over a green hill"


def test_invalid_spec_is_invalid_argument_with_every_violation(
    server: grpc_testing.Server,
) -> None:
    """An invalid spec returns INVALID_ARGUMENT listing each broken field and writes nothing."""
    spec = gen.GenerationSpec(
        tenant_id="acme",
        prompt=" ",
        mode=gen.MODE_FIRST_LAST_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=0),
    )
    _, trailing, code, _ = _unary(
        server, "CreateTask", api.CreateTaskRequest(spec=spec, idempotency_key="")
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    fields = _violations(trailing)
    assert {"prompt", "first_frame", "last_frame", "output.duration_ms", "idempotency_key"} <= set(
        fields
    )
    listed, _, _, _ = _unary(server, "ListTasks", api.ListTasksRequest())
    assert list(listed.tasks) == []


def test_same_key_same_spec_returns_the_same_task(server: grpc_testing.Server) -> None:
    """Repeating CreateTask with one key and one spec returns the first task, created=False."""
    req = api.CreateTaskRequest(spec=_valid_spec(), idempotency_key="again")
    first, _, _, _ = _unary(server, "CreateTask", req)
    second, _, code, _ = _unary(server, "CreateTask", req)
    assert code is grpc.StatusCode.OK
    assert (second.task.task_id, second.created) == (first.task.task_id, False)


def test_same_key_other_spec_is_already_exists(server: grpc_testing.Server) -> None:
    """Reusing a key with a different spec is ALREADY_EXISTS and creates nothing."""
    _unary(server, "CreateTask", api.CreateTaskRequest(spec=_valid_spec(), idempotency_key="k"))
    other = api.CreateTaskRequest(spec=_valid_spec("something else"), idempotency_key="k")
    _, _, code, _ = _unary(server, "CreateTask", other)
    assert code is grpc.StatusCode.ALREADY_EXISTS
    listed, _, _, _ = _unary(server, "ListTasks", api.ListTasksRequest())
    assert len(listed.tasks) == 1


def test_a_tag_outside_its_vocabulary_is_invalid_argument(server: grpc_testing.Server) -> None:
    """A content tag number no vocabulary lists is INVALID_ARGUMENT naming the tag's field path,
    alongside the spec's other violations, and nothing is written."""
    spec = _valid_spec()
    # A client built from another schema can send any number: proto3 enums are open.
    spec.content.category = gen.ContentCategory.ValueType(99)
    spec.content.camera_motion = gen.CAMERA_MOTION_ORBIT
    spec.content.style = gen.Style.ValueType(42)
    _, trailing, code, _ = _unary(
        server, "CreateTask", api.CreateTaskRequest(spec=spec, idempotency_key="tags")
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    fields = _violations(trailing)
    assert set(fields) == {"content.category", "content.style"}
    assert "unknown value 99" in fields["content.category"]
    listed, _, _, _ = _unary(server, "ListTasks", api.ListTasksRequest())
    assert list(listed.tasks) == []


def test_content_tags_are_kept_and_part_of_the_request(server: grpc_testing.Server) -> None:
    """Tags come back as sent; one key reused with other tags is ALREADY_EXISTS (another spec)."""
    spec = _valid_spec()
    spec.content.style = gen.STYLE_ANIME
    spec.content.has_human = False
    first, _, code, _ = _unary(
        server, "CreateTask", api.CreateTaskRequest(spec=spec, idempotency_key="tagged")
    )
    assert code is grpc.StatusCode.OK
    got, _, _, _ = _unary(server, "GetTask", api.GetTaskRequest(task_id=first.task.task_id))
    assert got.task.spec.content.style == gen.STYLE_ANIME
    assert got.task.spec.content.HasField("has_human")
    assert not got.task.spec.content.has_human
    assert got.task.spec.content.category == gen.CONTENT_CATEGORY_UNSPECIFIED
    spec.content.has_human = True
    _, _, code, _ = _unary(
        server, "CreateTask", api.CreateTaskRequest(spec=spec, idempotency_key="tagged")
    )
    assert code is grpc.StatusCode.ALREADY_EXISTS


def test_unknown_task_is_not_found(server: grpc_testing.Server) -> None:
    """GetTask of an id that does not exist is NOT_FOUND; a malformed id is INVALID_ARGUMENT."""
    _, _, code, _ = _unary(server, "GetTask", api.GetTaskRequest(task_id="999"))
    assert code is grpc.StatusCode.NOT_FOUND
    _, _, code, _ = _unary(server, "GetTask", api.GetTaskRequest(task_id="abc"))
    assert code is grpc.StatusCode.INVALID_ARGUMENT


def test_cancel_queued_task(server: grpc_testing.Server) -> None:
    """CancelTask moves a queued task straight to CANCELLED (outcome CANCELLED), and repeating
    it changes nothing (outcome ALREADY_FINISHED)."""
    created, _, _, _ = _unary(
        server, "CreateTask", api.CreateTaskRequest(spec=_valid_spec(), idempotency_key="c")
    )
    req = api.CancelTaskRequest(task_id=created.task.task_id, reason="user asked")
    cancelled, _, code, _ = _unary(server, "CancelTask", req)
    assert code is grpc.StatusCode.OK
    assert cancelled.task.state == scheduler_pb2.TASK_STATE_CANCELLED
    assert cancelled.outcome == scheduler_pb2.CANCEL_OUTCOME_CANCELLED
    again, _, code, _ = _unary(server, "CancelTask", req)
    assert code is grpc.StatusCode.OK
    assert again.task.status_version == cancelled.task.status_version
    assert again.outcome == scheduler_pb2.CANCEL_OUTCOME_ALREADY_FINISHED


class _AskingCanceller:
    """An engine whose cancel only asks the provider: the task stays where it is."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def cancel(self, task_id: int, reason: str = "") -> object:
        self.asked.append(task_id)
        return None


def test_cancel_left_to_the_provider_is_requested(
    db: Database, loop: asyncio.AbstractEventLoop
) -> None:
    """A cancel the engine only requested answers REQUESTED with the task still not terminal;
    a task terminal before the call never reaches the engine and answers ALREADY_FINISHED."""
    engine = _AskingCanceller()
    servicer = SchedulerServicer(TaskService(db, canceller=engine), default_caller=SYSTEM)
    server = grpc_testing.server_from_dictionary(
        {SERVICE: _Bridge(servicer, loop)}, grpc_testing.strict_real_time()
    )
    created, _, _, _ = _unary(
        server, "CreateTask", api.CreateTaskRequest(spec=_valid_spec(), idempotency_key="r")
    )
    task_id = created.task.task_id
    asked, _, code, _ = _unary(server, "CancelTask", api.CancelTaskRequest(task_id=task_id))
    assert code is grpc.StatusCode.OK
    assert asked.outcome == scheduler_pb2.CANCEL_OUTCOME_REQUESTED
    assert asked.task.state == scheduler_pb2.TASK_STATE_QUEUED
    assert engine.asked == [int(task_id)]
    plain = SchedulerServicer(TaskService(db), default_caller=SYSTEM)
    direct = grpc_testing.server_from_dictionary(
        {SERVICE: _Bridge(plain, loop)}, grpc_testing.strict_real_time()
    )
    _unary(direct, "CancelTask", api.CancelTaskRequest(task_id=task_id))
    finished, _, code, _ = _unary(server, "CancelTask", api.CancelTaskRequest(task_id=task_id))
    assert code is grpc.StatusCode.OK
    assert finished.outcome == scheduler_pb2.CANCEL_OUTCOME_ALREADY_FINISHED
    assert engine.asked == [int(task_id)]


def test_list_tasks_filters_and_pages(server: grpc_testing.Server) -> None:
    """ListTasks filters by tenant and state and pages with an opaque token, newest first."""
    ids = []
    for i in range(5):
        resp, _, _, _ = _unary(
            server,
            "CreateTask",
            api.CreateTaskRequest(spec=_valid_spec(f"prompt {i}"), idempotency_key=f"p{i}"),
        )
        ids.append(resp.task.task_id)
    first, _, _, _ = _unary(
        server, "ListTasks", api.ListTasksRequest(tenant_id="acme", page_size=3)
    )
    second, _, _, _ = _unary(
        server,
        "ListTasks",
        api.ListTasksRequest(tenant_id="acme", page_size=3, page_token=first.next_page_token),
    )
    seen = [t.task_id for t in first.tasks] + [t.task_id for t in second.tasks]
    assert seen == list(reversed(ids))
    assert second.next_page_token == ""
    none, _, _, _ = _unary(server, "ListTasks", api.ListTasksRequest(tenant_id="other"))
    assert list(none.tasks) == []

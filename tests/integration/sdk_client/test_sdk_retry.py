"""The SDK's retry policy and error decoding against a test-side SchedulerService that fails on
purpose and counts every call it receives (the retries are the channel's, invisible to code).

* a GetTask answered UNAVAILABLE once is retried by the channel and succeeds (sync and async);
* a CreateTask without an idempotency key (`generate_key=False`) reaches the server exactly once
  however often it is UNAVAILABLE; with its (generated) key it is retried, same key every time;
* a status with BadRequest, ErrorInfo and RequestInfo details becomes a typed exception whose
  attributes carry them, and whose str is one line.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from clients.sdk import AsyncClient, Client, errors
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

SPEC = {"tenant_id": "acme", "prompt": "a red kite", "mode": "MODE_TEXT_TO_VIDEO"}


class Flaky(api_grpc.SchedulerServiceServicer):
    """Answers UNAVAILABLE to the first `failures[method]` calls of a method; counts them all."""

    def __init__(self) -> None:
        self.failures: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.keys: list[str] = []
        self.tokens: list[str] = []
        self.deadlines: list[float | None] = []  # the time each call had left on arrival
        self._lock = threading.Lock()

    def _enter(self, method: str, context: Any) -> None:
        with self._lock:
            self.calls[method] += 1
            failing = self.calls[method] <= self.failures[method]
            self.tokens.extend(v for k, v in context.invocation_metadata() if k == "authorization")
            self.deadlines.append(context.time_remaining())
        if failing:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{method} is warming up")

    def GetTask(self, request: api.GetTaskRequest, context: Any) -> api.GetTaskResponse:
        self._enter("GetTask", context)
        return api.GetTaskResponse(task=pb.Task(task_id=request.task_id))

    def CreateTask(self, request: api.CreateTaskRequest, context: Any) -> api.CreateTaskResponse:
        with self._lock:
            self.keys.append(request.idempotency_key)
        self._enter("CreateTask", context)
        return api.CreateTaskResponse(
            task=pb.Task(task_id="7", idempotency_key=request.idempotency_key), created=True
        )

    def ExplainRoute(self, request: api.ExplainRouteRequest, context: Any) -> Any:
        self._enter("ExplainRoute", context)
        status = status_pb2.Status(
            code=code_pb2.FAILED_PRECONDITION, message="task 7 has no decision yet"
        )
        for detail in (
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field="output.height", description="must be positive"
                    ),
                    error_details_pb2.BadRequest.FieldViolation(
                        field="prompt", description="is required"
                    ),
                ]
            ),
            error_details_pb2.ErrorInfo(
                reason="INSUFFICIENT_CREDIT",
                domain="vidroute",
                metadata={"balance_micros": "100000", "estimate_micros": "480000"},
            ),
            error_details_pb2.RequestInfo(request_id="req-42"),
        ):
            packed = any_pb2.Any()
            packed.Pack(detail)
            status.details.append(packed)
        context.abort_with_status(rpc_status.to_status(status))


@pytest.fixture
def flaky() -> Iterator[tuple[Flaky, str]]:
    servicer = Flaky()  # type: ignore[abstract]  # the other RPCs stay UNIMPLEMENTED
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def test_get_is_retried_after_unavailable(flaky: tuple[Flaky, str]) -> None:
    """A GetTask the server answers UNAVAILABLE once succeeds on the channel's retry."""
    servicer, target = flaky
    servicer.failures["GetTask"] = 1
    with Client(target, token="t0k") as client:
        assert client.get("41").task_id == "41"
    assert servicer.calls["GetTask"] == 2
    assert servicer.tokens == ["Bearer t0k", "Bearer t0k"]


async def test_async_get_is_retried_after_unavailable(flaky: tuple[Flaky, str]) -> None:
    """The asyncio client's channel retries an UNAVAILABLE GetTask the same way."""
    servicer, target = flaky
    servicer.failures["GetTask"] = 2
    async with AsyncClient(target, token="t0k") as client:
        assert (await client.get("42")).task_id == "42"
    assert servicer.calls["GetTask"] == 3


def test_every_unary_call_has_the_default_deadline_and_target_and_token_come_from_env(
    flaky: tuple[Flaky, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client() with no arguments dials VIDROUTE_TARGET, sends VIDROUTE_TOKEN, and each call
    arrives with at most the default 30 s left; `timeout=` changes it."""
    servicer, target = flaky
    monkeypatch.setenv("VIDROUTE_TARGET", target)
    monkeypatch.setenv("VIDROUTE_TOKEN", "from-env")
    with Client() as client:
        client.get("1")
    with Client(timeout=5) as client:
        client.get("2")
    first, second = servicer.deadlines
    assert first is not None
    assert 25 < first <= 30.5  # (deadlines travel rounded up to a few ms)
    assert second is not None
    assert 3 < second <= 5.5
    assert servicer.tokens == ["Bearer from-env", "Bearer from-env"]


def test_a_ready_made_channel_is_used_and_left_open(flaky: tuple[Flaky, str]) -> None:
    """Client(channel=...) sends every call over the caller's channel and does not close it."""
    servicer, target = flaky
    with grpc.insecure_channel(target) as channel:
        with Client(channel=channel, token="") as client:
            assert client.get("3").task_id == "3"
        stub = api_grpc.SchedulerServiceStub(channel)
        assert stub.GetTask(api.GetTaskRequest(task_id="4"), timeout=10).task.task_id == "4"
    assert servicer.calls["GetTask"] == 2


def test_a_get_that_stays_unavailable_is_a_typed_error_after_bounded_retries(
    flaky: tuple[Flaky, str],
) -> None:
    """Retries stop at the policy's maxAttempts and the caller gets errors.Unavailable."""
    servicer, target = flaky
    servicer.failures["GetTask"] = 100
    with Client(target, token="") as client, pytest.raises(errors.Unavailable) as err:
        client.get("43")
    assert servicer.calls["GetTask"] == 4
    assert str(err.value).startswith("UNAVAILABLE: GetTask is warming up")
    assert target in str(err.value)


def test_create_without_a_key_is_never_retried(flaky: tuple[Flaky, str]) -> None:
    """generate_key=False and no key: one CreateTask reaches the server, UNAVAILABLE or not."""
    servicer, target = flaky
    servicer.failures["CreateTask"] = 100
    with Client(target, token="") as client, pytest.raises(errors.Unavailable):
        client.create(SPEC, generate_key=False)
    assert servicer.calls["CreateTask"] == 1
    assert servicer.keys == [""]


async def test_async_create_without_a_key_is_never_retried(flaky: tuple[Flaky, str]) -> None:
    """The asyncio client sends an unkeyed CreateTask once too."""
    servicer, target = flaky
    servicer.failures["CreateTask"] = 100
    async with AsyncClient(target, token="") as client:
        with pytest.raises(errors.Unavailable):
            await client.create(SPEC, generate_key=False)
    assert servicer.calls["CreateTask"] == 1


def test_create_with_its_generated_key_is_retried_with_the_same_key(
    flaky: tuple[Flaky, str],
) -> None:
    """A keyed CreateTask answered UNAVAILABLE twice is retried and creates one task; every
    try carries the key the SDK generated and returned."""
    servicer, target = flaky
    servicer.failures["CreateTask"] = 2
    with Client(target, token="") as client:
        made = client.create(gen.GenerationSpec(tenant_id="acme", prompt="a kite"))
    assert servicer.calls["CreateTask"] == 3
    assert made.created
    assert len(made.idempotency_key) == 36
    assert servicer.keys == [made.idempotency_key] * 3
    assert made.task.idempotency_key == made.idempotency_key


def test_status_details_become_typed_attributes(flaky: tuple[Flaky, str]) -> None:
    """BadRequest, ErrorInfo and RequestInfo in grpc-status-details-bin are the exception's
    field_violations, error_info_* and request_id; its str is one line naming them."""
    servicer, target = flaky
    with Client(target, token="") as client, pytest.raises(errors.FailedPrecondition) as err:
        client.explain("7")
    exc = err.value
    assert exc.code is grpc.StatusCode.FAILED_PRECONDITION
    assert exc.message == "task 7 has no decision yet"
    assert exc.field_violations == (
        errors.FieldViolation("output.height", "must be positive"),
        errors.FieldViolation("prompt", "is required"),
    )
    assert exc.error_info_reason == "INSUFFICIENT_CREDIT"
    assert exc.error_info_metadata == {"balance_micros": "100000", "estimate_micros": "480000"}
    assert exc.request_id == "req-42"
    line = str(exc)
    assert "\n" not in line
    assert line == (
        "FAILED_PRECONDITION: task 7 has no decision yet "
        "[output.height: must be positive; prompt: is required] "
        "[INSUFFICIENT_CREDIT: balance_micros=100000, estimate_micros=480000] (request req-42)"
    )
    assert servicer.calls["ExplainRoute"] == 1  # FAILED_PRECONDITION is not retried


def test_a_bad_spec_dict_is_invalid_argument_before_any_call(flaky: tuple[Flaky, str]) -> None:
    """A dict that is not a GenerationSpec is rejected in the client, naming the spec."""
    servicer, target = flaky
    with Client(target, token="") as client, pytest.raises(errors.InvalidArgument) as err:
        client.create({"tenant_id": "acme", "promt": "typo"})
    assert err.value.field_violations[0].field == "spec"
    assert "promt" in err.value.field_violations[0].description
    assert servicer.calls["CreateTask"] == 0

"""Caller webhooks through the whole platform: a task created over gRPC with a webhook runs on
the Runway sidecar and its emulator, and the receiver this test runs gets its state changes and
its task.succeeded (with the stored output), each verified by the Standard Webhooks reference
algorithm; ListWebhookDeliveries shows every message DELIVERED under the ids received.

The control plane is started in process by the composition root with a webhook policy of this
test (loopback and http allowed: the receiver is on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from standardwebhooks.webhooks import Webhook

from controlplane.bootstrap import Settings, start_control_plane
from controlplane.server import ControlPlaneServer
from controlplane.webhooks.config import TenantWebhooks, WebhookPolicy
from tests.support.stack import ProviderFarm, spec_for
from tests.support.webhook_receiver import Answer, WebhookReceiver
from vidroute.scheduler.v1 import scheduler_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

pytestmark = [pytest.mark.timeout(120)]

SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderFarm]:
    with ProviderFarm(tmp_path_factory.mktemp("farm"), providers=["runway"]) as started:
        yield started


@pytest.fixture
async def control_plane(farm: ProviderFarm, tmp_path: Path) -> AsyncIterator[ControlPlaneServer]:
    farm.reset()
    server = await start_control_plane(
        Settings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}",
            listen="127.0.0.1:0",
            adapters={"runway": farm.sidecars["runway"].address},
            object_store_url=(tmp_path / "objects").as_uri(),
            worker_id="webhook-test",
            time_scale=farm.time_scale,
            webhooks=WebhookPolicy(
                {"acme": TenantWebhooks(SECRET)}, allow_http=True, allow_private=True
            ),
        )
    )
    try:
        yield server
    finally:
        await server.stop(grace=1.0)


def _details(error: grpc.aio.AioRpcError) -> status_pb2.Status:
    raw = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    return status_pb2.Status.FromString(raw)


async def test_a_task_s_events_reach_the_callers_receiver_signed(
    control_plane: ControlPlaneServer,
) -> None:
    """State changes, the provider's rising progress and the terminal task.succeeded arrive
    signed, in order, once each."""
    async with (
        WebhookReceiver([Answer(200)]) as receiver,
        grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.port}") as channel,
    ):
        stub = api_grpc.SchedulerServiceStub(channel)
        url = receiver.url
        created = await stub.CreateTask(
            api.CreateTaskRequest(
                spec=spec_for("runway"),
                idempotency_key=uuid.uuid4().hex,
                webhook=scheduler_pb2.WebhookSubscription(
                    url=url, events=["task.state_changed", "task.progress"]
                ),
            ),
            timeout=10,
        )
        task_id = created.task.task_id
        assert created.task.webhook.url == url
        assert list(created.task.webhook.events) == ["task.progress", "task.state_changed"]

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while True:
            bodies = [json.loads(r.body) for r in receiver.requests]
            if any(b["type"] == "task.succeeded" for b in bodies):
                break
            assert loop.time() < deadline, f"no task.succeeded webhook: {bodies}"
            await asyncio.sleep(0.05)
        while True:  # the last answer is recorded just after the receiver has it
            listed = await stub.ListWebhookDeliveries(
                api.ListWebhookDeliveriesRequest(task_id=task_id), timeout=10
            )
            settled = [d for d in listed.deliveries if d.attempts]
            if len(settled) == len(receiver.requests) == len(listed.deliveries):
                break
            assert loop.time() < deadline, f"deliveries not settled: {listed}"
            await asyncio.sleep(0.05)

    received = receiver.requests
    payloads = [Webhook(SECRET).verify(r.body, r.headers) for r in received]
    types = [p["type"] for p in payloads]
    assert types[-1] == "task.succeeded"
    assert set(types[:-1]) == {"task.state_changed", "task.progress"}
    changes = [p for p in payloads if p["type"] != "task.progress"]
    states = [p["data"]["state"] for p in changes]
    assert states[0] == "SCHEDULING"
    assert states[-1] == "SUCCEEDED"
    versions = [p["data"]["status_version"] for p in changes]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)  # each change once
    fractions = [
        p["data"]["progress"]["fraction"] for p in payloads if p["type"] == "task.progress"
    ]
    assert fractions, "the emulator reports progress while RUNNING: some must travel"
    assert fractions == sorted(fractions)
    assert all(0 <= f <= 1 for f in fractions)
    outputs = payloads[-1]["data"]["outputs"]
    assert outputs
    assert outputs[0]["uri"].startswith("file://")
    assert all(p["data"]["task_id"] == task_id for p in payloads)

    deliveries = list(listed.deliveries)
    # Each delivery received is listed once, with its type; the listing's order among rows of
    # one instant is not the receipt order (the order received is checked above).
    by_id = {d.webhook_id: d.event_type for d in deliveries}
    assert (len(by_id), sorted(by_id)) == (
        len(deliveries),
        sorted(r.headers["webhook-id"] for r in received),
    )
    assert [by_id[r.headers["webhook-id"]] for r in received] == types
    for delivery in deliveries:
        assert delivery.state == scheduler_pb2.WEBHOOK_DELIVERY_STATE_DELIVERED
        assert delivery.url == url
        assert [(a.attempt_no, a.status_code) for a in delivery.attempts] == [(1, 200)]


async def test_a_bad_webhook_is_refused_at_create_task(control_plane: ControlPlaneServer) -> None:
    """A bad scheme and an unknown event are INVALID_ARGUMENT naming webhook.url and
    webhook.events[i]; a tenant without a signing secret is FAILED_PRECONDITION; neither writes."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.port}") as channel:
        stub = api_grpc.SchedulerServiceStub(channel)
        bad = api.CreateTaskRequest(
            spec=spec_for("runway"),
            idempotency_key=uuid.uuid4().hex,
            webhook=scheduler_pb2.WebhookSubscription(
                url="ftp://hooks.example.com/", events=["task.progress", "task.boom"]
            ),
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateTask(bad, timeout=10)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        request = error_details_pb2.BadRequest()
        assert _details(caught.value).details[0].Unpack(request)
        assert [v.field for v in request.field_violations] == [
            "webhook.url",
            "webhook.events[1]",
        ]

        spec = spec_for("runway")
        spec.tenant_id = "globex"
        unsigned = api.CreateTaskRequest(
            spec=spec,
            idempotency_key=uuid.uuid4().hex,
            webhook=scheduler_pb2.WebhookSubscription(url="https://hooks.example.com/"),
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateTask(unsigned, timeout=10)
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        info = error_details_pb2.ErrorInfo()
        assert _details(caught.value).details[0].Unpack(info)
        assert info.reason == "WEBHOOK_SECRET_MISSING"
        listed = await stub.ListTasks(api.ListTasksRequest(), timeout=10)
        assert list(listed.tasks) == []  # neither refused create wrote a task

"""The blocking `Client` against running control planes (see conftest): every method, on tasks
that really run at the Runway emulator, and `watch` resuming after the server drops its stream.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from clients.sdk import Client, errors
from tests.integration.sdk_client.conftest import WEBHOOK_TENANT, Plane, Stack
from tests.support.stack import spec_for
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

pytestmark = [pytest.mark.timeout(180)]


def _spec_dict(prompt: str) -> dict[str, object]:
    return {
        "tenant_id": "acme",
        "prompt": prompt,
        "mode": "MODE_TEXT_TO_VIDEO",
        "output": {"width": 1280, "height": 720, "duration_ms": 4000},
    }


def _until(condition: Callable[[], object], timeout_s: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_create_wait_get_explain_and_download_a_task_that_succeeds(
    stack: Stack, tmp_path: Path
) -> None:
    """create returns its generated key; wait sees every event up to SUCCEEDED (progress
    reports to on_progress) and returns the task; get, explain and download_output agree."""
    with Client(stack.target, token=stack.token) as client:
        made = client.create(spec_for("runway", prompt=f"a kite {uuid.uuid4().hex[:6]}"))
        assert made.created
        uuid.UUID(made.idempotency_key)  # generated: a uuid4
        assert made.task.idempotency_key == made.idempotency_key
        again = client.create(made.task.spec, idempotency_key=made.idempotency_key)
        assert (again.created, again.task.task_id) == (False, made.task.task_id)

        events: list[pb.TaskEvent] = []
        progress: list[pb.Progress] = []
        task = client.wait(
            made.task.task_id, timeout=120, on_event=events.append, on_progress=progress.append
        )
        assert task.state == pb.TASK_STATE_SUCCEEDED, task
        assert events[0].kind == pb.TASK_EVENT_KIND_CREATED
        assert (events[-1].kind, events[-1].task_state) == (
            pb.TASK_EVENT_KIND_TASK_STATE_CHANGED,
            pb.TASK_STATE_SUCCEEDED,
        )
        assert len({e.cursor for e in events}) == len(events)  # no event twice
        assert progress == [e.progress for e in events if e.HasField("progress")]

        got = client.get(task.task_id)
        assert got.attempts
        assert got.attempts[-1].provider == "runway"
        decisions = client.explain(task.task_id)
        assert decisions == list(got.route_decisions)
        assert decisions[0].selected_candidate

        dest = tmp_path / "kite.mp4"
        size = client.download_output(task.task_id, dest)
        assert size == got.output.size_bytes == dest.stat().st_size
        assert dest.read_bytes() == Path(got.output.uri.removeprefix("file://")).read_bytes()


class _Receiver(BaseHTTPRequestHandler):
    """Answers every POST 204 and keeps its webhook-id header."""

    ids: list[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.ids.append(self.headers.get("webhook-id", ""))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[str]]]:
    ids: list[str] = []
    handler = type("Receiver", (_Receiver,), {"ids": ids})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", ids
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_create_with_a_webhook_and_its_deliveries(
    stack: Stack, receiver: tuple[str, list[str]]
) -> None:
    """create(webhook=URL) subscribes the task (Task.webhook); webhook_deliveries lists the
    terminal message as DELIVERED once the test's receiver got it, under the same webhook-id."""
    url, received = receiver
    spec = spec_for("runway", prompt="a hooked kite")
    spec.tenant_id = WEBHOOK_TENANT
    with Client(stack.target, token=stack.token) as client:
        made = client.create(spec, webhook={"url": url, "events": ["task.state_changed"]})
        assert made.task.webhook.url == url
        assert list(made.task.webhook.events) == ["task.state_changed"]
        assert client.wait(made.task.task_id, timeout=120).state == pb.TASK_STATE_SUCCEEDED

        def delivered() -> list[pb.WebhookDelivery]:
            return [
                d
                for d in client.webhook_deliveries(made.task.task_id)
                if d.event_type == "task.succeeded"
                and d.state == pb.WEBHOOK_DELIVERY_STATE_DELIVERED
            ]

        _until(delivered, what="the task.succeeded webhook delivered")
        [succeeded] = delivered()
    assert succeeded.url == url
    assert succeeded.attempts[-1].status_code == 204
    assert succeeded.webhook_id in received


def test_list_iterates_every_page(stack: Stack) -> None:
    """list(page_size=1) walks the pages and yields each of the tenant's tasks once."""
    tenant = f"lister{uuid.uuid4().hex[:6]}"
    with Client(stack.target, token=stack.token) as client:
        made = []
        for n in range(3):
            spec = spec_for("runway", prompt=f"kite {n}")
            spec.tenant_id = tenant
            made.append(client.create(spec).task.task_id)
        listed = [t.task_id for t in client.list(tenant_id=tenant, page_size=1)]
        assert listed == list(reversed(made))  # newest first, every page
        for task_id in made:  # (and none left running at the emulator for the next test)
            assert client.wait(task_id, timeout=120).state == pb.TASK_STATE_SUCCEEDED
        succeeded = client.list(tenant_id=tenant, state="SUCCEEDED", page_size=2)
        assert [t.task_id for t in succeeded] == listed
        assert list(client.list(tenant_id=tenant, state=pb.TASK_STATE_QUEUED)) == []


def test_cancel_of_a_running_task_is_requested_then_already_finished(stack: Stack) -> None:
    """A task at the provider is REQUESTED (not yet CANCELLED), ends CANCELLED once the provider
    confirms, and cancelling it again is ALREADY_FINISHED with nothing changed. (Runway holds
    the job THROTTLED in its queue from its create on, for more polls than the test can make,
    so it cannot succeed before the cancel reaches it, however slow the machine.)"""
    stack.farm.emulator("runway").add_faults(
        {"route": "POST /v1/text_to_video", "times": 1, "action": "throttle_polls", "n": 10**6}
    )
    try:
        with Client(stack.target, token=stack.token) as client:
            task_id = client.create(spec_for("runway", prompt="a held kite")).task.task_id
            _until(
                lambda: client.get(task_id).state == pb.TASK_STATE_RUNNING,
                what="the job held THROTTLED at the provider",
            )
            first = client.cancel(task_id, reason="changed my mind")
            assert first.requested
            assert not first.cancelled
            assert not first.already_finished
            assert first.task.state not in (pb.TASK_STATE_CANCELLED, pb.TASK_STATE_SUCCEEDED)
            done = client.wait(task_id, timeout=60)
            assert done.state == pb.TASK_STATE_CANCELLED
            second = client.cancel(task_id)
            assert second.already_finished
            assert second.task.status_version == done.status_version
    finally:
        stack.farm.emulator("runway").clear_faults()


def test_admin_calls(stack: Stack) -> None:
    """providers lists the Runway account, health its breakers; force_breaker forces one OPEN
    and releases the override."""
    with Client(stack.target, token=stack.token) as client:
        providers = client.providers()
        assert "runway" in {p.provider for p in providers}
        runway = next(p for p in providers if p.provider == "runway")
        model = runway.capabilities[0].model
        forced = client.force_breaker(
            "runway", runway.account, runway.region, model, state="OPEN", reason="sdk test"
        )
        assert (forced.state, forced.forced, forced.model) == (pb.BREAKER_STATE_OPEN, True, model)
        assert forced in client.health("runway")
        released = client.force_breaker(
            "runway", runway.account, runway.region, model, state=None, reason="sdk test done"
        )
        assert not released.forced
        assert released in client.health("runway")


def test_errors_are_typed_with_their_details(stack: Stack) -> None:
    """A bad spec is InvalidArgument naming each bad field, an unknown id NotFound, a wrong
    token Unauthenticated; each str is one line."""
    with Client(stack.target, token=stack.token) as client:
        bad = _spec_dict("")
        bad["output"] = {"width": 1280, "height": 0, "duration_ms": 4000}
        with pytest.raises(errors.InvalidArgument) as invalid:
            client.create(bad)
        fields = {v.field for v in invalid.value.field_violations}
        assert {"prompt", "output.height"} <= fields, invalid.value.field_violations
        assert "\n" not in str(invalid.value)
        with pytest.raises(errors.NotFound):
            client.get("987654321")
    with (
        Client(stack.target, token="not-a-token") as stranger,
        pytest.raises(errors.Unauthenticated),
    ):
        stranger.get("1")


def test_cancel_of_a_queued_task_is_cancelled_at_once(plane: Plane) -> None:
    """With no scheduler the task stays QUEUED: the cancel is CANCELLED in the same call."""
    with Client(plane.target, token=plane.token) as client:
        task_id = client.create(_spec_dict("a kite")).task.task_id
        result = client.cancel(task_id)
        assert result.cancelled
        assert result.task.state == pb.TASK_STATE_CANCELLED


def test_watch_resumes_after_the_server_drops_the_stream(plane: Plane) -> None:
    """The server is restarted mid-watch: the watch reopens after its last cursor and yields
    the next event exactly once, then ends at the terminal state."""
    with Client(plane.target, token=plane.token) as client:
        task_id = client.create(_spec_dict("a watched kite")).task.task_id
        watch = client.watch(task_id)
        first = next(watch)
        assert first.kind == pb.TASK_EVENT_KIND_CREATED
        plane.restart()  # every connection and stream of the first server is gone
        with grpc.insecure_channel(plane.target) as channel:
            api_grpc.SchedulerServiceStub(channel).CancelTask(
                api.CancelTaskRequest(task_id=task_id),
                metadata=(("authorization", f"Bearer {plane.token}"),),
                wait_for_ready=True,
                timeout=30,
            )
        rest = list(watch)
    assert plane.starts == 2
    assert [(e.kind, e.task_state) for e in rest] == [
        (pb.TASK_EVENT_KIND_TASK_STATE_CHANGED, pb.TASK_STATE_CANCELLED)
    ]
    assert int(rest[0].cursor) > int(first.cursor)

"""The asyncio `AsyncClient` against running control planes (see conftest): every method, on
tasks that really run at the Runway emulator, and `watch` resuming after a server restart.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from clients.sdk import AsyncClient, errors
from tests.integration.sdk_client.conftest import Plane, Stack
from tests.support.stack import ROOT, local_path, spec_for
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

pytestmark = [pytest.mark.timeout(180)]
RUNWAY_CAPABILITIES = ROOT / "adapter_sidecars" / "runway" / "capabilities" / "runway-2026-06.yaml"
QUEUED_SPEC = {
    "tenant_id": "acme",
    "prompt": "a kite",
    "mode": "MODE_TEXT_TO_VIDEO",
    "output": {"width": 1280, "height": 720, "duration_ms": 4000},
}


async def test_async_client_runs_a_task_end_to_end(stack: Stack, tmp_path: Path) -> None:
    """create, wait (async and plain callbacks), get, list, explain, download_output into a
    binary file, webhook_deliveries, output_url and a cancel of the finished task."""
    tenant = f"async{uuid.uuid4().hex[:6]}"
    spec = spec_for("runway", prompt="an async kite")
    spec.tenant_id = tenant
    async with AsyncClient(stack.target, token=stack.token) as client:
        made = await client.create(spec, idempotency_key=f"key-{tenant}")
        assert (made.created, made.idempotency_key) == (True, f"key-{tenant}")

        seen: list[pb.TaskEvent] = []
        reports: list[pb.Progress] = []

        async def on_event(event: pb.TaskEvent) -> None:
            seen.append(event)

        task = await client.wait(
            made.task.task_id, timeout=120, on_event=on_event, on_progress=reports.append
        )
        assert task.state == pb.TASK_STATE_SUCCEEDED, task
        assert seen[-1].task_state == pb.TASK_STATE_SUCCEEDED
        assert reports  # the emulator reports progress while the job runs
        assert reports == [e.progress for e in seen if e.HasField("progress")]
        assert [e.cursor for e in seen] == sorted({e.cursor for e in seen}, key=int)

        assert (await client.get(task.task_id)).state == pb.TASK_STATE_SUCCEEDED
        assert [t.task_id async for t in client.list(tenant_id=tenant, page_size=1)] == [
            task.task_id
        ]
        decisions = await client.explain(task.task_id)
        assert decisions[0].selected_candidate

        with (tmp_path / "out.mp4").open("wb") as fh:
            size = await client.download_output(task.task_id, fh)
        stored = await asyncio.to_thread(local_path(task.output.uri).read_bytes)
        assert size == len(stored)
        assert await asyncio.to_thread((tmp_path / "out.mp4").read_bytes) == stored

        assert await client.webhook_deliveries(task.task_id) == []  # no webhook configured
        with pytest.raises(errors.FailedPrecondition):  # the file store cannot presign
            await client.output_url(task.task_id, expires_in_s=60)

        finished = await client.cancel(task.task_id)
        assert finished.already_finished
        assert finished.task.status_version == task.status_version


async def test_async_admin_calls(stack: Stack) -> None:
    """providers, health, force_breaker (forced and released) and publish_capabilities: a dry
    run of a new version of the shipped Runway file counts its rows; the shipped file itself
    changes nothing; a stored version with other content is rejected with the version named."""
    async with AsyncClient(stack.target, token=stack.token) as client:
        runway = next(p for p in await client.providers() if p.provider == "runway")
        model = runway.capabilities[0].model
        forced = await client.force_breaker(
            "runway", runway.account, runway.region, model, state="OPEN", reason="async test"
        )
        assert forced.forced
        assert forced in await client.health("runway")
        released = await client.force_breaker(
            "runway", runway.account, runway.region, model, state=None, reason="done"
        )
        assert not released.forced

        shipped = RUNWAY_CAPABILITIES.read_text(encoding="utf-8")
        newer = shipped.replace("2026-06-01", "2099-01-01").replace("2025-10-01", "2099-01-01")
        dry = await client.publish_capabilities(newer, source="runway-2099.yaml", dry_run=True)
        assert dry.dry_run
        assert sum(dry.counts.values()) > 0
        same = await client.publish_capabilities(RUNWAY_CAPABILITIES, dry_run=True)
        assert {c.kind for c in same.changes} == {"UNCHANGED"}  # what the sidecar described
        other = shipped.replace(
            "modes: [TEXT_TO_VIDEO, IMAGE_TO_VIDEO]", "modes: [IMAGE_TO_VIDEO]", 1
        )
        with pytest.raises(errors.InvalidArgument) as bad:
            await client.publish_capabilities(other, dry_run=True)
        assert "runway/gen4.5/2026-06-01" in bad.value.field_violations[0].description


async def test_async_bad_input_and_unknown_ids_are_typed_errors(stack: Stack) -> None:
    """InvalidArgument carries the field violations, NotFound the unknown id."""
    async with AsyncClient(stack.target, token=stack.token) as client:
        with pytest.raises(errors.InvalidArgument) as invalid:
            await client.create({**QUEUED_SPEC, "prompt": ""})
        assert "prompt" in {v.field for v in invalid.value.field_violations}
        with pytest.raises(errors.NotFound):
            await client.explain("987654321")
        with pytest.raises(errors.InvalidArgument):
            await client.list(state="NOT_A_STATE").__anext__()


async def test_async_cancel_of_a_queued_task_is_cancelled(plane: Plane) -> None:
    """No scheduler: the queued task is CANCELLED by the call itself."""
    async with AsyncClient(plane.target, token=plane.token) as client:
        task_id = (await client.create(QUEUED_SPEC)).task.task_id
        result = await client.cancel(task_id, reason="async")
        assert result.cancelled
        assert result.task.state == pb.TASK_STATE_CANCELLED


async def test_async_watch_resumes_after_the_server_drops_the_stream(plane: Plane) -> None:
    """The server restarts between two events: the async watch reopens after its cursor and
    yields the cancellation once, then ends."""
    async with AsyncClient(plane.target, token=plane.token) as client:
        task_id = (await client.create(QUEUED_SPEC)).task.task_id
        watch = client.watch(task_id)
        first = await watch.__anext__()
        assert first.kind == pb.TASK_EVENT_KIND_CREATED
        await asyncio.to_thread(plane.restart)
        async with grpc.aio.insecure_channel(plane.target) as channel:
            await api_grpc.SchedulerServiceStub(channel).CancelTask(
                api.CancelTaskRequest(task_id=task_id),
                metadata=(("authorization", f"Bearer {plane.token}"),),
                wait_for_ready=True,
                timeout=30,
            )
        rest = [event async for event in watch]
    assert plane.starts == 2
    assert [(e.kind, e.task_state) for e in rest] == [
        (pb.TASK_EVENT_KIND_TASK_STATE_CHANGED, pb.TASK_STATE_CANCELLED)
    ]

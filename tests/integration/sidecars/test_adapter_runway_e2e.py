"""The Runway sidecar end to end: gRPC in-process over a real channel, emulator over real HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

import grpc
import pytest
from adapter_support import make_spec
from google.protobuf import timestamp_pb2

from adapter_sidecars.emulators import RunwayEmulator
from adapter_sidecars.runway.adapter import RunwayAdapter
from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute_core.spec import GenerationSpec, Mode
from vidroute_core.wire.spec import spec_to_proto

if TYPE_CHECKING:  # types only: pytest loads conftest; the async stub is only in the .pyi
    from tests.integration.sidecars.conftest import SidecarFactory
    from vidroute.adapter.v1.adapter_service_pb2_grpc import ProviderAdapterServiceAsyncStub as Stub


def _ts(when: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when)
    return ts


async def _compile(stub: Stub, spec: GenerationSpec, model: str = "gen4.5") -> pb.CompilePlan:
    response = await stub.Compile(svc.CompileRequest(spec=spec_to_proto(spec), model=model))
    return response.plan


async def test_describe_lists_every_model_for_the_configured_account(
    runway_adapter: RunwayAdapter, sidecar_factory: SidecarFactory
) -> None:
    """Describe returns one entry per model, stamped with the account and its region, and
    declares no task search (the real Runway has no task listing)."""
    sidecar = await sidecar_factory(runway_adapter)
    response = await sidecar.stub.Describe(svc.DescribeRequest())
    assert response.adapter == "runway"
    models = {c.model: c for c in response.capabilities}
    assert set(models) == {"gen4.5", "gen4_turbo", "veo3.1"}
    gen45 = models["gen4.5"]
    assert (gen45.account, gen45.region) == ("prod-us", "us")
    assert gen45.price.per_output_second.amount_micros == 120_000
    assert not any(c.operations.task_search for c in response.capabilities)
    assert models["veo3.1"].constraints[0].require == "duration_seconds == 8"


async def test_compile_submit_poll_until_succeeded(
    runway_adapter: RunwayAdapter, sidecar_factory: SidecarFactory
) -> None:
    """A text-to-video plan is accepted and polls through QUEUED/RUNNING to SUCCEEDED, whose
    cost.credits becomes the actual cost in micros."""
    sidecar = await sidecar_factory(runway_adapter)
    plan = await _compile(sidecar.stub, make_spec())
    assert plan.submittable
    assert json.loads(plan.native_request_json) == {
        "model": "gen4.5",
        "promptText": "a lighthouse at dusk, waves crashing",
        "ratio": "1280:720",
        "duration": 5,
    }
    assert plan.estimated_cost.amount_micros == 600_000
    submitted = await sidecar.stub.Submit(svc.SubmitRequest(plan=plan, client_request_key="att-1"))
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_ACCEPTED
    assert submitted.transport_stage == pb.TRANSPORT_STAGE_UNSPECIFIED
    job = submitted.job
    seen = []
    for _ in range(10):
        status = (await sidecar.stub.GetJob(svc.GetJobRequest(job=job))).status
        seen.append(status.state)
        if status.state == pb.JOB_STATE_SUCCEEDED:
            break
    assert pb.JOB_STATE_QUEUED in seen
    assert pb.JOB_STATE_RUNNING in seen
    assert seen[-1] == pb.JOB_STATE_SUCCEEDED
    output = status.outputs[0]
    assert output.uri.startswith(runway_adapter.config.base_url)
    expires = output.expires_at.ToDatetime(tzinfo=UTC)
    assert timedelta(hours=23) < expires - datetime.now(UTC) < timedelta(hours=25)
    assert json.loads(status.raw_payload_json)["status"] == "SUCCEEDED"
    # cost.credits of the finished task (60 credits at 10000 micros each) is the actual cost.
    assert (status.actual_cost.amount_micros, status.actual_cost.currency_code) == (
        600_000,
        "USD",
    )


async def test_unsubmittable_plan_is_refused_by_submit(
    runway_adapter: RunwayAdapter, sidecar_factory: SidecarFactory
) -> None:
    """A plan with a REJECT is INVALID_ARGUMENT at Submit; nothing reaches the provider."""
    sidecar = await sidecar_factory(runway_adapter)
    plan = await _compile(sidecar.stub, make_spec(mode=Mode.FIRST_LAST_TO_VIDEO))
    assert not plan.submittable
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await sidecar.stub.Submit(svc.SubmitRequest(plan=plan, client_request_key="att-2"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_compile_of_unknown_model_is_not_found(
    runway_adapter: RunwayAdapter, sidecar_factory: SidecarFactory
) -> None:
    """Compiling for a model the adapter does not describe is NOT_FOUND."""
    sidecar = await sidecar_factory(runway_adapter)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _compile(sidecar.stub, make_spec(), model="gen9")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_invalid_spec_is_invalid_argument_with_field_violations(
    runway_adapter: RunwayAdapter, sidecar_factory: SidecarFactory
) -> None:
    """An invalid spec is INVALID_ARGUMENT, decoded by the shared spec decoder."""
    sidecar = await sidecar_factory(runway_adapter)
    spec = spec_to_proto(make_spec())
    spec.prompt = ""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await sidecar.stub.Compile(svc.CompileRequest(spec=spec, model="gen4.5"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("delete_mode", ["cancel", "delete"])
async def test_cancel_is_idempotent_in_both_delete_modes(
    delete_mode: Literal["cancel", "delete"], sidecar_factory: SidecarFactory
) -> None:
    """Cancelling twice is acknowledged both times, whether Runway keeps or deletes the task;
    a later poll reads CANCELLED, or (deleted) JOB_NOT_FOUND, never a made-up status."""
    from adapter_support import sidecar_config

    from adapter_sidecars.emulators import RunwayConfig

    async with RunwayEmulator(RunwayConfig(delete_mode=delete_mode)) as emu:
        adapter = RunwayAdapter.from_config(sidecar_config(emu.url, "RUNWAY_API_KEY"))
        sidecar = await sidecar_factory(adapter)
        plan = await _compile(sidecar.stub, make_spec())
        job = (await sidecar.stub.Submit(svc.SubmitRequest(plan=plan, client_request_key="k"))).job
        for _ in range(2):
            cancelled = await sidecar.stub.CancelJob(svc.CancelJobRequest(job=job))
            assert cancelled.acknowledged
        polled = await sidecar.stub.GetJob(svc.GetJobRequest(job=job))
        if delete_mode == "cancel":
            assert polled.status.state == pb.JOB_STATE_CANCELLED
        else:
            assert polled.status.state == pb.JOB_STATE_UNSPECIFIED
            assert polled.error.code == "JOB_NOT_FOUND"


async def test_usage_reports_credits_as_milliunits_and_micros(
    runway_adapter: RunwayAdapter, runway_emulator: RunwayEmulator, sidecar_factory: SidecarFactory
) -> None:
    """ListUsage turns Runway's daily credits into provider milliunits and USD micros."""
    sidecar = await sidecar_factory(runway_adapter)
    runway_emulator.add_usage({"model": "gen4.5", "credits": 60})
    now = datetime.now(UTC)
    response = await sidecar.stub.ListUsage(
        svc.ListUsageRequest(
            account="prod-us", start_time=_ts(now - timedelta(days=1)), end_time=_ts(now)
        )
    )
    assert not response.HasField("error")
    (record,) = response.records
    assert (record.model, record.provider_unit) == ("gen4.5", "credits")
    assert record.provider_milliunits == 60_000
    assert record.cost.amount_micros == 600_000


async def test_health_serving_once_provider_answers(
    runway_adapter: RunwayAdapter, sidecar_factory: SidecarFactory
) -> None:
    """The sidecar reports SERVING for the adapter service after a successful probe."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from adapter_sidecars.common.server import ADAPTER_SERVICE

    sidecar = await sidecar_factory(runway_adapter)
    health = health_pb2_grpc.HealthStub(sidecar.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=ADAPTER_SERVICE))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

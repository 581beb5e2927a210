"""Every adapter through its gRPC sidecar: job lifecycle, cancel, recovery verdicts, usage.

`world` is each adapter against its emulator as the real provider behaves. `searchable` is each
adapter with a recovery search: self-hosted (its job API has a lookup by idempotency key) and
Runway / Veo with their emulator-only listings switched on by name (``task_listing``,
``operation_list``), for the tests of the search itself.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from adapter_support import make_spec
from google.protobuf import timestamp_pb2

from adapter_sidecars.runway.adapter import RunwayAdapter
from adapter_sidecars.selfhosted.adapter import SelfHostedAdapter
from adapter_sidecars.veo.adapter import VeoAdapter
from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute_core.wire.spec import spec_to_proto

if TYPE_CHECKING:  # types only: pytest loads conftest; the async stub is only in the .pyi
    from tests.integration.sidecars.conftest import SidecarFactory
    from vidroute.adapter.v1.adapter_service_pb2_grpc import ProviderAdapterServiceAsyncStub as Stub

MODELS = {"runway": "gen4.5", "veo": "veo-3.1-generate-preview", "selfhosted": "wan2.2-t2v"}
ROUTES = {
    "runway": "POST /v1/text_to_video",
    "veo": "POST /v1beta/models/*:predictLongRunning",
    "selfhosted": "POST /v1/jobs",
}

# (name, adapter, emulator) and (name, stub, emulator): the three providers share no typed base.
Provider = tuple[str, Any, Any]
World = tuple[str, "Stub", Any]


def _ts(when: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when)
    return ts


@pytest.fixture(params=list(MODELS))
def provider(request: pytest.FixtureRequest) -> Provider:
    """(name, adapter, emulator) for each adapter."""
    name = request.param
    return (
        name,
        request.getfixturevalue(f"{name}_adapter"),
        request.getfixturevalue(f"{name}_emulator"),
    )


@pytest.fixture
async def world(provider: Provider, sidecar_factory: SidecarFactory) -> World:
    """(name, stub, emulator), the adapter served by an in-process sidecar."""
    name, adapter, emulator = provider
    sidecar = await sidecar_factory(adapter)
    return name, sidecar.stub, emulator


@pytest.fixture(params=list(MODELS))
def search_provider(request: pytest.FixtureRequest) -> Provider:
    """(name, adapter, emulator) of an adapter that can search: emulator extensions on by name."""
    name = request.param
    suffix = "" if name == "selfhosted" else "_search"
    return (
        name,
        request.getfixturevalue(f"{name}{suffix}_adapter"),
        request.getfixturevalue(f"{name}{suffix}_emulator"),
    )


@pytest.fixture
async def searchable(search_provider: Provider, sidecar_factory: SidecarFactory) -> World:
    """(name, stub, emulator) of a searching adapter behind an in-process sidecar."""
    name, adapter, emulator = search_provider
    return name, (await sidecar_factory(adapter)).stub, emulator


@pytest.fixture(params=["runway", "veo"])
def real_provider(request: pytest.FixtureRequest) -> Provider:
    """(name, adapter, emulator) of Runway / Veo as the real providers are: no listing at all."""
    name = request.param
    return (
        name,
        request.getfixturevalue(f"{name}_adapter"),
        request.getfixturevalue(f"{name}_emulator"),
    )


@pytest.fixture
async def unsearchable(real_provider: Provider, sidecar_factory: SidecarFactory) -> World:
    """(name, stub, emulator) of a real-provider adapter behind an in-process sidecar."""
    name, adapter, emulator = real_provider
    return name, (await sidecar_factory(adapter)).stub, emulator


async def _plan(name: str, stub: Stub) -> pb.CompilePlan:
    spec = make_spec(duration_ms=8000)
    response = await stub.Compile(svc.CompileRequest(spec=spec_to_proto(spec), model=MODELS[name]))
    assert response.plan.submittable
    return response.plan


async def _submit(
    stub: Stub, plan: pb.CompilePlan, key: str
) -> tuple[svc.SubmitResponse, datetime, datetime]:
    before = datetime.now(UTC)
    response = await stub.Submit(svc.SubmitRequest(plan=plan, client_request_key=key))
    return response, before, datetime.now(UTC)


def _recover_request(
    plan: pb.CompilePlan, key: str, after: datetime, before: datetime
) -> svc.RecoverSubmissionRequest:
    return svc.RecoverSubmissionRequest(
        account=plan.account,
        model=plan.model,
        client_request_key=key,
        request_hash=plan.request_hash,
        submitted_after=_ts(after),
        submitted_before=_ts(before),
        plan=plan,
    )


async def test_job_runs_to_success_with_outputs(world: World) -> None:
    """An accepted job polls to SUCCEEDED with an output URL and the raw payload kept."""
    name, stub, _ = world
    submitted, _, _ = await _submit(stub, await _plan(name, stub), "k-success")
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_ACCEPTED
    for _ in range(10):
        status = (await stub.GetJob(svc.GetJobRequest(job=submitted.job))).status
        if status.state == pb.JOB_STATE_SUCCEEDED:
            break
    assert status.state == pb.JOB_STATE_SUCCEEDED
    assert status.outputs[0].uri
    assert status.raw_payload_json


async def test_dropped_response_is_recovered_to_the_created_job(searchable: World) -> None:
    """With a search, after drop_after_body the submit is UNKNOWN and recovery FINDS the one
    job created."""
    name, stub, emulator = searchable
    plan = await _plan(name, stub)
    emulator.add_faults({"route": ROUTES[name], "action": "drop_after_body"})
    submitted, after, before = await _submit(stub, plan, "k-dropped")
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_UNKNOWN
    [truth] = emulator.truth()
    recovered = await stub.RecoverSubmission(_recover_request(plan, "k-dropped", after, before))
    assert recovered.verdict == pb.RECOVERY_VERDICT_FOUND
    assert recovered.job.provider_job_id == truth["id"]
    assert recovered.method


async def test_never_created_is_not_found_once_the_window_settles(searchable: World) -> None:
    """With a search and nothing created, recovery is NOT_FOUND only after the submit window
    settled."""
    name, stub, _ = searchable
    plan = await _plan(name, stub)
    now = datetime.now(UTC)
    verdict = None
    for _ in range(60):
        response = await stub.RecoverSubmission(
            _recover_request(plan, "k-never", now - timedelta(seconds=2), now)
        )
        verdict = response.verdict
        if verdict != pb.RECOVERY_VERDICT_INCONCLUSIVE:
            break
        await asyncio.sleep(0.1)
    assert verdict == pb.RECOVERY_VERDICT_NOT_FOUND


async def test_without_a_listing_recovery_is_inconclusive_and_says_why(unsearchable: World) -> None:
    """Against Runway / Veo as they really are (no listing), recovery of a dropped submit and
    of a never-created one is INCONCLUSIVE, never NOT_FOUND, and its method names the missing
    capability; no listing route is even called."""
    name, stub, emulator = unsearchable
    plan = await _plan(name, stub)
    emulator.add_faults({"route": ROUTES[name], "action": "drop_after_body"})
    submitted, after, before = await _submit(stub, plan, "k-dropped")
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_UNKNOWN
    assert len(emulator.truth()) == 1
    long_ago = before - timedelta(hours=1)
    for window in ((after, before), (long_ago - timedelta(seconds=2), long_ago)):
        recovered = await stub.RecoverSubmission(_recover_request(plan, "k", *window))
        assert recovered.verdict == pb.RECOVERY_VERDICT_INCONCLUSIVE
        assert "unsupported" in recovered.method
        assert "listing" in recovered.method
    listings = [k for k in emulator.counters if k == "GET /v1/tasks" or k.endswith("/operations")]
    assert listings == []


async def test_cancel_is_acknowledged_or_honestly_unsupported(world: World) -> None:
    """Cancel is acknowledged twice where supported; Veo says UNSUPPORTED while running."""
    name, stub, _ = world
    submitted, _, _ = await _submit(stub, await _plan(name, stub), "k-cancel")
    first = await stub.CancelJob(svc.CancelJobRequest(job=submitted.job))
    second = await stub.CancelJob(svc.CancelJobRequest(job=submitted.job))
    if name == "veo":
        assert not first.acknowledged
        assert first.error.error_class == 2  # ERROR_CLASS_UNSUPPORTED_CAPABILITY
        return
    assert first.acknowledged
    assert second.acknowledged
    status = (await stub.GetJob(svc.GetJobRequest(job=submitted.job))).status
    assert status.state == pb.JOB_STATE_CANCELLED


async def test_usage_after_a_finished_job(searchable: World) -> None:
    """ListUsage reports the finished job's provider units in milliunits with a cost (Veo: from
    the emulator's billing export, named)."""
    name, stub, _ = searchable
    submitted, _, _ = await _submit(stub, await _plan(name, stub), "k-usage")
    for _ in range(10):
        status = (await stub.GetJob(svc.GetJobRequest(job=submitted.job))).status
        if status.state == pb.JOB_STATE_SUCCEEDED:
            break
    now = datetime.now(UTC)
    usage = await stub.ListUsage(
        svc.ListUsageRequest(
            account="prod-us",
            start_time=_ts(now - timedelta(hours=1)),
            end_time=_ts(now + timedelta(minutes=1)),
        )
    )
    assert not usage.HasField("error")
    assert usage.records
    assert all(r.provider_milliunits > 0 and r.cost.amount_micros > 0 for r in usage.records)


async def _finished(name: str, stub: Stub) -> None:
    submitted, _, _ = await _submit(stub, await _plan(name, stub), f"k-{name}-usage")
    for _ in range(10):
        status = (await stub.GetJob(svc.GetJobRequest(job=submitted.job))).status
        if status.state == pb.JOB_STATE_SUCCEEDED:
            return
    raise AssertionError(f"job did not succeed: {status}")


def _usage_request() -> svc.ListUsageRequest:
    now = datetime.now(UTC)
    return svc.ListUsageRequest(
        account="prod-us",
        start_time=_ts(now - timedelta(days=1)),
        end_time=_ts(now + timedelta(days=1)),
    )


async def test_runway_usage_records_name_no_job(
    runway_adapter: RunwayAdapter, sidecar_factory: SidecarFactory
) -> None:
    """Runway's usage is a daily total per model: its records carry no provider job id, so
    nothing downstream can take a day's total for a job."""
    stub = (await sidecar_factory(runway_adapter)).stub
    await _finished("runway", stub)
    usage = await stub.ListUsage(_usage_request())
    assert not usage.HasField("error")
    [record] = usage.records
    assert (record.model, record.provider_milliunits) == ("gen4.5", 96_000)
    assert (record.provider_job_id, record.client_request_key) == ("", "")


async def test_selfhosted_usage_records_name_their_job_and_key(
    selfhosted_adapter: SelfHostedAdapter, sidecar_factory: SidecarFactory
) -> None:
    """Our job API's usage rows name the job and the Idempotency-Key it was created with, so
    a record identifies exactly one attempt's job."""
    stub = (await sidecar_factory(selfhosted_adapter)).stub
    submitted, _, _ = await _submit(stub, await _plan("selfhosted", stub), "k-selfhosted-usage")
    for _ in range(10):
        status = (await stub.GetJob(svc.GetJobRequest(job=submitted.job))).status
        if status.state == pb.JOB_STATE_SUCCEEDED:
            break
    usage = await stub.ListUsage(_usage_request())
    [record] = usage.records
    assert (record.provider_job_id, record.client_request_key) == (
        submitted.job.provider_job_id,
        "k-selfhosted-usage",
    )


async def test_veo_usage_without_an_export_is_unsupported(
    veo_adapter: VeoAdapter, sidecar_factory: SidecarFactory
) -> None:
    """The Gemini API has no usage export: ListUsage answers UNSUPPORTED_CAPABILITY, not an
    empty list that would read as "nothing was billed"."""
    stub = (await sidecar_factory(veo_adapter)).stub
    await _finished("veo", stub)
    usage = await stub.ListUsage(_usage_request())
    assert usage.error.error_class == 2  # ERROR_CLASS_UNSUPPORTED_CAPABILITY
    assert list(usage.records) == []

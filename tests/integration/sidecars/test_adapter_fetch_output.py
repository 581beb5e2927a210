"""FetchOutput through a sidecar: outputs that need the provider's credentials (Gemini files).

The Veo emulator here requires the exact API key, so a download that succeeds proves the key
was sent; its stats count the file downloads; its truth says which jobs exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import httpx
import pytest
from adapter_support import Asset, AssetServer, make_spec, sidecar_config

from adapter_sidecars.common.types import ProviderAdapter
from adapter_sidecars.emulators import VeoConfig, VeoEmulator
from adapter_sidecars.emulators.http import BodyReader, HttpServer, Request, Response
from adapter_sidecars.veo.adapter import VeoAdapter
from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute.common.v1 import error_pb2
from vidroute_core.wire.spec import spec_to_proto

if TYPE_CHECKING:  # types only: pytest loads conftest; the async stub is only in the .pyi
    from tests.integration.sidecars.conftest import SidecarFactory
    from vidroute.adapter.v1.adapter_service_pb2_grpc import ProviderAdapterServiceAsyncStub as Stub

pytestmark = pytest.mark.timeout(60)

KEY = "key_test"  # what sidecar_config's credential_ref resolves to
MODEL = "veo-3.1-generate-preview"
FILES = "GET /v1beta/files/*"
CHUNK = 64 * 1024


@pytest.fixture
async def keyed_veo() -> AsyncIterator[VeoEmulator]:
    """A Veo emulator that accepts only the sidecar's key."""
    async with VeoEmulator(VeoConfig(api_key=KEY, queued_polls=0, running_polls=1)) as emu:
        yield emu


@pytest.fixture
async def stub(keyed_veo: VeoEmulator, sidecar_factory: SidecarFactory) -> AsyncIterator[Stub]:
    """A Veo sidecar in front of `keyed_veo`."""
    adapter = VeoAdapter.from_config(sidecar_config(keyed_veo.url, "GEMINI_API_KEY"))
    sidecar = await sidecar_factory(adapter)
    yield sidecar.stub
    await adapter.aclose()


async def _succeeded(stub: Stub) -> tuple[pb.JobRef, pb.Output]:
    spec = make_spec(duration_ms=8000)
    compiled = await stub.Compile(svc.CompileRequest(spec=spec_to_proto(spec), model=MODEL))
    submitted = await stub.Submit(svc.SubmitRequest(plan=compiled.plan, client_request_key="k1"))
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_ACCEPTED
    for _ in range(10):
        status = (await stub.GetJob(svc.GetJobRequest(job=submitted.job))).status
        if status.state == pb.JOB_STATE_SUCCEEDED:
            return submitted.job, status.outputs[0]
    raise AssertionError(f"job did not succeed: {status}")


async def _fetch(
    stub: Stub, job: pb.JobRef, uri: str, max_bytes: int = 0
) -> list[svc.FetchOutputResponse]:
    request = svc.FetchOutputRequest(job=job, uri=uri, max_bytes=max_bytes)
    return [reply async for reply in stub.FetchOutput(request)]


async def test_veo_output_streams_through_the_sidecar_with_the_key(
    stub: Stub, keyed_veo: VeoEmulator
) -> None:
    """A Gemini file URI (Google's https shape) is flagged, carries no key, 403s without it at
    the provider, and FetchOutput streams the MP4 by file id through the sidecar's base URL in
    64 KiB chunks with the content type declared first."""
    job, output = await _succeeded(stub)
    assert output.fetch_through_adapter
    assert output.uri.startswith("https://generativelanguage.googleapis.com/v1beta/files/")
    assert KEY not in output.uri
    # The download path at the provider, as google-genai builds it from the file id.
    at_provider = keyed_veo.url + httpx.URL(output.uri).raw_path.decode()
    async with httpx.AsyncClient(follow_redirects=True) as http:
        assert (await http.get(at_provider)).status_code == 403  # the control plane's old path
        direct = await http.get(at_provider, headers={"x-goog-api-key": KEY})

    replies = await _fetch(stub, job, output.uri)

    assert not any(r.HasField("error") for r in replies)
    assert replies[0].content_type.startswith("video/mp4")
    assert replies[0].content_length == len(direct.content)
    assert all(len(r.chunk) <= CHUNK for r in replies)
    body = b"".join(r.chunk for r in replies)
    assert body == direct.content
    assert body[4:8] == b"ftyp"
    downloads = {k: v for k, v in keyed_veo.counters.items() if k.startswith("GET /v1beta/files/")}
    assert sum(downloads.values()) == 3  # two direct GETs above, one through the sidecar
    assert len(keyed_veo.truth()) == 1


async def test_fetch_output_refuses_a_foreign_host(stub: Stub, asset_server: AssetServer) -> None:
    """A URI that is not on the provider's host is INVALID_ARGUMENT and is never requested."""
    job, _output = await _succeeded(stub)
    foreign = asset_server.add("/steal.mp4", _asset())
    for uri in (foreign, "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _fetch(stub, job, uri)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, uri
    assert asset_server.requests == []


async def test_expired_file_is_output_expired(stub: Stub, keyed_veo: VeoEmulator) -> None:
    """A file past retention (the emulator's expire_output) ends the stream with OUTPUT_EXPIRED."""
    keyed_veo.add_faults({"route": "GET /v1beta/models/*/operations/*", "action": "expire_output"})
    job, output = await _succeeded(stub)
    [reply] = await _fetch(stub, job, output.uri)
    assert reply.error.error_class == error_pb2.ERROR_CLASS_OUTPUT_EXPIRED
    assert reply.error.raw_status_code == 404
    assert not reply.chunk


async def test_provider_5xx_is_transient(stub: Stub, keyed_veo: VeoEmulator) -> None:
    """A 503 on the download is TRANSIENT_NETWORK (fetch again later)."""
    job, output = await _succeeded(stub)
    keyed_veo.add_faults({"route": FILES, "action": "status", "code": 503})
    [reply] = await _fetch(stub, job, output.uri)
    assert reply.error.error_class == error_pb2.ERROR_CLASS_TRANSIENT_NETWORK
    assert reply.error.raw_status_code == 503


async def test_body_over_max_bytes_is_cut_off(stub: Stub) -> None:
    """The caller's max_bytes caps the stream: the body is not sent, the error says why."""
    job, output = await _succeeded(stub)
    replies = await _fetch(stub, job, output.uri, max_bytes=100)
    assert replies[-1].error.code == "OUTPUT_TOO_LARGE"
    assert sum(len(r.chunk) for r in replies) <= 100


async def test_unknown_account_is_not_found(stub: Stub) -> None:
    """A job of an account this sidecar does not hold is NOT_FOUND."""
    job, output = await _succeeded(stub)
    other = pb.JobRef(provider_job_id=job.provider_job_id, account="someone-else")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _fetch(stub, other, output.uri)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def _asset() -> Asset:
    return Asset(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 100, content_type="video/mp4")


async def test_redirect_to_another_host_drops_the_key(
    sidecar_factory: SidecarFactory,
    asset_server: AssetServer,
) -> None:
    """The provider redirects the download to a storage host: that hop gets no credentials."""
    stored = asset_server.add("/bucket/out.mp4", _asset())
    seen: list[Request] = []

    async def provider(request: Request, read_body: BodyReader) -> Response:
        seen.append(request)
        await read_body(None)
        return Response.empty(302, [("location", stored)])

    server = HttpServer(provider)
    await server.start()
    try:
        adapter = VeoAdapter.from_config(sidecar_config(server.url, "GEMINI_API_KEY"))
        stub = (await sidecar_factory(adapter)).stub
        job = pb.JobRef(provider_job_id=f"models/{MODEL}/operations/x", account="prod-us")
        replies = await _fetch(stub, job, f"{server.url}/v1beta/files/abc:download?alt=media")
        await adapter.aclose()
    finally:
        await server.stop()
    assert not any(r.HasField("error") for r in replies), replies
    assert b"".join(r.chunk for r in replies)[4:8] == b"ftyp"
    assert seen[0].header("x-goog-api-key") == KEY
    [hop] = asset_server.requests
    assert hop.header("x-goog-api-key") is None
    assert hop.header("authorization") is None


@pytest.fixture(params=["runway", "selfhosted"])
def signed_url_adapter(request: pytest.FixtureRequest) -> tuple[str, ProviderAdapter]:
    """(model, adapter) of the providers whose outputs are signed URLs."""
    name = request.param
    model = {"runway": "gen4.5", "selfhosted": "wan2.2-t2v"}[name]
    return model, request.getfixturevalue(f"{name}_adapter")


async def test_signed_url_outputs_are_not_flagged(
    signed_url_adapter: tuple[str, ProviderAdapter], sidecar_factory: SidecarFactory
) -> None:
    """Runway and self-hosted outputs (signed URLs anyone may GET) stay unflagged."""
    model, adapter = signed_url_adapter
    stub = (await sidecar_factory(adapter)).stub
    spec = make_spec(duration_ms=5000)
    compiled = await stub.Compile(svc.CompileRequest(spec=spec_to_proto(spec), model=model))
    assert compiled.plan.submittable
    submitted = await stub.Submit(svc.SubmitRequest(plan=compiled.plan, client_request_key="k1"))
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_ACCEPTED, submitted
    for _ in range(20):
        status = (await stub.GetJob(svc.GetJobRequest(job=submitted.job))).status
        if status.state == pb.JOB_STATE_SUCCEEDED:
            break
    assert status.state == pb.JOB_STATE_SUCCEEDED
    assert status.outputs
    assert not any(o.fetch_through_adapter for o in status.outputs)

"""Veo image assets: compiled as references, inlined as base64 at Submit, matched in recovery.

The Gemini API only takes images as ``bytesBase64Encoded`` + ``mimeType`` (provider-apis.md
§2.1). Assets are served by a real HTTP server (`AssetServer`); the emulator's truth shows what
Google would have received. The API boundary only admits https asset URIs, so plans here come
from the adapter's own ``compile_native`` (the compile path minus spec validation) with
http://127.0.0.1 URIs, and then go through the sidecar over gRPC like any plan.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from adapter_support import IMAGE, Asset, AssetServer, make_spec, sidecar_config
from google.protobuf import timestamp_pb2

from adapter_sidecars.common.types import CompileInput
from adapter_sidecars.emulators import VeoEmulator
from adapter_sidecars.veo.adapter import VeoAdapter
from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.adapter.v1 import adapter_service_pb2 as svc
from vidroute.common.v1 import error_pb2
from vidroute_core.adapter import CompiledPlan, TransformationKind
from vidroute_core.spec import AssetRef, Mode
from vidroute_core.wire import adapter as wire

if TYPE_CHECKING:  # types only: pytest loads conftest; the async stub is only in the .pyi
    from tests.integration.sidecars.conftest import SidecarFactory
    from vidroute.adapter.v1.adapter_service_pb2_grpc import ProviderAdapterServiceAsyncStub as Stub

MODEL = "veo-3.1-generate-preview"
SUBMIT_ROUTE = f"POST /v1beta/models/{MODEL}:predictLongRunning"
# A 1x1 PNG and a (fake) JPEG: only the bytes and the types matter here.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg body" * 10
MAX_BYTES = 4096


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _inline(data: bytes, mime: str) -> dict[str, str]:
    return {"bytesBase64Encoded": base64.b64encode(data).decode(), "mimeType": mime}


def _ts(when: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when)
    return ts


@pytest.fixture
def veo_emulator(veo_search_emulator: VeoEmulator) -> VeoEmulator:
    """The Veo emulator with its operations listing named: the recovery tests here are about
    matching listed requests (images as bytes), which the real Gemini API cannot list."""
    return veo_search_emulator


@pytest.fixture
async def adapter(veo_emulator: VeoEmulator) -> AsyncIterator[VeoAdapter]:
    """A Veo adapter with a small asset cap, a short fetch deadline and the listing search."""
    options = {
        "recovery_settle_seconds": 0,
        "asset_max_bytes": MAX_BYTES,
        "asset_fetch_timeout_seconds": 0.5,
        "operation_list": True,
    }
    adapter = VeoAdapter.from_config(
        sidecar_config(veo_emulator.url, "GEMINI_API_KEY", options=options)
    )
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def stub(adapter: VeoAdapter, sidecar_factory: SidecarFactory) -> Stub:
    return (await sidecar_factory(adapter)).stub


def _plan(adapter: VeoAdapter, first: AssetRef, last: AssetRef | None = None) -> pb.CompilePlan:
    mode = Mode.IMAGE_TO_VIDEO if last is None else Mode.FIRST_LAST_TO_VIDEO
    spec = make_spec(mode=mode, duration_ms=8000, first_frame=first, last_frame=last)
    plan = adapter.compile_native(spec, adapter.capability("prod-us", MODEL))
    assert plan.submittable, plan.transformations
    return wire.plan_to_proto(plan)


async def _submit(stub: Stub, plan: pb.CompilePlan, key: str) -> svc.SubmitResponse:
    return await stub.Submit(svc.SubmitRequest(plan=plan, client_request_key=key))


async def _recover(
    stub: Stub, plan: pb.CompilePlan, after: datetime, before: datetime
) -> tuple[int, str]:
    """(verdict, job id) for a submit sent within [after, before]."""
    response = await stub.RecoverSubmission(
        svc.RecoverSubmissionRequest(
            account=plan.account,
            model=plan.model,
            client_request_key="k",
            request_hash=plan.request_hash,
            submitted_after=_ts(after),
            submitted_before=_ts(before),
            plan=plan,
        )
    )
    return response.verdict, response.job.provider_job_id


def _submits(emulator: VeoEmulator) -> int:
    return emulator.counters[SUBMIT_ROUTE]


# -- compile -------------------------------------------------------------------------------------
def test_compile_keeps_references_offline_and_hash_ignores_signatures() -> None:
    """Compile does no I/O (the assets' host does not exist): each image slot is the asset
    reference with its checksum, and re-signing the URL keeps the request hash."""
    adapter = VeoAdapter.from_config(sidecar_config("http://127.0.0.1:9", "KEY"))

    def compile_with(first: AssetRef) -> CompiledPlan:
        spec = make_spec(mode=Mode.IMAGE_TO_VIDEO, duration_ms=8000, first_frame=first)
        return adapter.compile(CompileInput(spec, MODEL))

    plan = compile_with(IMAGE)
    assert plan.native_request is not None
    assert plan.native_request["instances"][0]["image"] == {
        "assetUri": IMAGE.object_uri,
        "mimeType": "image/png",
        "checksumSha256": IMAGE.checksum_sha256,
    }
    resigned = compile_with(replace(IMAGE, object_uri=IMAGE.object_uri.replace("abc", "xyz")))
    assert resigned.native_request_json != plan.native_request_json
    assert resigned.request_hash == plan.request_hash
    other = compile_with(replace(IMAGE, checksum_sha256="c" * 64))
    assert other.request_hash != plan.request_hash


def test_unreadable_asset_scheme_is_reject() -> None:
    """A gs:// frame cannot be sent to the Gemini API (no gcsUri, no bucket credentials)."""
    adapter = VeoAdapter.from_config(sidecar_config("http://127.0.0.1:9", "KEY"))
    gcs = AssetRef("gs://bucket/f0.png", "image/png")
    spec = make_spec(mode=Mode.IMAGE_TO_VIDEO, duration_ms=8000, first_frame=gcs)
    plan = adapter.compile(CompileInput(spec, MODEL))
    assert not plan.submittable
    [reject] = [t for t in plan.transformations if t.kind is TransformationKind.REJECT]
    assert reject.field == "first_frame.object_uri"
    assert "gs://" in reject.detail


def test_reference_images_are_sent_as_asset_references() -> None:
    """Reference images (Veo 3.1, 8 s) map to referenceImages[].image references."""
    adapter = VeoAdapter.from_config(sidecar_config("http://127.0.0.1:9", "KEY"))
    spec = make_spec(duration_ms=8000, references=(IMAGE,))
    plan = adapter.compile(CompileInput(spec, MODEL))
    assert plan.native_request is not None
    assert plan.native_request["instances"][0]["referenceImages"] == [
        {
            "image": {
                "assetUri": IMAGE.object_uri,
                "checksumSha256": IMAGE.checksum_sha256,
                "mimeType": "image/png",
            },
            "referenceType": "asset",
        }
    ]


# -- submit --------------------------------------------------------------------------------------
async def test_image_to_video_submit_sends_inline_base64(
    adapter: VeoAdapter, stub: Stub, veo_emulator: VeoEmulator, asset_server: AssetServer
) -> None:
    """Submit fetches both frames (signed URL as given, no API key to the asset host) and the
    provider receives them as bytesBase64Encoded + mimeType; the rest is the plan's request."""
    first_url = asset_server.add("/frames/f0.png", Asset(PNG, signature="s1"))
    last_url = asset_server.add("/frames/f1.jpg", Asset(JPEG, "image/jpeg"))
    first = AssetRef(first_url, "image/png", checksum_sha256=_sha(PNG))
    last = AssetRef(last_url)  # no declared type, no checksum: the host's Content-Type is used
    plan = _plan(adapter, first, last)
    assert "bytesBase64Encoded" not in plan.native_request_json

    submitted = await _submit(stub, plan, "k-i2v")

    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_ACCEPTED, submitted
    [job] = veo_emulator.truth()
    assert job["id"] == submitted.job.provider_job_id
    instance = job["body"]["instances"][0]
    assert instance["image"] == _inline(PNG, "image/png")
    assert instance["lastFrame"] == _inline(JPEG, "image/jpeg")
    assert instance["prompt"] == make_spec().prompt
    sent = {r.path: r.query.get("sig") for r in asset_server.requests}
    assert sent == {"/frames/f0.png": "s1", "/frames/f1.jpg": None}
    assert all(r.header("x-goog-api-key") is None for r in asset_server.requests)


async def test_checksum_mismatch_is_rejected_asset_invalid_with_no_job(
    adapter: VeoAdapter, stub: Stub, veo_emulator: VeoEmulator, asset_server: AssetServer
) -> None:
    """Bytes whose SHA-256 differs from the spec's checksum: REJECTED ASSET_INVALID, and the
    provider saw no create request at all."""
    url = asset_server.add("/frames/f0.png", Asset(PNG))
    plan = _plan(adapter, AssetRef(url, "image/png", checksum_sha256="0" * 64))

    submitted = await _submit(stub, plan, "k-checksum")

    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_REJECTED
    assert submitted.error.error_class == error_pb2.ERROR_CLASS_ASSET_INVALID
    assert submitted.error.code == "ASSET_CHECKSUM_MISMATCH"
    assert not submitted.error.provider_may_have_accepted
    assert submitted.transport_stage == pb.TRANSPORT_STAGE_UNSPECIFIED
    assert veo_emulator.truth() == []
    assert _submits(veo_emulator) == 0


async def _closed_port_url() -> str:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return f"http://127.0.0.1:{port}/frames/f0.png"


@pytest.mark.parametrize("case", ["not_found", "expired_signature", "refused", "stalled"])
async def test_unreachable_asset_is_rejected_asset_unavailable_with_no_job(
    case: str, adapter: VeoAdapter, stub: Stub, veo_emulator: VeoEmulator, asset_server: AssetServer
) -> None:
    """404, an expired signature (403), a refused connection, or a host that never answers
    within the fetch deadline: REJECTED ASSET_UNAVAILABLE, nothing sent to the provider."""
    urls = {
        "not_found": lambda: asset_server.url("/frames/missing.png"),
        "expired_signature": lambda: asset_server.add("/f.png", Asset(PNG, signature="new")),
        "stalled": lambda: asset_server.add("/slow.png", Asset(PNG, stall=True)),
    }
    url = await _closed_port_url() if case == "refused" else urls[case]()
    if case == "expired_signature":
        url = url.replace("sig=new", "sig=old")
    plan = _plan(adapter, AssetRef(url, "image/png", checksum_sha256=_sha(PNG)))

    submitted = await _submit(stub, plan, f"k-{case}")

    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_REJECTED
    assert submitted.error.error_class == error_pb2.ERROR_CLASS_ASSET_UNAVAILABLE, submitted
    assert "sig=" not in submitted.error.message  # signatures stay out of errors and logs
    assert veo_emulator.truth() == []
    assert _submits(veo_emulator) == 0


@pytest.mark.parametrize(
    ("asset", "code"),
    [
        (Asset(b"<html>login</html>", "text/html"), "ASSET_NOT_IMAGE"),
        (Asset(PNG * (MAX_BYTES // len(PNG) + 1)), "ASSET_TOO_LARGE"),
    ],
)
async def test_unusable_asset_is_rejected_asset_invalid(  # noqa: PLR0917 - fixtures
    asset: Asset,
    code: str,
    adapter: VeoAdapter,
    stub: Stub,
    veo_emulator: VeoEmulator,
    asset_server: AssetServer,
) -> None:
    """A non-image Content-Type or an asset over the cap is ASSET_INVALID; no job."""
    plan = _plan(adapter, AssetRef(asset_server.add("/a", asset), "image/png"))
    submitted = await _submit(stub, plan, "k-unusable")
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_REJECTED
    assert (submitted.error.error_class, submitted.error.code) == (
        error_pb2.ERROR_CLASS_ASSET_INVALID,
        code,
    )
    assert _submits(veo_emulator) == 0


# -- recovery ------------------------------------------------------------------------------------
@pytest.mark.parametrize("checksum", [True, False], ids=["checksum", "no-checksum"])
async def test_dropped_image_submit_is_recovered_to_the_created_job(
    checksum: bool,
    adapter: VeoAdapter,
    stub: Stub,
    veo_emulator: VeoEmulator,
    asset_server: AssetServer,
) -> None:
    """drop_after_body on an image-to-video submit: UNKNOWN, one job holding the bytes, and
    recovery FINDS it from the plan's references (by checksum, or by re-fetching the asset)."""
    url = asset_server.add("/frames/f0.png", Asset(PNG))
    plan = _plan(adapter, AssetRef(url, "image/png", checksum_sha256=_sha(PNG) if checksum else ""))
    veo_emulator.add_faults({"route": SUBMIT_ROUTE, "action": "drop_after_body"})
    start = datetime.now(UTC)

    submitted = await _submit(stub, plan, "k-dropped")

    end = datetime.now(UTC)
    assert submitted.kind == pb.SUBMIT_OUTCOME_KIND_UNKNOWN
    [truth] = veo_emulator.truth()
    assert truth["body"]["instances"][0]["image"] == _inline(PNG, "image/png")
    assert await _recover(stub, plan, start, end) == (pb.RECOVERY_VERDICT_FOUND, truth["id"])


async def _foreign_job(emulator: VeoEmulator, plan: pb.CompilePlan, image: bytes) -> str:
    """Another client's operation: the plan's request exactly, but with other image bytes."""
    body: dict[str, Any] = json.loads(plan.native_request_json)
    body["instances"][0]["image"] = _inline(image, "image/png")
    async with httpx.AsyncClient(base_url=emulator.url) as client:
        reply = await client.post(
            f"/v1beta/models/{MODEL}:predictLongRunning",
            json=body,
            headers={"x-goog-api-key": "other"},
        )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["name"])


async def test_same_request_with_other_image_bytes_is_not_ours(
    adapter: VeoAdapter, stub: Stub, veo_emulator: VeoEmulator, asset_server: AssetServer
) -> None:
    """Our plan was never created, but an operation with the same prompt and parameters and a
    different image exists: with a checksum that is conclusively NOT_FOUND; a reference without
    a checksum whose asset is gone now can be neither matched nor ruled out (INCONCLUSIVE);
    one whose asset re-fetches to those bytes is FOUND."""
    url = asset_server.add("/frames/f0.png", Asset(PNG))
    start = datetime.now(UTC) - timedelta(seconds=1)
    checksummed = _plan(adapter, AssetRef(url, "image/png", checksum_sha256=_sha(PNG)))
    other = await _foreign_job(veo_emulator, checksummed, JPEG)
    # A window that ended 2 s ago has settled (submit_read 1 s + settle 0 s): NOT_FOUND may be
    # said; the listing still covers the operation (it looks a minute past the window).
    settled = datetime.now(UTC) - timedelta(seconds=2)
    assert await _recover(stub, checksummed, start - timedelta(seconds=2), settled) == (
        pb.RECOVERY_VERDICT_NOT_FOUND,
        "",
    )

    gone = _plan(adapter, AssetRef(asset_server.url("/frames/gone.png"), "image/png"))
    verdict, _ = await _recover(stub, gone, start - timedelta(seconds=2), settled)
    assert verdict == pb.RECOVERY_VERDICT_INCONCLUSIVE

    asset_server.add("/frames/same.png", Asset(JPEG))
    refetched = _plan(adapter, AssetRef(asset_server.url("/frames/same.png"), "image/png"))
    assert await _recover(stub, refetched, start, datetime.now(UTC)) == (
        pb.RECOVERY_VERDICT_FOUND,
        other,
    )

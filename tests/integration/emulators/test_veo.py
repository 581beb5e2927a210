"""Veo emulator: Gemini and Vertex surfaces, google.rpc errors, quotas, files, webhooks."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adapter_sidecars.emulators.callbacks import SIGNATURE_HEADER, verify_signature
from adapter_sidecars.emulators.veo import VeoConfig, VeoEmulator

from .conftest import Receiver, client, eventually

MODEL = "veo-3.1-generate-preview"
SUBMIT = f"/v1beta/models/{MODEL}:predictLongRunning"
BODY: dict[str, Any] = {
    "instances": [{"prompt": "A lighthouse at dusk"}],
    "parameters": {"aspectRatio": "16:9", "durationSeconds": 8},
}
KEY = {"x-goog-api-key": "AIza-test"}


@pytest.fixture
def veo_config() -> VeoConfig:
    return VeoConfig(api_key="AIza-test")


@pytest.fixture
async def veo(veo_config: VeoConfig) -> AsyncIterator[VeoEmulator]:
    async with VeoEmulator(veo_config) as emu:
        yield emu


@pytest.fixture
async def gv(veo: VeoEmulator) -> AsyncIterator[httpx.AsyncClient]:
    async with client(veo.url, headers=KEY) as c:
        yield c


async def _run_to_done(gv: httpx.AsyncClient, body: dict[str, Any] | None = None) -> dict[str, Any]:
    name = (await gv.post(SUBMIT, json=body or BODY)).json()["name"]
    ops = [(await gv.get(f"/v1beta/{name}")).json() for _ in range(4)]
    assert [op["done"] for op in ops] == [False, False, False, True]
    done: dict[str, Any] = ops[-1]
    return done


async def test_api_key_is_required_and_checked(gv: httpx.AsyncClient) -> None:
    """No key is 403 PERMISSION_DENIED; a wrong key is 400 with ErrorInfo API_KEY_INVALID."""
    missing = await gv.post(SUBMIT, json=BODY, headers={"x-goog-api-key": ""})
    wrong = await gv.post(SUBMIT, json=BODY, headers={"x-goog-api-key": "nope"})
    assert missing.status_code == 403
    assert missing.json()["error"]["status"] == "PERMISSION_DENIED"
    assert wrong.status_code == 400
    assert wrong.json()["error"]["details"][0]["reason"] == "API_KEY_INVALID"


def _on_emulator(uri: str) -> str:
    """The emulator-relative path of a Google file URI: a client downloads a file through its
    own base URL (google-genai keeps only the id), so the https host is Google's, not ours."""
    parts = httpx.URL(uri)
    return parts.raw_path.decode()


async def test_operation_succeeds_and_file_redirects_to_mp4(gv: httpx.AsyncClient) -> None:
    """Submit returns an op name, polls finish with a Google-shaped https file URI whose
    download path 302s to an MP4."""
    op = await _run_to_done(gv)
    assert op["name"].startswith(f"models/{MODEL}/operations/")
    [sample] = op["response"]["generateVideoResponse"]["generatedSamples"]
    uri = sample["video"]["uri"]
    assert uri.startswith("https://generativelanguage.googleapis.com/v1beta/files/"), uri
    redirect = await gv.get(_on_emulator(uri))
    assert redirect.status_code == 302
    media = await gv.get(redirect.headers["location"])
    assert media.status_code == 200
    assert media.content[4:8] == b"ftyp"


async def test_rai_filtered_has_no_samples(veo: VeoEmulator, gv: httpx.AsyncClient) -> None:
    """A RAI-filtered operation is done without error or samples, only filter count/reasons."""
    veo.add_faults(
        {"route": f"POST {SUBMIT}", "action": "fail_job", "code": "RAI", "message": "policy"}
    )
    op = await _run_to_done(gv)
    response = op["response"]["generateVideoResponse"]
    assert "error" not in op
    assert "generatedSamples" not in response
    assert response["raiMediaFilteredCount"] == 1
    assert response["raiMediaFilteredReasons"] == ["policy"]


async def test_operation_error_uses_numeric_canonical_code(
    veo: VeoEmulator, gv: httpx.AsyncClient
) -> None:
    """fail_job with code 13 ends the operation with error.code 13."""
    veo.add_faults({"route": f"POST {SUBMIT}", "action": "fail_job", "code": "13"})
    op = await _run_to_done(gv)
    assert op["error"]["code"] == 13
    assert "response" not in op


@pytest.mark.parametrize("veo_config", [VeoConfig(rpm_limit=1)])
async def test_per_minute_quota_429(gv: httpx.AsyncClient) -> None:
    """Over the per-minute limit, the 429 names a PerMinute quota and a retryDelay."""
    assert (await gv.post(SUBMIT, json=BODY)).status_code == 200
    response = await gv.post(SUBMIT, json=BODY)
    assert response.status_code == 429
    error = response.json()["error"]
    details = {d["@type"].rsplit(".", 1)[1]: d for d in error["details"]}
    assert error["status"] == "RESOURCE_EXHAUSTED"
    assert "PerMinute" in details["ErrorInfo"]["metadata"]["quota_limit"]
    assert details["RetryInfo"]["retryDelay"].endswith("s")


@pytest.mark.parametrize("veo_config", [VeoConfig(rpd_limit=1)])
async def test_daily_quota_429_is_distinguishable(gv: httpx.AsyncClient) -> None:
    """Over the daily limit, the 429 names a PerDay quota with a long retryDelay."""
    await gv.post(SUBMIT, json=BODY)
    error = (await gv.post(SUBMIT, json=BODY)).json()["error"]
    info = next(d for d in error["details"] if d["@type"].endswith("ErrorInfo"))
    retry = next(d for d in error["details"] if d["@type"].endswith("RetryInfo"))
    assert info["metadata"]["quota_limit"].startswith("GenerateRequestsPerDay")
    assert int(retry["retryDelay"][:-1]) > 3600


async def test_status_fault_429_can_be_daily(veo: VeoEmulator, gv: httpx.AsyncClient) -> None:
    """An injected 429 uses the google.rpc envelope and honours quota=day."""
    veo.add_faults(
        {"route": "POST /v1beta/models/*", "action": "status", "code": 429, "quota": "day"}
    )
    response = await gv.post(SUBMIT, json=BODY)
    assert response.status_code == 429
    assert "_per_day" in json.dumps(response.json())
    assert veo.truth() == []


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        (
            {"prompt": "p", "image": {"inlineData": {"data": "x", "mimeType": "image/png"}}},
            "inlineData",
        ),
        ({"prompt": "p", "image": {"gcsUri": "gs://b/i.png", "mimeType": "image/png"}}, "gcsUri"),
    ],
)
async def test_gemini_rejects_inline_data_and_gcs_uri(
    gv: httpx.AsyncClient, instance: dict[str, Any], message: str
) -> None:
    """Gemini mode rejects image.inlineData and image.gcsUri with 400 INVALID_ARGUMENT."""
    response = await gv.post(SUBMIT, json={"instances": [instance]})
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


PNG_B64 = base64.b64encode(b"\x89PNG\r\n\x1a\n fake").decode()
INLINE = {"bytesBase64Encoded": PNG_B64, "mimeType": "image/png"}
BY_URI = {"uri": "https://assets.example.com/f0.png", "mimeType": "image/png"}


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ({"prompt": "p", "image": BY_URI}, "`uri` isn't supported for instances[0].image"),
        ({"prompt": "p", "image": INLINE, "lastFrame": BY_URI}, "instances[0].lastFrame"),
        (
            {"prompt": "p", "referenceImages": [{"image": BY_URI, "referenceType": "asset"}]},
            "instances[0].referenceImages[0].image",
        ),
        ({"prompt": "p", "image": {"bytesBase64Encoded": PNG_B64}}, "mimeType is required"),
        ({"prompt": "p", "image": {**INLINE, "mimeType": "video/mp4"}}, "mimeType"),
        ({"prompt": "p", "image": {**INLINE, "bytesBase64Encoded": "@@@"}}, "not valid base64"),
        ({"prompt": "p", "image": {**INLINE, "sha256": "x"}}, 'Unknown name "instances[0]'),
    ],
)
async def test_gemini_images_must_be_inline_bytes(
    veo: VeoEmulator, gv: httpx.AsyncClient, instance: dict[str, Any], message: str
) -> None:
    """A Gemini image, last frame or reference image given by uri (or without a usable
    bytesBase64Encoded + image mimeType) is 400 INVALID_ARGUMENT and creates no operation."""
    response = await gv.post(SUBMIT, json={**BODY, "instances": [instance]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert message in error["message"]
    assert veo.truth() == []


async def test_gemini_accepts_inline_images_and_video_uri(
    veo: VeoEmulator, gv: httpx.AsyncClient
) -> None:
    """Inline images (frame, last frame, references) are accepted, and so is video.uri (the
    files URI of an earlier Veo output, for extension); the request is recorded as sent."""
    instance = {
        "prompt": "p",
        "image": INLINE,
        "lastFrame": INLINE,
        "referenceImages": [{"image": INLINE, "referenceType": "asset"}],
    }
    extend = {"prompt": "p", "video": {"uri": f"{veo.url}/v1beta/files/abc:download?alt=media"}}
    for inst in (instance, extend):
        response = await gv.post(SUBMIT, json={**BODY, "instances": [inst]})
        assert response.status_code == 200, response.text
    assert [job["body"]["instances"][0] for job in veo.truth()] == [instance, extend]


async def test_vertex_still_takes_gcs_uri_images(veo: VeoEmulator) -> None:
    """The Vertex surface accepts image.gcsUri (the Gemini-only rule does not leak into it)."""
    base = f"/v1/projects/p1/locations/us-central1/publishers/google/models/{MODEL}"
    body = {**BODY, "instances": [{"prompt": "p", "image": {"gcsUri": "gs://b/i.png"}}]}
    async with client(veo.url, headers={"Authorization": "Bearer t"}) as c:
        response = await c.post(base + ":predictLongRunning", json=body)
    assert response.status_code == 200, response.text


async def test_model_matrix_and_duration_forms(gv: httpx.AsyncClient) -> None:
    """durationSeconds accepts "6" and 6, rejects 5; 1080p needs 8 s; unknown models are 404."""
    for duration in ("6", 6):
        body = {**BODY, "parameters": {"durationSeconds": duration}}
        assert (await gv.post(SUBMIT, json=body)).status_code == 200
    bad = await gv.post(SUBMIT, json={**BODY, "parameters": {"durationSeconds": 5}})
    assert bad.status_code == 400
    hd = await gv.post(
        SUBMIT, json={**BODY, "parameters": {"durationSeconds": 4, "resolution": "1080p"}}
    )
    assert hd.status_code == 400
    unknown = await gv.post("/v1beta/models/veo-9:predictLongRunning", json=BODY)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["status"] == "NOT_FOUND"
    extra = await gv.post(SUBMIT, json={**BODY, "parameters": {"generateAudio": True}})
    assert extra.status_code == 400


async def test_expired_file_is_gone(veo: VeoEmulator, gv: httpx.AsyncClient) -> None:
    """expire_output makes the generated file already past retention (404)."""
    veo.add_faults({"route": "GET /v1beta/models/*/operations/*", "action": "expire_output"})
    op = await _run_to_done(gv)
    uri = op["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    assert (await gv.get(_on_emulator(uri))).status_code == 404


@pytest.mark.parametrize(
    "veo_config",
    [VeoConfig(api_key="AIza-test", extensions=frozenset({"operation_list", "billing_export"}))],
)
async def test_operation_list_and_billing_extensions(
    veo: VeoEmulator, gv: httpx.AsyncClient
) -> None:
    """With both extensions named, ops list by createTime and billing rows show succeeded ops
    and injected charges."""
    op = await _run_to_done(gv)
    listed = (
        await gv.get(
            f"/v1beta/models/{MODEL}/operations",
            params={"filter": 'createTime>="2000-01-01T00:00:00Z" AND done=true'},
        )
    ).json()
    assert [(o["name"], o["metadata"]["request"]) for o in listed["operations"]] == [
        (op["name"], BODY)
    ]
    veo.add_usage({"model": MODEL, "seconds": 8, "ref": None})
    rows = (await gv.get("/v1beta/__billing/usage", params={"start": "2000-01-01"})).json()["rows"]
    assert [(r["operation"], r["billedSeconds"]) for r in rows] == [(op["name"], 8.0), (None, 8.0)]
    assert rows[0]["usd"] == pytest.approx(3.2)


async def test_extensions_are_off_by_default_like_the_real_api(gv: httpx.AsyncClient) -> None:
    """By default the operations listing and the billing export are 404 NOT_FOUND in Google's
    envelope, as on the real Gemini API."""
    await _run_to_done(gv)
    for path in (f"/v1beta/models/{MODEL}/operations", "/v1beta/__billing/usage"):
        response = await gv.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["status"] == "NOT_FOUND"


@pytest.mark.parametrize(
    "webhook",
    [
        {"webhookConfig": {"uris": ["URL"], "userMetadata": {"attempt_id": "a1"}}},
        {"webhook_config": {"uris": ["URL"], "user_metadata": {"attempt_id": "a1"}}},
        {"webhookConfig": {"uris": ["URL"], "user_metadata": {"attempt_id": "a1"}}},
    ],
)
async def test_webhook_config_is_read_in_snake_and_camel_case(
    receiver: Receiver, webhook: dict[str, Any]
) -> None:
    """webhookConfig in camelCase, snake_case or mixed (google-genai's form) delivers the same
    webhooks with userMetadata kept verbatim (its own keys are data, never renamed)."""
    config = VeoConfig(advance="time", queue_s=0.02, run_s=0.1)
    [(key, value)] = webhook.items()
    hook = {k: ([receiver.url] if k == "uris" else v) for k, v in value.items()}
    async with VeoEmulator(config) as emu, client(emu.url, headers=KEY) as gv:
        response = await gv.post(SUBMIT, json={**BODY, key: hook})
        assert response.status_code == 200, response.text
        await eventually(lambda: len(receiver.requests) >= 2)
    payloads = [json.loads(r.body) for r in receiver.requests]
    assert all(p["userMetadata"] == {"attempt_id": "a1"} for p in payloads)


async def test_snake_case_parameters_are_accepted(veo: VeoEmulator, gv: httpx.AsyncClient) -> None:
    """parameters and image fields in snake_case are read like their camelCase names."""
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n fake").decode()
    body = {
        "instances": [
            {"prompt": "p", "image": {"bytes_base64_encoded": png, "mime_type": "image/png"}}
        ],
        "parameters": {"aspect_ratio": "9:16", "duration_seconds": 6},
    }
    response = await gv.post(SUBMIT, json=body)
    assert response.status_code == 200, response.text
    [job] = veo.truth()
    assert job["body"] == body


async def test_signed_webhooks_arrive_for_each_state(receiver: Receiver) -> None:
    """webhookConfig.uris receive HMAC-signed operation JSON on each state change."""
    config = VeoConfig(advance="time", queue_s=0.02, run_s=0.1, callback_secret="s3cret")
    body = {**BODY, "webhookConfig": {"uris": [receiver.url], "userMetadata": {"attempt": "a1"}}}
    async with VeoEmulator(config) as emu, client(emu.url, headers=KEY) as gv:
        name = (await gv.post(SUBMIT, json=body)).json()["name"]
        await eventually(lambda: len(receiver.requests) >= 2)
    payloads = [json.loads(r.body) for r in receiver.requests]
    assert [p["done"] for p in payloads] == [False, True]
    assert all(p["name"] == name and p["userMetadata"] == {"attempt": "a1"} for p in payloads)
    for r in receiver.requests:
        assert verify_signature("s3cret", r.header(SIGNATURE_HEADER) or "", r.body)


async def test_vertex_surface_round_trip(veo: VeoEmulator) -> None:
    """Vertex predictLongRunning + fetchPredictOperation return gcsUri or inline bytes videos."""
    base = f"/v1/projects/p1/locations/us-central1/publishers/google/models/{MODEL}"
    async with client(veo.url) as c:
        denied = await c.post(base + ":predictLongRunning", json=BODY)
        assert denied.status_code == 401
        auth = {"Authorization": "Bearer ya29.token"}
        gcs_body = {**BODY, "parameters": {"durationSeconds": 4, "storageUri": "gs://bucket/out"}}
        results = []
        for body in (gcs_body, BODY):
            name = (await c.post(base + ":predictLongRunning", json=body, headers=auth)).json()[
                "name"
            ]
            for _ in range(4):
                op = (
                    await c.post(
                        base + ":fetchPredictOperation", json={"operationName": name}, headers=auth
                    )
                ).json()
            results.append(op)
    gcs, inline = (op["response"]["videos"][0] for op in results)
    assert gcs["gcsUri"].startswith("gs://bucket/out/")
    assert gcs["mimeType"] == "video/mp4"
    assert base64.b64decode(inline["bytesBase64Encoded"])[4:8] == b"ftyp"

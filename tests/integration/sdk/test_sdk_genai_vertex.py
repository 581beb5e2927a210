"""The Veo emulator's Vertex AI surface driven by google-genai 3.x (Vertex mode), as a real
client would: generate_videos, then operations.get (which the SDK sends as
``:fetchPredictOperation``), with a static OAuth token and only the base URL pointed at the
emulator. Also: 3.x refuses Veo in Gemini mode before any request (provider-apis.md §5).

With google-auth's own service-account credentials the SDK gets its token from the emulator's
OAuth 2 token endpoint (the key's ``token_uri``), which verifies the signed assertion against
the service account's public key, and the gs:// output downloads through the emulator's Cloud
Storage JSON API route with the same credentials (google-auth's ``AuthorizedSession``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from google import genai
from google.auth import exceptions as auth_exceptions
from google.auth.transport.requests import AuthorizedSession
from google.genai import errors, types
from google.oauth2 import service_account
from google.oauth2.credentials import Credentials

from adapter_sidecars.emulators import EmulatorThread, VeoConfig, VeoEmulator
from tests.support.service_account import ServiceAccount, new_service_account

from .conftest import GEMINI_KEY, VERTEX_TOKEN

pytestmark = pytest.mark.timeout(60)

MODEL = "veo-3.1-generate-001"
LOCATION = "us-central1"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@pytest.fixture
def sa_emulator() -> Iterator[tuple[EmulatorThread, ServiceAccount]]:
    """A Veo emulator that knows one service account's public key (and no static token)."""
    account = new_service_account("sdk")
    config = VeoConfig(service_accounts={account.email: account.public_pem})
    with EmulatorThread(VeoEmulator(config)) as runner:
        yield runner, account


def _sa_credentials(key: dict[str, Any]) -> service_account.Credentials:
    credentials: service_account.Credentials = (
        service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]  # google-auth is unannotated
            key, scopes=[SCOPE]
        )
    )
    return credentials


def _sa_client(emulator: EmulatorThread, credentials: service_account.Credentials) -> genai.Client:
    options = types.HttpOptions(
        base_url=emulator.url, retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(
        vertexai=True,
        project="vidroute-test",
        location=LOCATION,
        credentials=credentials,
        http_options=options,
    )


def _client(emulator: EmulatorThread, token: str = VERTEX_TOKEN) -> genai.Client:
    """A Vertex-mode client with a fixed token; one attempt per call (no SDK retries)."""
    options = types.HttpOptions(
        base_url=emulator.url, retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(
        vertexai=True,
        project="vidroute-test",
        location=LOCATION,
        credentials=Credentials(token=token),  # type: ignore[no-untyped-call]  # google-auth leaves __init__ unannotated
        http_options=options,
    )


def _poll(client: genai.Client, operation: Any) -> tuple[Any, int]:
    for polls in range(1, 11):
        operation = client.operations.get(operation)
        if operation.done:
            return operation, polls
    raise AssertionError(f"operation {operation.name} not done after 10 polls")


def test_generate_to_gcs_and_poll(veo_emulator: EmulatorThread) -> None:
    """generate_videos with output_gcs_uri, seed and generate_audio creates one operation whose
    fetchPredictOperation polls end with a gs:// video under the storage URI."""
    client = _client(veo_emulator)
    config = types.GenerateVideosConfig(
        duration_seconds=8,
        aspect_ratio="9:16",
        output_gcs_uri="gs://vidroute-out/run1",
        seed=42,
        generate_audio=True,
    )
    operation = client.models.generate_videos(
        model=MODEL, source=types.GenerateVideosSource(prompt="a lighthouse"), config=config
    )
    prefix = f"projects/vidroute-test/locations/{LOCATION}/publishers/google/models/{MODEL}"
    assert operation.name is not None
    assert operation.name.startswith(f"{prefix}/operations/")
    done, polls = _poll(client, operation)
    assert polls == 4
    assert done.error is None
    [video] = done.response.generated_videos
    op_id = operation.name.rsplit("/", 1)[1]
    assert video.video.uri == f"gs://vidroute-out/run1/{op_id}/sample_0.mp4"
    [job] = veo_emulator.truth()
    assert job["route"].endswith(f"/models/{MODEL}:predictLongRunning")
    assert job["body"]["parameters"]["seed"] == 42
    assert job["body"]["parameters"]["storageUri"] == "gs://vidroute-out/run1"


def test_inline_bytes_without_storage(veo_emulator: EmulatorThread) -> None:
    """Without output_gcs_uri the finished operation carries the MP4 as inline bytes, which the
    SDK decodes into video_bytes."""
    client = _client(veo_emulator)
    operation = client.models.generate_videos(
        model=MODEL, source=types.GenerateVideosSource(prompt="a harbour")
    )
    done, _ = _poll(client, operation)
    [video] = done.response.generated_videos
    assert video.video.video_bytes is not None
    assert video.video.video_bytes[4:8] == b"ftyp"


def test_errors_reach_the_sdk_as_its_exceptions(veo_emulator: EmulatorThread) -> None:
    """A wrong token is ClientError 401 UNAUTHENTICATED, an unknown model ClientError 404, an
    injected 503 ServerError 503; none creates an operation."""
    wrong, client = _client(veo_emulator, token="ya29.wrong"), _client(veo_emulator)
    with pytest.raises(errors.ClientError) as unauthenticated:
        wrong.models.generate_videos(model=MODEL, source=types.GenerateVideosSource(prompt="p"))
    assert (unauthenticated.value.code, unauthenticated.value.status) == (401, "UNAUTHENTICATED")
    with pytest.raises(errors.ClientError) as unknown:
        client.models.generate_videos(model="veo-9", source=types.GenerateVideosSource(prompt="p"))
    assert unknown.value.code == 404
    veo_emulator.add_faults(
        {"route": "POST */models/*:predictLongRunning", "action": "status", "code": 503}
    )
    with pytest.raises(errors.ServerError) as unavailable:
        client.models.generate_videos(model=MODEL, source=types.GenerateVideosSource(prompt="p"))
    assert (unavailable.value.code, unavailable.value.status) == (503, "UNAVAILABLE")
    assert veo_emulator.truth() == []


def test_gemini_mode_refuses_veo_before_any_request(veo_emulator: EmulatorThread) -> None:
    """google-genai 3.x raises ValueError for generate_videos in Gemini mode and sends nothing:
    the Gemini surface can only be driven with 2.34.x (test_sdk_genai_gemini.py)."""
    options = types.HttpOptions(base_url=veo_emulator.url)
    client = genai.Client(api_key=GEMINI_KEY, http_options=options)
    with pytest.raises(ValueError, match="Gemini Developer API"):
        client.models.generate_videos(
            model="veo-3.1-generate-preview", source=types.GenerateVideosSource(prompt="p")
        )
    stats = veo_emulator.call(lambda: dict(veo_emulator.emulator.counters))
    assert stats == {}


def test_service_account_token_and_gcs_download(
    sa_emulator: tuple[EmulatorThread, ServiceAccount],
) -> None:
    """The SDK's service-account credentials get a token at the key's token_uri (the emulator
    verifies the RS256 assertion), generate to gs:// and poll; the object then downloads
    through the Cloud Storage JSON API (``alt=media``) with the same credentials."""
    emulator, account = sa_emulator
    credentials = _sa_credentials(account.key_json(f"{emulator.url}/token"))
    client = _sa_client(emulator, credentials)
    config = types.GenerateVideosConfig(output_gcs_uri="gs://vidroute-out/sdk")
    operation = client.models.generate_videos(
        model=MODEL, source=types.GenerateVideosSource(prompt="a harbour"), config=config
    )
    done, _ = _poll(client, operation)
    [video] = done.response.generated_videos
    bucket, _, name = video.video.uri.removeprefix("gs://").partition("/")
    assert bucket == "vidroute-out"
    assert credentials.token is not None
    assert credentials.token.startswith("ya29.emu-")
    with AuthorizedSession(credentials) as session:  # type: ignore[no-untyped-call]  # unannotated
        media = session.get(
            f"{emulator.url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}",
            params={"alt": "media"},
            timeout=30,
        )
        missing = session.get(
            f"{emulator.url}/storage/v1/b/{bucket}/o/{quote(name + '.x', safe='')}",
            params={"alt": "media"},
            timeout=30,
        )
    assert media.status_code == 200
    assert media.headers["content-type"] == "video/mp4"
    assert media.content[4:8] == b"ftyp"
    assert missing.status_code == 404
    assert missing.json()["error"]["errors"][0]["reason"] == "notFound"


def test_unknown_or_forged_service_accounts_get_no_token(
    sa_emulator: tuple[EmulatorThread, ServiceAccount],
) -> None:
    """A key the emulator does not know, and a known account's email signed with another key,
    are refused at the token endpoint (google-auth's RefreshError, invalid_grant): no request
    reaches Vertex and no operation exists."""
    emulator, account = sa_emulator
    token_uri = f"{emulator.url}/token"
    stranger = new_service_account("stranger")
    forged = {**stranger.key_json(token_uri), "client_email": account.email}
    for key, why in ((stranger.key_json(token_uri), "not found"), (forged, "Signature")):
        client = _sa_client(emulator, _sa_credentials(key))
        with pytest.raises(auth_exceptions.RefreshError, match=why):
            client.models.generate_videos(
                model=MODEL, source=types.GenerateVideosSource(prompt="p")
            )
    assert emulator.truth() == []

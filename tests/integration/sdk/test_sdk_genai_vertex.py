"""The Veo emulator's Vertex AI surface driven by google-genai 3.x (Vertex mode), as a real
client would: generate_videos, then operations.get (which the SDK sends as
``:fetchPredictOperation``), with a static OAuth token and only the base URL pointed at the
emulator. Also: 3.x refuses Veo in Gemini mode before any request (provider-apis.md §5).
"""

from __future__ import annotations

from typing import Any

import pytest
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials

from adapter_sidecars.emulators import EmulatorThread

from .conftest import GEMINI_KEY, VERTEX_TOKEN

pytestmark = pytest.mark.timeout(60)

MODEL = "veo-3.1-generate-001"
LOCATION = "us-central1"


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

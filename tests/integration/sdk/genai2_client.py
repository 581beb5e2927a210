"""A Gemini-API client written with google-genai 2.34.x, run in a subprocess by the SDK tests.

google-genai 2.34 is the last SDK that drives Veo on the Gemini Developer API, and it cannot
share .venv with the 3.x pinned there, so `test_sdk_genai_gemini.py` runs this file with
``PYTHONPATH=.venv/sdk-genai2``. It imports nothing of ours: it is only what a customer's code
does. Usage: ``python genai2_client.py SCENARIO BASE_URL API_KEY [WEBHOOK_URL]``; it prints
one JSON object with what the SDK returned (or raised) on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from google import genai
from google.genai import errors, types

MODEL = "veo-3.1-generate-preview"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def _client(base_url: str, key: str) -> genai.Client:
    # One attempt: the tests count requests, so the SDK must not retry behind their back.
    options = types.HttpOptions(base_url=base_url, retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=key, http_options=options)


def _poll(client: genai.Client, operation: Any) -> tuple[Any, int]:
    for polls in range(1, 11):
        operation = client.operations.get(operation)
        if operation.done:
            return operation, polls
    raise SystemExit(f"operation {operation.name} not done after 10 polls")


def text_to_video(client: genai.Client, webhook: str) -> dict[str, Any]:
    """generate_videos -> operations.get until done -> files.download of the sample."""
    config = types.GenerateVideosConfig(
        duration_seconds=8,
        aspect_ratio="16:9",
        negative_prompt="blur",
        webhook_config=types.WebhookConfig(uris=[webhook], user_metadata={"attempt_id": "a1"}),
    )
    operation = client.models.generate_videos(
        model=MODEL, source=types.GenerateVideosSource(prompt="a lighthouse"), config=config
    )
    name = operation.name
    operation, polls = _poll(client, operation)
    [sample] = operation.response.generated_videos
    data = client.files.download(file=sample)
    return {
        "name": name,
        "done_name": operation.name,
        "polls": polls,
        "uri": sample.video.uri,
        "size": len(data),
        "magic": data[4:8].decode("latin-1"),
        "video_bytes_kept": sample.video.video_bytes == data,
    }


def image_to_video(client: genai.Client, webhook: str) -> dict[str, Any]:
    """generate_videos with an image given as bytes, then polled to done."""
    operation = client.models.generate_videos(
        model=MODEL,
        source=types.GenerateVideosSource(
            prompt="the frame comes alive",
            image=types.Image(image_bytes=PNG, mime_type="image/png"),
        ),
        config=types.GenerateVideosConfig(duration_seconds=8),
    )
    operation, polls = _poll(client, operation)
    return {
        "name": operation.name,
        "polls": polls,
        "samples": len(operation.response.generated_videos),
    }


def errors_seen(client: genai.Client, webhook: str) -> dict[str, Any]:
    """What the SDK raises: a submit the emulator refuses (the test injects the status) and an
    unknown operation."""
    seen: dict[str, Any] = {}
    try:
        client.models.generate_videos(model=MODEL, source=types.GenerateVideosSource(prompt="p"))
    except errors.APIError as exc:
        seen["submit"] = {"type": type(exc).__name__, "code": exc.code, "status": exc.status}
    try:
        # google-genai 2.x (this script's SDK) takes `name`; .venv's 3.x types do not.
        nope = f"models/{MODEL}/operations/nope"
        client.operations.get(types.GenerateVideosOperation(name=nope))  # type: ignore[call-arg]  # genai 2.x takes name; .venv's 3.x stubs do not
    except errors.APIError as exc:
        seen["poll"] = {"type": type(exc).__name__, "code": exc.code, "status": exc.status}
    return seen


SCENARIOS = {
    "text_to_video": text_to_video,
    "image_to_video": image_to_video,
    "errors": errors_seen,
}


def main(argv: list[str]) -> int:
    scenario, base_url, key = argv[:3]
    webhook = argv[3] if len(argv) > 3 else "http://127.0.0.1:9/hook"
    result = SCENARIOS[scenario](_client(base_url, key), webhook)
    result["sdk_version"] = genai.__version__
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

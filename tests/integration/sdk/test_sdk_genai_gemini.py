"""The Veo emulator's Gemini API surface driven by google-genai 2.34.x, as a real client would.

The client code is `genai2_client.py`, run in a subprocess on the 2.34 install (`genai2_path`),
with only the SDK's base URL pointed at the emulator. What the SDK returned comes back as JSON;
the emulator's truth says what it received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from adapter_sidecars.emulators import EmulatorThread

from .conftest import GEMINI_KEY

pytestmark = pytest.mark.timeout(120)

CLIENT = Path(__file__).with_name("genai2_client.py")
MODEL = "veo-3.1-generate-preview"


def _run(genai2: Path, scenario: str, url: str, key: str = GEMINI_KEY) -> dict[str, Any]:
    """Run one scenario of the 2.34 client and return its JSON result."""
    env = {**os.environ, "PYTHONPATH": str(genai2), "PYTHONWARNINGS": "error::DeprecationWarning"}
    done = subprocess.run(
        [sys.executable, str(CLIENT), scenario, url, key],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sdk_version"].startswith("2.34."), result
    return result


def _deliveries(emulator: EmulatorThread, count: int) -> list[dict[str, Any]]:
    """The emulator's webhook delivery attempts, once there are `count` (10 s deadline)."""
    deadline = time.monotonic() + 10
    while True:
        seen = emulator.call(lambda: [d.to_json() for d in emulator.emulator.callbacks.deliveries])
        if len(seen) >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def test_generate_poll_and_download(genai2_path: Path, veo_emulator: EmulatorThread) -> None:
    """generate_videos creates one operation, operations.get polls it to done, and
    files.download extracts the id from the https file URI and gets the MP4 through the SDK's
    own base URL; the webhook config the SDK sends in snake_case is honoured."""
    result = _run(genai2_path, "text_to_video", veo_emulator.url)
    assert result["name"].startswith(f"models/{MODEL}/operations/")
    assert result["done_name"] == result["name"]
    assert result["polls"] == 4
    assert result["uri"].startswith("https://generativelanguage.googleapis.com/v1beta/files/")
    assert (result["magic"], result["video_bytes_kept"]) == ("ftyp", True)
    [job] = veo_emulator.truth()
    assert job["body"]["webhookConfig"]["user_metadata"] == {"attempt_id": "a1"}
    assert job["body"]["parameters"] == {
        "durationSeconds": 8,
        "aspectRatio": "16:9",
        "negativePrompt": "blur",
    }
    payloads = [d["payload"] for d in _deliveries(veo_emulator, 2)]
    assert payloads
    assert all(p["userMetadata"] == {"attempt_id": "a1"} for p in payloads)


def test_image_bytes_are_accepted(genai2_path: Path, veo_emulator: EmulatorThread) -> None:
    """An image given to the SDK as bytes reaches the emulator in the inline form the Gemini API
    requires (bytesBase64Encoded + mimeType) and the operation succeeds."""
    result = _run(genai2_path, "image_to_video", veo_emulator.url)
    assert result["samples"] == 1
    [job] = veo_emulator.truth()
    image = job["body"]["instances"][0]["image"]
    assert set(image) == {"bytesBase64Encoded", "mimeType"}
    assert image["mimeType"] == "image/png"


def test_errors_reach_the_sdk_as_its_exceptions(
    genai2_path: Path, veo_emulator: EmulatorThread
) -> None:
    """A 429 on submit is the SDK's ClientError 429 RESOURCE_EXHAUSTED (no operation created)
    and an unknown operation is ClientError 404 NOT_FOUND."""
    veo_emulator.add_faults(
        {
            "route": f"POST /v1beta/models/{MODEL}:predictLongRunning",
            "action": "status",
            "code": 429,
        }
    )
    seen = _run(genai2_path, "errors", veo_emulator.url)
    assert seen["submit"] == {"type": "ClientError", "code": 429, "status": "RESOURCE_EXHAUSTED"}
    assert seen["poll"] == {"type": "ClientError", "code": 404, "status": "NOT_FOUND"}
    assert veo_emulator.truth() == []


def test_wrong_key_is_a_client_error(genai2_path: Path, veo_emulator: EmulatorThread) -> None:
    """With a wrong API key the SDK raises ClientError 400 INVALID_ARGUMENT (API_KEY_INVALID),
    as Google answers."""
    seen = _run(genai2_path, "errors", veo_emulator.url, key="AIza-wrong")
    assert seen["submit"] == {"type": "ClientError", "code": 400, "status": "INVALID_ARGUMENT"}

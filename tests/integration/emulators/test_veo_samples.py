"""Veo emulator: sampleCount > 1 yields that many samples, each a different video (as Veo
renders each sample with its own seed), on the Gemini files surface and Vertex inline bytes."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adapter_sidecars.emulators.veo import VeoConfig, VeoEmulator

from .conftest import client

MODEL = "veo-2.0-generate-001"  # the model whose sampleCount may be 2
BODY: dict[str, Any] = {
    "instances": [{"prompt": "A lighthouse at dusk"}],
    "parameters": {"aspectRatio": "16:9", "durationSeconds": 5, "sampleCount": 2},
}


@pytest.fixture
async def veo() -> AsyncIterator[VeoEmulator]:
    async with VeoEmulator(VeoConfig(api_key="AIza-test")) as emu:
        yield emu


async def _done(c: httpx.AsyncClient, submit: str, poll: Any) -> dict[str, Any]:
    response = await c.post(submit, json=BODY)
    assert response.status_code == 200, response.text
    name = response.json()["name"]
    for _ in range(10):
        op: dict[str, Any] = await poll(name)
        if op.get("done"):
            return op
    raise AssertionError("operation never finished")


async def test_gemini_samples_are_distinct_files(veo: VeoEmulator) -> None:
    """Two generatedSamples with different file URIs that download to different MP4s."""
    submit = f"/v1beta/models/{MODEL}:predictLongRunning"
    async with client(veo.url, headers={"x-goog-api-key": "AIza-test"}) as c:

        async def poll(name: str) -> dict[str, Any]:
            return dict((await c.get(f"/v1beta/{name}")).json())

        op = await _done(c, submit, poll)
        samples = op["response"]["generateVideoResponse"]["generatedSamples"]
        bodies = []
        for sample in samples:
            path = httpx.URL(sample["video"]["uri"]).raw_path.decode()
            redirect = await c.get(path)
            assert redirect.status_code == 302
            media = await c.get(redirect.headers["location"])
            assert media.content[4:8] == b"ftyp"
            bodies.append(media.content)
    assert len(bodies) == 2
    assert hashlib.sha256(bodies[0]).digest() != hashlib.sha256(bodies[1]).digest()


async def test_vertex_inline_samples_are_distinct(veo: VeoEmulator) -> None:
    """Vertex without storageUri returns one inline video per sample, each different."""
    base = f"/v1/projects/p1/locations/us-central1/publishers/google/models/{MODEL}"
    auth = {"Authorization": "Bearer ya29.token"}
    async with client(veo.url, headers=auth) as c:

        async def poll(name: str) -> dict[str, Any]:
            fetched = await c.post(base + ":fetchPredictOperation", json={"operationName": name})
            return dict(fetched.json())

        op = await _done(c, base + ":predictLongRunning", poll)
    videos = [base64.b64decode(v["bytesBase64Encoded"]) for v in op["response"]["videos"]]
    assert len(videos) == 2
    assert all(v[4:8] == b"ftyp" for v in videos)
    assert videos[0] != videos[1]

"""Runway emulator: input assets as Runway treats them (provider-apis.md §1.7, §1.10).

With ``fetch_assets`` the emulator fetches https inputs at create and refuses the create with 400
(no task) when it cannot; uploads take images and videos only, and a ``runway://`` URI stops
working when its upload's lifetime ends. The asset host is moto's S3 over TLS, which refuses an
expired presigned URL as S3 does (`tests.support.tls_s3`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from adapter_sidecars.emulators.runway import RunwayConfig, RunwayEmulator
from tests.support.tls_s3 import TlsS3, tls_s3

from .conftest import RUNWAY_HEADERS, client, eventually

I2V = {"model": "gen4.5", "promptText": "the kite rises", "ratio": "1280:720", "duration": 5}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsS3]:
    with tls_s3(tmp_path_factory.mktemp("asset-pki")) as running:
        yield running


@pytest.fixture
async def fetching(store: TlsS3) -> AsyncIterator[RunwayEmulator]:
    config = RunwayConfig(fetch_assets=True, asset_ca_file=str(store.ca_file), upload_ttl_s=1.0)
    async with RunwayEmulator(config) as emu:
        yield emu


def _object(store: TlsS3, content_type: str = "image/png") -> tuple[str, str]:
    bucket = store.create_bucket()
    key = f"{uuid.uuid4().hex}.png"
    store.client.put_object(Bucket=bucket, Key=key, Body=b"\x89PNG....", ContentType=content_type)
    return bucket, key


async def _create(emu: RunwayEmulator, uri: str) -> httpx.Response:
    body = {**I2V, "promptImage": [{"uri": uri, "position": "first"}]}
    async with client(emu.url, headers=RUNWAY_HEADERS) as rw:
        return await rw.post("/v1/image_to_video", json=body)


async def test_a_fetchable_https_input_creates_a_task(
    fetching: RunwayEmulator, store: TlsS3
) -> None:
    """A live presigned https URL of an image is fetched and the task is created."""
    bucket, key = _object(store)
    response = await _create(fetching, store.presign(bucket, key, 600))
    assert response.status_code == 200, response.text
    assert len(fetching.truth()) == 1


async def test_an_expired_url_refuses_the_create_with_no_task(
    fetching: RunwayEmulator, store: TlsS3
) -> None:
    """A presigned URL that expired: 400 naming the failed fetch (HTTP 403), and no task."""
    bucket, key = _object(store)
    url = store.presign(bucket, key, 1)
    async with httpx.AsyncClient(verify=store.ssl_context()) as storage:
        await eventually(lambda: _is_refused(storage, url), within=10)
    response = await _create(fetching, url)
    assert response.status_code == 400
    assert response.json()["error"].startswith("Failed to fetch asset https://localhost:")
    assert "HTTP 403" in response.json()["error"]
    assert fetching.truth() == []


async def _is_refused(storage: httpx.AsyncClient, url: str) -> bool:
    return (await storage.get(url)).status_code == 403


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("http://localhost/a.png", "HTTPS"),
        ("https://127.0.0.1/a.png", "IP address"),
    ],
)
async def test_inputs_runway_cannot_fetch_are_refused(
    fetching: RunwayEmulator, uri: str, reason: str
) -> None:
    """Runway fetches only https URLs of domain names: anything else is 400, no task."""
    response = await _create(fetching, uri)
    assert response.status_code == 400
    assert reason in response.json()["error"]
    assert fetching.truth() == []


async def test_an_input_that_is_no_image_is_refused(fetching: RunwayEmulator, store: TlsS3) -> None:
    """A fetched input whose Content-Type is neither image nor video: 400, no task."""
    bucket, key = _object(store, content_type="text/plain")
    response = await _create(fetching, store.presign(bucket, key, 600))
    assert response.status_code == 400
    assert "content type" in response.json()["error"]
    assert fetching.truth() == []


async def _slot(emu: RunwayEmulator) -> dict[str, Any]:
    async with client(emu.url, headers=RUNWAY_HEADERS) as rw:
        reply = await rw.post("/v1/uploads", json={"filename": "a.png", "type": "ephemeral"})
    slot: dict[str, Any] = reply.json()
    return slot


async def test_an_upload_takes_images_and_videos_only(fetching: RunwayEmulator) -> None:
    """The storage side refuses a file that is not an image or a video (400, S3's XML)."""
    slot = await _slot(fetching)
    async with client(fetching.url) as storage:
        refused = await storage.post(
            str(slot["uploadUrl"]),
            data=dict(slot["fields"]),
            files={"file": ("a.txt", b"text", "text/plain")},
        )
    assert refused.status_code == 400
    assert b"InvalidArgument" in refused.content
    assert not fetching.uploads.complete(str(slot["runwayUri"]))


async def test_an_upload_uri_stops_working_when_its_lifetime_ends(fetching: RunwayEmulator) -> None:
    """A runway:// URI is usable after its file arrived, and 400 once its lifetime (1 s) ended."""
    slot = await _slot(fetching)
    async with client(fetching.url) as storage:
        stored = await storage.post(
            str(slot["uploadUrl"]),
            data=dict(slot["fields"]),
            files={"file": ("a.png", b"\x89PNG....", "image/png")},
        )
    assert stored.status_code == 204
    uri = str(slot["runwayUri"])
    assert (await _create(fetching, uri)).status_code == 200
    expires_at = time.time() + 1.0
    await eventually(lambda: not fetching.uploads.complete(uri), within=5)
    assert time.time() >= expires_at - 0.05
    refused = await _create(fetching, uri)
    assert refused.status_code == 400
    assert "Invalid upload URI" in refused.json()["error"]

"""Helpers for the adapter sidecar tests (imported by test modules and conftest)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from adapter_sidecars.common.config import SidecarConfig, parse_config
from adapter_sidecars.emulators.http import BodyReader, HttpServer, Request, Response
from vidroute_core.spec import AssetRef, GenerationSpec, Mode, OutputSpec, RoutingPolicy

IMAGE = AssetRef(
    object_uri="https://assets.example.com/frames/f0.png?X-Amz-Signature=abc",
    mime_type="image/png",
    size_bytes=1024,
    checksum_sha256="a" * 64,
)
LAST_IMAGE = AssetRef(
    object_uri="https://assets.example.com/frames/f1.png",
    mime_type="image/png",
    size_bytes=2048,
    checksum_sha256="b" * 64,
)


def make_spec(
    *,
    mode: Mode = Mode.TEXT_TO_VIDEO,
    width: int = 1280,
    height: int = 720,
    duration_ms: int = 5000,
    with_audio: bool = False,
    degrade: bool = False,
    **fields: Any,
) -> GenerationSpec:
    """A valid spec with sensible defaults; frames are added for the image modes."""
    if mode in (Mode.IMAGE_TO_VIDEO, Mode.FIRST_LAST_TO_VIDEO):
        fields.setdefault("first_frame", IMAGE)
    if mode is Mode.FIRST_LAST_TO_VIDEO:
        fields.setdefault("last_frame", LAST_IMAGE)
    return GenerationSpec(
        tenant_id="tenant-a",
        prompt=fields.pop("prompt", "a lighthouse at dusk, waves crashing"),
        mode=mode,
        output=OutputSpec(width, height, duration_ms, with_audio=with_audio),
        routing=RoutingPolicy(allow_semantic_degrade=degrade),
        **fields,
    )


def sidecar_config(base_url: str, env_name: str, **overrides: Any) -> SidecarConfig:
    """A config pointing at `base_url` with short timeouts for fault tests."""
    data: dict[str, Any] = {
        "provider": {"base_url": base_url, "options": overrides.pop("options", {})},
        "timeouts": {"connect": 1, "write": 2, "read": 2, "submit_read": 1, "pool": 1},
        "health": {"probe_interval_seconds": 0.2},
        "shutdown_grace_seconds": 1,
        "accounts": [
            {"name": "prod-us", "region": "us", "credential_ref": f"env:{env_name}:-key_test"}
        ],
    }
    data.update(overrides)
    return parse_config(data, {})


async def eventually(
    check: Callable[[], Awaitable[bool]], deadline_s: float = 10.0, interval: float = 0.05
) -> None:
    """Poll `check` until it is true or fail after `deadline_s` seconds."""
    deadline = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(interval)


@dataclass
class Asset:
    """One file an `AssetServer` serves; with `signature`, only ``?sig=<signature>`` gets it."""

    data: bytes
    content_type: str = "image/png"
    signature: str = ""
    stall: bool = False


class AssetServer:
    """A real HTTP server for input assets (the object store of an image-to-video request).

    Unknown paths are 404, a wrong or missing ``sig`` is 403 (an expired signed URL), a
    stalling asset sends nothing until the server stops. Every request is recorded."""

    def __init__(self) -> None:
        self.assets: dict[str, Asset] = {}
        self.requests: list[Request] = []
        self._server = HttpServer(self._handle)

    def add(self, path: str, asset: Asset) -> str:
        """Serve `asset` at `path`; returns its URL (signed when the asset has a signature)."""
        self.assets[path] = asset
        return self.url(path) + (f"?sig={asset.signature}" if asset.signature else "")

    def url(self, path: str) -> str:
        return self._server.url + path

    async def _handle(self, request: Request, read_body: BodyReader) -> Response:
        self.requests.append(request)
        asset = self.assets.get(request.path)
        if asset is None:
            return Response(404, b"no such object", [("content-type", "text/plain")])
        if asset.signature and request.query.get("sig") != asset.signature:
            return Response(403, b"signature expired", [("content-type", "text/plain")])
        if asset.stall:
            await asyncio.sleep(3600)
        return Response(200, asset.data, [("content-type", asset.content_type)])

    async def __aenter__(self) -> AssetServer:
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop()
